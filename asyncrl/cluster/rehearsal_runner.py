"""Rehearsal, the runner: run a compiled pipeline's exact task commands as local processes against an embedded S3.

    rehearse("asyncrl/cluster/pipeline/asyncrl.yaml", {"steps": 2, ...}, workdir=Path("rehearsal"))

What a Kubeflow cluster would do, on one machine: start SeaweedFS (random credentials) and give them to the tasks
only through the pipeline's own secret / config-map / field-path env (the parent's AWS_* and launcher variables
are removed from the children's environment); create the bucket; start each task's resolved command (see
`asyncrl.cluster.rehearsal`) once every task it depends on has exited 0, as its own process session, with its log
in `workdir/logs/<task>.log` and its working directory `workdir/pods/<task>`; the pods' model cache volume
(mounted at `/cache`, pods.py) is one folder every task shares, as a shared PVC would be: the parent of `cache_dir`
(`.cache` of the repository by default, so the built-in model built once is found again); once the run's `done` marker
appears, every still-running task must exit by itself (with 0) within `exit_grace_s`; then the exit task
(finalize) runs with the final status SUCCEEDED and must exit 0.
A cancel ("Terminate" in the Kubeflow UI), with `cancel_when(store, paths)`: once it returns True (checked every
poll), every running task's main process gets SIGTERM, as Kubernetes stops a pod (torchrun forwards it to its
ranks), and has `stop_grace_s` (the pod's termination grace period) to exit, with any code; one still running then
is killed with its session and named in `killed`. `inspect_cancel(store, paths)` then looks at what the stopped
roles left (what a run whose exit task never ran keeps; its value is in the result). The exit task then runs with the final status `cancel_state`, or,
with `cancel_state=None`, never (Argo may cut it short: KFP terminates a run by setting the workflow's
`activeDeadlineSeconds` to 0).
Output parameters: when a task exits 0, each output parameter its component declares is read from the file its
container wrote (`workdir/kfp_outputs/<task key>/<name>`; a missing file fails the task, as the KFP launcher does),
and every task that reads it is resolved again before it starts. The setup task's output `run_id` is the run the
rehearsal then watches (its `done` marker) and reports: the KFP run id, or the resumed run's with `resume_run_id`.
The images' entrypoint `asyncrl-task MODULE ...` (asyncrl/task_entrypoint.py, a console script in the images) runs
as `python -m asyncrl.task_entrypoint MODULE ...` with this interpreter, which then execs `python -m MODULE ...` as
in a pod; a leading `python`/`python3` becomes this interpreter and `torchrun` `python -m torch.distributed.run` (the
images' interpreter is this venv here).

Invariants: on any failure or timeout every process is killed and `RehearsalFailed` names the task, with the tail
of every task's log; no process started here outlives `rehearse` (try/finally, process groups killed).
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.cluster.rehearsal import (
    RehearsalError,
    RehearsalTask,
    load_compiled,
    parse_output,
    resolve_parameters,
    task_commands,
)
from asyncrl.cluster.rehearsal_containers import Containers
from asyncrl.cluster.rehearsal_launch import base_env, client_env, local_argv, shown
from asyncrl.local.processes import Child, ProcessGroup
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.rpc.auth import TOKEN_ENV, new_token
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

REPO = Path(__file__).resolve().parents[2]
S3_SECRET = "asyncrl-s3"  # asyncrl/cluster/pipeline/definition.py
ROLE_TOKEN_SECRET = "asyncrl-role-token"  # the pipeline definition: key ASYNCRL_ROLE_TOKEN, one per rehearsal
ENDPOINTS_CONFIG_MAP = "asyncrl-endpoints"
RUN_ID_OUTPUT = "run_id"  # the output naming the run the roles drive (asyncrl/cluster/pipeline/components.py setup)
CACHE_MOUNT = "/cache"  # asyncrl/cluster/pipeline/pods.py: the pods' model cache volume


class RehearsalFailed(RuntimeError):
    """A task failed, hung or never exited; the message names it and holds every task's log tail."""


