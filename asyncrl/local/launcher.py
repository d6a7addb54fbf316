"""The embedded launcher: one whole run on one machine, with the same role entrypoints a cluster uses.

It owns process supervision only (the S3 server, the role processes, progress, the servers' weight checks);
the run's documents, resume, summary and tracking are `asyncrl.run`'s, the very functions the pipeline's steps call.

`asyncrl run CONFIG` → `run_embedded(cfg)`:
1. builds (or finds cached) the model, creates the run folder `runs/<run_id>/`;
2. starts SeaweedFS on loopback with its data in the run folder (kept after the run), creates the run
   (`asyncrl.run.create`: `config.json`, `model.json`, `tracking.json`, the MLflow run in a local sqlite store
   beside the run folders), or with `--resume` rewinds it (`asyncrl.run.resume`);
3. starts reward and generation roles (and the judge role, with `task.judge.model_path`) and waits until they
   published their addresses;
4. starts the training and environment roles, shows live progress from `versions/latest.json`, stops at the
   `done` marker (or on the first role that fails, or on Ctrl-C); the held-out evaluation runs inside the run
   (`eval.every_steps`, the first environment writer), warm start and final version included;
5. compares every server's weight checksum with the trainer's, stops every process, and writes `run_summary.json`
   (`asyncrl.run.summary`, with the first and last evaluation points as `eval_accuracy_before/after`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import secrets
import shutil
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import httpx

from asyncrl.config import RunConfig
from asyncrl.local.processes import ProcessGroup
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.roles.context import base_url, wait_for_rendezvous
from asyncrl.rpc.auth import TOKEN_ENV, auth_headers, new_token
from asyncrl.run.checkpoint_models import publish_embedded_models, registered_model_name
from asyncrl.run.create import create_run, record_model
from asyncrl.run.finalize import finish_tracking
from asyncrl.run.resume import LOCAL_CONFIG, ResumeError, reattach_tracking, resume_run
from asyncrl.run.summary import (
    TRACKING_DEADLINE_S,
    final_group,
    publish_summary,
    training_summary,
    weights_in_sync,
)
from asyncrl.storage.eval_points import eval_times, unseen_points
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store
from asyncrl.tiny_model.prepare import resolve_model_path
from asyncrl.tracking.mlflow_tracker import Tracker, embedded_tracking_uri

log = logging.getLogger(__name__)


MAX_RPC_DIR_CHARS = 70
FOLLOW_POLL_S = 1.0  # how often the launcher reads versions/latest.json to print progress
FOLLOW_DONE_S = 5.0  # how often it looks for the done marker before the last step (then at every poll)
DIST_LAUNCHER_VARS = ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                      "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RUN_ID")


class RunFailed(RuntimeError):
    pass


class ExternalS3:
    """An S3 server the user runs (MinIO, AWS): same interface as `EmbeddedS3`, nothing to start or stop.

    Credentials come from the environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY), never from the config.
    """

    def __init__(self, endpoint_url: str, region: str) -> None:
        self.endpoint_url = endpoint_url
        self.region = region

    def __enter__(self) -> ExternalS3:
        missing = [k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY") if not os.environ.get(k)]
        if missing:
            raise RunFailed(f"storage.endpoint_url is set: expected {' and '.join(missing)} in the environment")
        return self

    def __exit__(self, *exc: object) -> None:
        return None

    def env(self) -> dict[str, str]:
        return {k: os.environ[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")} | {
            "AWS_ENDPOINT_URL": self.endpoint_url, "AWS_DEFAULT_REGION": self.region}


def new_run_id(cfg: RunConfig) -> str:
    stamp = datetime.now(UTC).strftime("%Y%m%d-%H%M%S")
    return f"{cfg.name}-{stamp}-{secrets.token_hex(2)}"


def _print(msg: str) -> None:
    """Progress for the user; best effort: a closed stdout (its reader gone) must never stop the launcher from
    stopping its roles."""
    with contextlib.suppress(OSError, ValueError):
        print(msg, flush=True)


class EmbeddedRun:
    def __init__(self, cfg: RunConfig, resume: bool = False) -> None:
        if not cfg.run_id:
            cfg = cfg.model_copy(update={"run_id": new_run_id(cfg)})
        self.cfg = cfg
        self.run_dir = Path(cfg.runs_dir).resolve() / cfg.run_id
        self.paths = RunPaths(cfg.storage.prefix, cfg.run_id)
        self.url = run_url(cfg.storage.bucket, cfg.storage.prefix, cfg.run_id)
        self.procs: ProcessGroup | None = None
        self.tracker: Tracker | None = None
        self.role_token = new_token()  # this run's bearer token: in the roles' env only, never in config or logs
        self.resume = resume

    # ---- setup ---------------------------------------------------------------------------------------
    def child_env(self, s3: EmbeddedS3 | ExternalS3) -> dict[str, str]:
        """The roles' environment: this process's, without torch.distributed launcher variables (each embedded role
        forms its own groups and picks free ports; an inherited MASTER_PORT would make the trainer bind a port that
        is taken), plus the S3 endpoint and credentials, the run's role token (`ASYNCRL_ROLE_TOKEN`), the run's
        folder (`ASYNCRL_RUN_DIR`) and the caches. vLLM's cache (`VLLM_CACHE_ROOT`, unless set already) is under
        `cache_dir`, shared by runs: it holds what vLLM learned of a model class in a child process of its own (about
        ten seconds of every engine start), which a cache per run would learn again each time."""
        cache = Path(self.cfg.cache_dir).resolve()
        inherited = {k: v for k, v in os.environ.items() if k not in DIST_LAUNCHER_VARS}
        env = {**inherited, **s3.env(), "AWS_ENDPOINT_URL": s3.endpoint_url,
               "AWS_DEFAULT_REGION": self.cfg.storage.region,
               "ASYNCRL_RUN_DIR": str(self.run_dir.resolve()),
               "VLLM_CACHE_ROOT": os.environ.get("VLLM_CACHE_ROOT", str(cache / "vllm")),
               "VLLM_RPC_BASE_PATH": str(self.rpc_dir()),
               "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(cache / "torch_extensions")),
               "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
               TOKEN_ENV: self.role_token}
        self.rpc_dir().mkdir(parents=True, exist_ok=True)
        return env

    def rpc_dir(self) -> Path:
        """vLLM's IPC sockets: in the run folder, unless that path is too long for a Unix socket (107 bytes with
        vLLM's 37-character socket names); then a short folder in the temp dir named after the run folder."""
        rpc = self.run_dir.resolve() / "vllm-rpc"
        if len(str(rpc)) <= MAX_RPC_DIR_CHARS:
            return rpc
        digest = hashlib.sha256(str(rpc).encode()).hexdigest()[:12]
        return Path(tempfile.gettempdir()) / f"asyncrl-rpc-{digest}"

    def write_run_documents(self, store: S3Store, model_path: Path) -> None:
        """A new run: its documents and MLflow run (`asyncrl.run.create`), plus the configuration in the run folder
        (what `--resume` reads); with `resume`, the run rewound instead (`reopen_run`)."""
        if self.resume:
            self.reopen_run(store, model_path)
            return
        # one local store for every run under runs_dir, so runs can be compared side by side in the MLflow UI
        tracking_uri = self.cfg.tracking.tracking_uri or embedded_tracking_uri(self.run_dir.parent)
        (self.run_dir / LOCAL_CONFIG).write_text(self.cfg.model_dump_json(indent=2) + "\n")  # for --resume
        created = create_run(store, self.paths, self.cfg, tracking_uri=tracking_uri, mode="embedded",
                             model_folder=model_path)
        self.tracker = created.tracker

    def reopen_run(self, store: S3Store, model_path: Path) -> None:
        """--resume: rewind the run to its last committed checkpoint and re-attach its MLflow run."""
        try:
            resumed = resume_run(store, self.paths, self.cfg, asked_as="--resume",
                                 missing_hint=f"its S3 data is gone (expected under {self.run_dir / 's3'})")
        except ResumeError as err:
            raise RunFailed(str(err)) from None
        self.cfg = resumed.cfg
        record_model(store, self.paths, self.cfg, model_path)  # what the roles on this machine load
        self.tracker = reattach_tracking(store, self.paths, resumed)
        point = resumed.point
        _print(f"resuming from checkpoint {point.version} ({point.lost_steps} step(s) after it are trained again)")

    # ---- monitoring ----------------------------------------------------------------------------------
    def check_children(self) -> None:
        """Fail the run when a role failed; a generation server that died is restarted instead, up to
        `generation.max_restarts` times (the run goes on without it meanwhile; see asyncrl.roles.weight_group)."""
        assert self.procs is not None
        bad = self.procs.failed()
        if bad is None:
            return
        limit = self.cfg.generation.max_restarts
        if bad.name.startswith("generation-") and bad.restarts < limit:
            _print(f"{bad.name} exited with code {bad.proc.returncode}: restarting it ({bad.restarts + 1}/{limit}); "
                   f"log {bad.log_path}")
            self.procs.restart(bad)
            return
        raise RunFailed(f"role {bad.name} exited with code {bad.proc.returncode}; log {bad.log_path}:\n{bad.tail()}")

    def wait_roles(self, store: S3Store, role: str, count: int) -> list[dict[str, Any]]:
        deadline = time.monotonic() + self.cfg.timeouts.startup_s
        while True:
            self.check_children()
            try:
                return wait_for_rendezvous(store, self.paths, role, count, timeout_s=2.0, poll_s=0.5)
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise RunFailed(f"{role}: not ready within {self.cfg.timeouts.startup_s:.0f}s") from None

    def follow(self, store: S3Store) -> dict[str, Any]:
        """Print progress on every new version until the trainer writes `done`; returns the last latest.json."""
        shown = -1
        latest: dict[str, Any] = {}
        steps = self.cfg.training.steps
        last_done_check = float("-inf")
        evals_shown: set[int] = set()
        while True:
            self.check_children()
            doc = store.get_json(self.paths.versions_latest())
            if isinstance(doc, dict):
                latest = doc
                m = doc.get("metrics", {})
                # a document written ahead of its push still carries the previous step's figures: print a step's
                # line with that step's own figures, once
                described = int(doc.get("metrics_version", doc["version"]))
                if described != shown and m:
                    shown = described
                    _print(f"step {shown:>4}/{steps}  reward {m['reward/mean']:.3f}  acc {m['reward/accuracy']:.3f}  "
                           f"loss {m.get('train/loss', float('nan')):+.4f}  staleness {m['staleness/mean']:.2f}"
                           f"/{int(m['staleness/max'])}  {m['throughput/samples_per_s']:.1f} samples/s  "
                           f"wait/train/sync {m['time/wait_s']:.2f}/{m['time/train_s']:.2f}/{m['time/sync_s']:.2f}s")
            # the trainer writes `done` after its last step: look for it then, and every FOLLOW_DONE_S meanwhile
            if int(latest.get("version", -1)) >= steps or time.monotonic() - last_done_check >= FOLLOW_DONE_S:
                last_done_check = time.monotonic()
                if self.cfg.eval.every_steps:
                    self.show_eval_points(store, evals_shown)
                if store.exists(self.paths.done()):
                    self.show_eval_points(store, evals_shown)
                    return store.get_json(self.paths.versions_latest()) or latest
            time.sleep(FOLLOW_POLL_S)

    @property
    def eval_metric(self) -> str:
        return "held-out success rate" if self.cfg.env is not None else "accuracy"

    def show_eval_points(self, store: S3Store, shown: set[int]) -> None:
        for metrics, version in unseen_points(store, self.paths, shown):
            k = f"  pass@{int(metrics['eval/k'])} {metrics['eval/pass_at_k']:.3f}" if "eval/pass_at_k" in metrics else ""
            _print(f"held-out eval at version {version:>4}: {self.eval_metric} {metrics['eval/accuracy']:.3f} "
                   f"({int(metrics['eval/correct'])}/{int(metrics['eval/n'])}){k}")

    # ---- checks -----------------------------------------------------------------------------------------------
    def server_checksums(self, gen_docs: list[dict[str, Any]]) -> list[dict[str, Any]]:
        out = []
        with httpx.Client(timeout=self.cfg.timeouts.http_s, headers=auth_headers(self.role_token)) as client:
            for d in gen_docs:
                r = client.get(f"{base_url(d)}/weights/checksum")
                r.raise_for_status()
                out.append(r.json())
        return out

    # ---- the run -------------------------------------------------------------------------------------
    def run(self) -> dict[str, Any]:
        t_start = time.monotonic()
        cfg = self.cfg
        self.run_dir.mkdir(parents=True, exist_ok=True)
        _print(f"asyncrl run {cfg.run_id}: folder {self.run_dir}")
        model_path = resolve_model_path(cfg)
        st = cfg.storage
        with ExternalS3(st.endpoint_url, st.region) if st.endpoint_url else EmbeddedS3(self.run_dir / "s3") as s3:
            os.environ.update(s3.env())  # this process talks to S3 with the server's credentials too
            store = S3Store(s3.endpoint_url, cfg.storage.bucket, region=cfg.storage.region)
            self.write_run_documents(store, model_path)
            self.procs = ProcessGroup(self.run_dir / "logs", self.child_env(s3))
            interrupted = False
            try:
                return self._run_roles(store, t_start)
            except KeyboardInterrupt:
                interrupted = True
                raise
            finally:
                _print("stopping all roles")
                self.procs.stop_all()
                if not self.rpc_dir().is_relative_to(self.run_dir.resolve()):
                    shutil.rmtree(self.rpc_dir(), ignore_errors=True)
                if interrupted:  # stop now: copying every checkpoint into MLflow can take minutes
                    _print(f"checkpoints not logged to MLflow (interrupted); they stay in {self.run_dir}, and "
                           f"`asyncrl run --resume {cfg.run_id}` continues the run")
                elif self.tracker is not None:  # every checkpoint as an MLflow model, before this S3 server stops
                    self.publish_models(store)
                finish_tracking(self.tracker, succeeded=(self.run_dir / "run_summary.json").exists())

    def publish_models(self, store: S3Store) -> None:
        """The run's checkpoints as MLflow models, the best-by-eval (else last) one registered (docs/models_in_mlflow.md)."""
        assert self.tracker is not None
        t = self.cfg.tracking
        out = publish_embedded_models(store, self.paths, self.tracker.tracking_uri, self.tracker.run_id,
                                      registered_model_name(t.registered_model, t.experiment, self.cfg.name),
                                      TRACKING_DEADLINE_S)
        reg = out.get("registered_model")
        if reg:
            _print(f"registered model {reg['model_uri']}: checkpoint {reg['checkpoint_version']} ({reg['reason']}"
                   + (f", eval accuracy {reg['eval_accuracy']:.3f})" if reg["eval_accuracy"] is not None else ")"))
        elif "models_error" in out:
            _print(f"checkpoints not (all) logged to MLflow: {out['models_error']}")

    def start_training(self, procs: ProcessGroup, args: list[str]) -> None:
        """The training role: one process, or `training.num_processes` ranks under torchrun (rank 0 leads).

        torchrun (`python -m torch.distributed.run --standalone`) picks its own free rendezvous port and sets the
        launcher variables for its ranks only (the roles' environment has them stripped, see `child_env`); it
        stops every rank when one fails, and its exit code is the role's.
        """
        n = self.cfg.training.num_processes
        if n == 1:
            procs.start("training-0", "asyncrl.roles.training", args)
            return
        procs.start("training-0", "torch.distributed.run",
                    ["--standalone", "--nnodes", "1", "--nproc-per-node", str(n), "-m", "asyncrl.roles.training", *args])

    def _run_roles(self, store: S3Store, t_start: float) -> dict[str, Any]:
        cfg, procs = self.cfg, self.procs
        assert procs is not None
        common = ["--run-url", self.url]
        serving = [*common, "--on-done", "stay"]  # their checksums are read after the run; stopped by this launcher
        procs.start("reward-0", "asyncrl.roles.reward", [*serving, "--id", "0"])
        judge = cfg.task.judge is not None and cfg.task.judge.model_path is not None
        if judge:  # the run's own judge model: a vLLM server of its own, never sent weights (asyncrl.roles.judge)
            procs.start("judge-0", "asyncrl.roles.judge", [*serving, "--id", "0"])
        for i in range(cfg.generation.num_servers):
            procs.start(f"generation-{i}", "asyncrl.roles.generation", [*serving, "--id", str(i)])
        # the trainer and the writers start now too: their imports and DeepSpeed's init overlap the engines' start,
        # and they wait for the servers' rendezvous themselves (`timeouts.rendezvous_s`), as a cluster's pods do
        self.start_training(procs, [*common, "--id", "0"])
        for w in range(cfg.rollout.num_writers):
            procs.start(f"environment-{w}", "asyncrl.roles.environment", [*common, "--id", f"env{w}"])
        _print(f"starting {cfg.generation.num_servers} generation server(s) (vLLM engine start takes ~35 s each)")
        gen_docs = self.wait_roles(store, "generation", cfg.generation.num_servers)
        self.wait_roles(store, "reward", 1)
        if judge:
            self.wait_roles(store, "judge", 1)
        t_train = time.monotonic()  # train_wall_s: from the servers being ready to the run's end
        latest = self.follow(store)
        train_wall = time.monotonic() - t_train
        started = time.time() - (time.monotonic() - t_start)  # the launcher's start, wall clock
        gen_docs = final_group(latest) or gen_docs  # the servers that got the last push (restarts move them)
        checksums = self.server_checksums(gen_docs)
        in_sync = weights_in_sync(checksums, latest)
        summary = {
            **training_summary(store, self.paths, self.url, cfg.training.steps, latest),
            "wall_s": time.monotonic() - t_start,
            "train_wall_s": train_wall,
            # when each held-out point was recorded, in seconds since `asyncrl run` started (engine start included)
            "eval_curve_wall_s": {str(v): round(t - started, 1) for v, t in eval_times(store, self.paths).items()},
            "weights_in_sync": in_sync,
            "server_checksums": checksums,
            "num_generation_servers": cfg.generation.num_servers,
            "generation_restarts": sum(c.restarts for c in procs.children if c.name.startswith("generation-")),
        }
        if not in_sync:
            raise RunFailed(f"generation servers' weights differ from the trainer's: {checksums} vs {latest.get('checksum')}")
        publish_summary(store, self.paths, summary, self.tracker, self.run_dir)
        _print(json.dumps(summary, indent=2))
        if summary["eval_accuracy_after"] is not None:
            before = summary["eval_accuracy_before"]
            label = self.eval_metric if self.cfg.env is not None else f"held-out {self.eval_metric}"
            _print(f"{label}: {'-' if before is None else f'{before:.3f}'} at the warm start, "
                   f"{summary['eval_accuracy_after']:.3f} at version {summary['final_version']}")
        return summary


def run_embedded(cfg: RunConfig, resume: bool = False) -> dict[str, Any]:
    """Run `cfg` on this machine; `resume`: continue the run `cfg.run_id` from its last committed checkpoint."""
    run = EmbeddedRun(cfg, resume)
    try:
        return run.run()
    except KeyboardInterrupt:
        _print("interrupted: all roles stopped")
        sys.exit(130)