@dataclass
class RehearsalResult:
    run_id: str  # the run the roles drove: setup's output run_id (a resumed run's id), else the KFP run id
    run_url: str
    workdir: Path
    tasks: list[RehearsalTask]
    exit_codes: dict[str, int]
    started_s: dict[str, float]  # seconds after the start of the rehearsal
    ended_s: dict[str, float]
    done_s: float | None
    wall_s: float
    inspection: Any = None
    logs: dict[str, Path] = field(default_factory=dict)
    kfp_run_id: str = ""
    outputs: dict[str, dict[str, Any]] = field(default_factory=dict)
    cancelled_s: float | None = None  # when the cancel's SIGTERMs were sent (None: not cancelled)
    killed: list[str] = field(default_factory=list)  # tasks still running `stop_grace_s` after the cancel
    cancel_inspection: Any = None
    lost_s: float | None = None  # when `kill_task` was killed (None: nothing was)


class _Run:
    """The processes of one rehearsal and the checks on them."""

    def __init__(self, tasks: list[RehearsalTask], workdir: Path, env: dict[str, str], store: S3Store,
                 paths: RunPaths, echo: Callable[[str], None],
                 resolve: Callable[[dict[str, dict[str, Any]]], list[RehearsalTask]], outputs_dir: Path,
                 containers: Containers | None = None) -> None:
        self.tasks, self.workdir, self.env, self.store, self.paths, self.echo = tasks, workdir, env, store, paths, echo
        self.resolve, self.outputs_dir, self.containers = resolve, outputs_dir, containers
        self.outputs: dict[str, dict[str, Any]] = {}
        self.group = ProcessGroup(workdir / "logs", env)
        self.children: dict[str, Child] = {}
        self.t0 = time.monotonic()
        self.started: dict[str, float] = {}
        self.ended: dict[str, float] = {}
        self.done_at: float | None = None
        self.cancelled_at: float | None = None
        self.killed: list[str] = []
        self.lost_at: float | None = None  # when a task was killed on purpose (a lost pod)

    def now(self) -> float:
        return time.monotonic() - self.t0

    def start(self, task: RehearsalTask) -> None:
        # A container gets the task's env alone, from the env file; its docker client only needs to reach the daemon.
        argv = local_argv(task.argv) if self.containers is None else self.containers.argv(task)
        env = {**self.env, **task.env} if self.containers is None else self.env
        pod = self.workdir / "pods" / task.name
        pod.mkdir(parents=True, exist_ok=True)
        log_path = self.group.log_dir / f"{task.name}.log"
        where = "" if self.containers is None else f" (container {self.containers.name(task)}, {task.image})"
        self.echo(f"[{self.now():6.1f}s] start {task.name}{where}: {shown(task.argv)}")
        with open(log_path, "ab") as out:
            proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                    env=env, cwd=pod, start_new_session=True)
        child = Child(task.name, proc, log_path)
        self.group.children.append(child)
        self.children[task.key] = child
        self.started[task.name] = self.now()

    def fail(self, task: RehearsalTask, why: str) -> RehearsalFailed:
        tails = "\n".join(f"--- {c.name} (rc={c.proc.poll()}) {c.log_path}\n{c.tail(40)}"
                          for c in self.group.children)
        return RehearsalFailed(f"task {task.name}: {why}\n{tails}")

    def reap(self) -> None:
        """Record exits; a task that exited with an error fails the rehearsal."""
        for t in self.tasks:
            c = self.children.get(t.key)
            if c is None or t.name in self.ended:
                continue
            rc = c.proc.poll()
            if rc is None:
                continue
            self.ended[t.name] = self.now()
            self.echo(f"[{self.now():6.1f}s] exit  {t.name}: rc={rc}")
            stopped = self.cancelled_at is not None or self.lost_at is not None
            if rc != 0 and (not stopped or t.is_exit):  # after a cancel or a lost pod a role may exit with any code
                raise self.fail(t, f"exited with code {rc}")
            self.read_outputs(t)

    def read_outputs(self, task: RehearsalTask) -> None:
        """The output parameters `task` wrote, as the KFP launcher reads them; `run_id` switches the watched run."""
        for name, kind in task.outputs.items():
            path = self.outputs_dir / task.key / name
            if not path.is_file():
                raise self.fail(task, f"output parameter {name}: the container did not write {path}")
            try:
                value = parse_output(task.key, name, kind, path.read_text())
            except RehearsalError as err:
                raise self.fail(task, str(err)) from None
            self.outputs.setdefault(task.key, {})[name] = value
            self.echo(f"[{self.now():6.1f}s] output {task.name}.{name} = {value!r}")
            if name == RUN_ID_OUTPUT:
                self.paths = RunPaths(self.paths.prefix, str(value))

    def ready(self, task: RehearsalTask) -> RehearsalTask:
        """`task` with every output parameter it reads resolved (the pipeline is resolved again with the outputs
        read so far; task keys do not change)."""
        if not task.pending:
            return task
        fresh = {t.key: t for t in self.resolve(self.outputs)}
        self.tasks = [fresh.get(t.key, t) if t.key not in self.children else t for t in self.tasks]
        task = fresh[task.key]
        if task.pending:
            raise self.fail(task, f"reads output(s) {list(task.pending)} that no finished task wrote")
        return task

    def cancel(self, stop_grace_s: float, poll_s: float) -> None:
        """SIGTERM to every running task's main process, as Kubernetes stops a pod; `stop_grace_s` later, what is
        left is killed with its session."""
        self.cancelled_at = self.now()
        running = [t for t in self.tasks if t.key in self.children and t.name not in self.ended]
        self.echo(f"[{self.cancelled_at:6.1f}s] cancel: SIGTERM to {[t.name for t in running]}")
        for t in running:
            with contextlib.suppress(ProcessLookupError):
                self.children[t.key].proc.send_signal(signal.SIGTERM)
        while True:
            self.reap()
            left = [t for t in running if t.name not in self.ended]
            if not left:
                return
            if self.now() > self.cancelled_at + stop_grace_s:
                self.killed = [t.name for t in left]
                self.echo(f"[{self.now():6.1f}s] cancel: still running after {stop_grace_s:.0f}s, killed: "
                          f"{self.killed}")
                for t in left:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(self.children[t.key].proc.pid, signal.SIGKILL)
                    if self.containers is not None:  # the container outlives its killed client
                        self.containers.kill(t)
                    self.children[t.key].proc.wait(10)
                self.reap()
                return
            time.sleep(poll_s)

    def lose(self, name: str) -> None:
        """SIGKILL task `name` with its session (and its container), as a lost node takes a pod: no grace."""
        task = next((t for t in self.tasks if t.name == name and t.key in self.children), None)
        if task is None:
            raise self.fail(self.tasks[0], f"kill_task {name!r}: no such running task")
        self.lost_at = self.now()
        self.echo(f"[{self.lost_at:6.1f}s] lost: SIGKILL to {name}")
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.children[task.key].proc.pid, signal.SIGKILL)
        if self.containers is not None:
            self.containers.kill(task)

    def run_body(self, timeout_s: float, exit_grace_s: float, poll_s: float,
                 cancel_when: Callable[[S3Store, RunPaths], bool] | None = None, stop_grace_s: float = 30.0,
                 kill_when: Callable[[S3Store, RunPaths], bool] | None = None, kill_task: str = "") -> None:
        deadline = self.t0 + timeout_s
        while True:
            body = [t for t in self.tasks if not t.is_exit]
            self.reap()
            finished = {t.key for t in body if t.name in self.ended}
            if len(finished) == len(body):
                return
            if cancel_when is not None and cancel_when(self.store, self.paths):
                self.cancel(stop_grace_s, poll_s)
                return
            if kill_when is not None and self.lost_at is None and kill_when(self.store, self.paths):
                self.lose(kill_task)
            for t in body:
                if t.key not in self.children and all(d in finished for d in t.depends_on):
                    self.start(self.ready(t))
            if self.done_at is None and self.store.exists(self.paths.done()):
                self.done_at = self.now()
                self.echo(f"[{self.done_at:6.1f}s] the run's done marker appeared; every task must now exit by "
                          f"itself within {exit_grace_s:.0f}s")
            running = [t for t in body if t.key in self.children and t.name not in self.ended]
            if self.done_at is not None and self.now() > self.done_at + exit_grace_s and running:
                raise self.fail(running[0], f"still running {exit_grace_s:.0f}s after the done marker (it must "
                                            f"exit by itself); also running: {[t.name for t in running[1:]]}")
            if time.monotonic() > deadline:
                waiting = running or [t for t in body if t.key not in self.children]
                raise self.fail(waiting[0], f"rehearsal timed out after {timeout_s:.0f}s; not finished: "
                                            f"{[t.name for t in body if t.name not in self.ended]}")
            time.sleep(poll_s)

    def run_exit(self, timeout_s: float, poll_s: float) -> None:
        for t in [t for t in self.tasks if t.is_exit]:
            t = self.ready(t)
            self.start(t)
            deadline = time.monotonic() + timeout_s
            while t.name not in self.ended:
                self.reap()
                if time.monotonic() > deadline:
                    raise self.fail(t, f"exit task did not finish within {timeout_s:.0f}s")
                time.sleep(poll_s)


def rehearse(yaml_path: Path | str, params: Mapping[str, Any] | None = None, *, workdir: Path | str,
             timeout_s: float = 900.0, exit_grace_s: float = 120.0, exit_task_timeout_s: float = 300.0,
             run_id: str | None = None, cache_dir: Path | str | None = None,
             echo: Callable[[str], None] | None = None,
             inspect: Callable[[S3Store, RunPaths], Any] | None = None, poll_s: float = 0.5,
             cancel_when: Callable[[S3Store, RunPaths], bool] | None = None, cancel_state: str | None = "CANCELED",
             stop_grace_s: float = 30.0,
             inspect_cancel: Callable[[S3Store, RunPaths], Any] | None = None,
             containers: Containers | None = None,
             kill_when: Callable[[S3Store, RunPaths], bool] | None = None, kill_task: str = "") -> RehearsalResult:
    """Run the pipeline in `yaml_path` with `params` (checked against its declared parameters) locally; see the
    module docstring. `inspect(store, paths)` runs before the S3 server stops; its value is in the result.
    `cancel_when`, `cancel_state`, `stop_grace_s`, `inspect_cancel`: a cancel, see the module docstring.
    `containers`: run every task as a container of its image (`asyncrl.cluster.rehearsal_containers`); the pods'
    cache volume is then `cache_dir` (default `<workdir>/cache`) bound at its mount path, as in the pod.
    `kill_when(store, paths)` true: task `kill_task` is killed without grace (a lost pod); the others must stop by
    themselves (any exit code), then the exit task runs with the state FAILED, as Argo gives it."""
    spec, platform = load_compiled(yaml_path)
    resolved = resolve_parameters(spec, params)
    kfp_run_id = run_id or str(uuid.uuid4())  # the form of a KFP run id
    workdir = Path(workdir).resolve()
    workdir.mkdir(parents=True, exist_ok=True)
    say = echo or (lambda msg: log.info("%s", msg))
    default_cache = workdir / "cache" / "asyncrl" if containers is not None else REPO / ".cache" / "asyncrl"
    cache = Path(cache_dir).resolve() if cache_dir else default_cache
    rpc_dir = Path(tempfile.mkdtemp(prefix="asyncrl-rh-"))  # vLLM's sockets: a short path (Unix socket limit)
    t0 = time.monotonic()
    run: _Run | None = None
    cancel_inspection = None
    try:
        s3_launcher = containers.s3_launcher if containers is not None and containers.s3_image else None
        with EmbeddedS3(workdir / "s3", log_path=workdir / "logs" / "weed.log", launcher=s3_launcher) as s3:
            secrets = {S3_SECRET: {"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key},
                       ROLE_TOKEN_SECRET: {TOKEN_ENV: new_token()}}
            config_maps = {ENDPOINTS_CONFIG_MAP: {"AWS_ENDPOINT_URL": s3.endpoint_url}}
            outputs_dir = workdir / "kfp_outputs"

            final_state = ["SUCCEEDED"]  # what the exit task gets: a cancel changes it

            def resolve(outputs: dict[str, dict[str, Any]]) -> list[RehearsalTask]:
                return task_commands(spec, platform, resolved, kfp_run_id, secrets=secrets, config_maps=config_maps,
                                     final_state=final_state[0], outputs_dir=str(outputs_dir), outputs=outputs,
                                     defer_outputs=True,
                                     volumes=None if containers is not None else {CACHE_MOUNT: str(cache.parent)})

            tasks = resolve({})
            bucket, prefix = str(resolved.get("s3_bucket", "asyncrl")), str(resolved.get("s3_prefix", "runs"))
            store = _store(s3, bucket)
            store.ensure_bucket()
            paths = RunPaths(prefix, kfp_run_id)
            say(f"rehearsal of {yaml_path}: run id {kfp_run_id}, S3 {s3.endpoint_url}, {len(tasks)} tasks, "
                f"logs in {workdir / 'logs'}")
            if containers is not None:  # the pod's volumes: the cache at its mount path, KFP's outputs folder
                cache.mkdir(parents=True, exist_ok=True)
                containers.mounts = {str(outputs_dir): str(outputs_dir), **containers.mounts}
                containers.volumes = {CACHE_MOUNT: str(cache.parent), **containers.volumes}
                containers.executors = platform.get("platforms", {}).get("kubernetes", {}).get(
                    "deploymentSpec", {}).get("executors", {})
                containers.prepare()
            env = base_env(workdir, rpc_dir, cache) if containers is None else client_env()
            run = _Run(tasks, workdir, env, store, paths, say, resolve, outputs_dir, containers)
            try:
                run.run_body(timeout_s, exit_grace_s, poll_s, cancel_when, stop_grace_s, kill_when, kill_task)
                if run.lost_at is not None:
                    final_state[0] = "FAILED"
                    fresh = {t.key: t for t in resolve(run.outputs)}
                    run.tasks = [fresh[t.key] if t.is_exit else t for t in run.tasks]
                if run.cancelled_at is not None and inspect_cancel is not None:
                    cancel_inspection = inspect_cancel(store, run.paths)
                if run.cancelled_at is not None and cancel_state is not None:
                    final_state[0] = cancel_state
                    fresh = {t.key: t for t in resolve(run.outputs)}
                    run.tasks = [fresh[t.key] if t.is_exit else t for t in run.tasks]
                if run.cancelled_at is None or cancel_state is not None:
                    run.run_exit(exit_task_timeout_s, poll_s)
                inspection = inspect(store, run.paths) if inspect is not None else None
            finally:
                run.group.stop_all(grace_s=10.0)
                if containers is not None:  # the tasks' containers; the caller's services (MLflow) stay
                    for task in run.tasks:
                        containers.kill(task)
                store.close()
        codes = {c.name: int(c.proc.returncode) for c in run.group.children}
        return RehearsalResult(run_id=run.paths.run_id, run_url=f"s3://{bucket}/{run.paths.root}", workdir=workdir,
                               tasks=run.tasks, exit_codes=codes, started_s=run.started, ended_s=run.ended,
                               done_s=run.done_at, wall_s=time.monotonic() - t0, inspection=inspection,
                               logs={c.name: c.log_path for c in run.group.children}, kfp_run_id=kfp_run_id,
                               outputs=run.outputs, cancelled_s=run.cancelled_at, killed=run.killed,
                               cancel_inspection=cancel_inspection, lost_s=run.lost_at)
    finally:
        shutil.rmtree(rpc_dir, ignore_errors=True)


def _store(s3: EmbeddedS3, bucket: str) -> S3Store:
    """A store with the server's credentials, without putting them in this process's environment."""
    saved = {k: os.environ.get(k) for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")}
    os.environ.update({"AWS_ACCESS_KEY_ID": s3.access_key, "AWS_SECRET_ACCESS_KEY": s3.secret_key})
    try:
        return S3Store(s3.endpoint_url, bucket, timeout_s=30.0)
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
