"""An MLflow outage mid-run (the eighth fault kind): a real embedded run (SeaweedFS, vLLM, DeepSpeed, every role its
own process) tracks to a real `mlflow server` (sqlite store in the test's folder, a free port). After step 2 the
server stops answering (SIGSTOP) for longer than the trainer's retry deadline (`tracking.retry_deadline_s`), so the
trainer's MLflow calls time out and their steps go to the run's tracking spool in S3; then the stopped server is
killed and a new one started on the same port and store. The run goes on throughout and finishes; afterwards the
MLflow run holds every step's metrics exactly once, `tracking/spooled_total` > 0, and the spool in S3 is empty; each
role instance has one child run (issue 18), ended with the run.
The environment writer is held (SIGSTOP) from the first step of the outage until the new server answers, so the
run cannot end before MLflow is back (an end with MLflow down is tests/faults/test_finalize_mlflow_down.py's)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest
from mlflow import MlflowClient

from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.child_runs import CHILD_TAG, child_runs
from asyncrl.tracking.spool import SPOOL
from tests.helpers.run_processes import kill_run_processes

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# STEPS: enough that the run cannot reach its end between "step 2" and the outage's hold on the writers (a default
# step takes ~0.1-0.2 s here; with 12 steps the run once finished its last steps while the test was still reacting)
STEPS, RETRY_S = 40, 15.0  # RETRY_S: the trainer retries an MLflow call this long, then spools it
STEP_KEYS = ("reward/mean", "train/loss", "time/step_s", "version", "staleness/mean")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_mlflow(folder: Path, port: int) -> subprocess.Popen:
    """`mlflow server` on `port` over the store in `folder` (kept across restarts); returns once it answers."""
    log = open(folder / "server.log", "a")  # noqa: SIM115 - the server's stderr for its whole life
    proc = subprocess.Popen(
        [sys.executable, "-m", "mlflow", "server", "--host", "127.0.0.1", "--port", str(port), "--workers", "1",
         "--backend-store-uri", f"sqlite:///{folder / 'mlflow.db'}", "--artifacts-destination",
         str(folder / "artifacts")], stdout=subprocess.DEVNULL, stderr=log, start_new_session=True, cwd=folder)
    log.close()
    deadline = time.monotonic() + 180
    while True:
        with contextlib.suppress(httpx.HTTPError):
            if httpx.get(f"http://127.0.0.1:{port}/health", timeout=2).status_code == 200:
                return proc
        if proc.poll() is not None or time.monotonic() > deadline:
            _kill(proc)
            pytest.fail(f"mlflow server did not start: {(folder / 'server.log').read_text()[-3000:]}")
        time.sleep(0.5)


def _kill(proc: subprocess.Popen) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)  # a stopped process group dies too
    proc.wait(timeout=30)


def _procs(*needles: str) -> list[psutil.Process]:
    out = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        if all(n in " ".join(p.info["cmdline"] or []) for n in needles):
            out.append(p)
    return out


def _signal(procs: list[psutil.Process], sig: int) -> None:
    for p in procs:
        with contextlib.suppress(psutil.NoSuchProcess):  # the run failing meanwhile is reported by its exit status
            p.send_signal(sig)


def _until(what: str, cond, run: subprocess.Popen, timeout_s: float = 400) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if cond():
            return
        if run.poll() is not None:
            pytest.fail(f"the run ended before: {what}\n{run.communicate()[0][-3000:]}")
        time.sleep(0.2)
    pytest.fail(f"not within {timeout_s:.0f}s: {what}")


def _kill_run(run: subprocess.Popen, run_id: str, run_dir: Path) -> None:
    kill_run_processes(run_dir)  # first, while the roles live: their vLLM engine processes go with them
    for p in [*_procs("asyncrl.roles", f"/{run_id}"), *_procs("weed", str(run_dir))]:
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGKILL)
    run.kill()
    run.wait(30)


@pytest.mark.timeout(2400)  # a few minutes on a quiet machine; vLLM's and DeepSpeed's start on a busy one
def test_mlflow_stopped_then_restarted_mid_run_loses_no_metric(tmp_path: Path) -> None:
    mlflow_dir, runs, run_id = tmp_path / "mlflow", tmp_path / "runs", f"mlflow-outage-{os.getpid()}"
    mlflow_dir.mkdir()
    port = _free_port()
    servers = [_start_mlflow(mlflow_dir, port)]
    try:
        figures, metrics, summary = _outage_run(mlflow_dir, port, servers, runs, run_id)
    finally:
        for server in servers:
            _kill(server)
    with EmbeddedS3(runs / run_id / "s3") as s3:  # the run's data, served again: the spool is empty
        for k, v in s3.env().items():
            os.environ[k] = v
        store = S3Store(s3.endpoint_url, "asyncrl")
        assert store.list_keys(RunPaths("runs", run_id).file(SPOOL)) == []
    figures.update({"steps": STEPS, "retry_deadline_s": RETRY_S, "spooled_steps": metrics["tracking/spooled_total"],
                    "replayed_steps": metrics["tracking/replayed_total"],
                    "failed_attempts": metrics["tracking/failures_total"],
                    "tracking_spool_left": summary["tracking_spool_left"]})
    print(json.dumps({"mlflow_outage": figures}))
    if os.environ.get("ASYNCRL_FAULT_RESULTS"):
        out_dir = Path(os.environ["ASYNCRL_FAULT_RESULTS"])
        out_dir.mkdir(parents=True, exist_ok=True)
        (out_dir / "mlflow_outage.json").write_text(json.dumps(figures, indent=2) + "\n")


def _outage_run(mlflow_dir: Path, port: int, servers: list[subprocess.Popen], runs: Path,
                run_id: str) -> tuple[dict[str, float], dict[str, float], dict]:
    """The run with its outage (see the module docstring); (figures, the MLflow run's last metrics, the summary).
    Every server started is appended to `servers` (the caller kills them)."""
    run_dir, uri = runs / run_id, f"http://127.0.0.1:{port}"
    run = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "run", str(ROOT / "configs/smoke.yaml"), "--set", f"runs_dir={runs}",
         "--set", f"run_id={run_id}", "--set", f"cache_dir={ROOT / '.cache/asyncrl'}", "--set",
         "generation.num_servers=1", "--set", f"training.steps={STEPS}", "--set", "eval.every_steps=0",
         "--set", f"tracking.tracking_uri={uri}", "--set", f"tracking.retry_deadline_s={RETRY_S}"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    train_log = run_dir / "logs" / "training-0.log"
    figures: dict[str, float] = {}
    try:
        _until("step 2", lambda: train_log.is_file() and f"step 2/{STEPS}" in train_log.read_text(), run,
               timeout_s=1200)  # vLLM's and DeepSpeed's start on a busy machine
        # MLflow hangs at once: SIGSTOP, so every request waits for its timeout; steps go on and end up in the spool
        os.killpg(servers[-1].pid, signal.SIGSTOP)
        t_stop = time.monotonic()
        env = _procs("asyncrl.roles.training", f"/{run_id}")[0].environ()  # the run's S3 endpoint and keys
        os.environ.update({k: env[k] for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")})
        store, paths = S3Store(env["AWS_ENDPOINT_URL"], "asyncrl", timeout_s=10.0), RunPaths("runs", run_id)
        version = lambda: int((store.get_json(paths.versions_latest()) or {}).get("version", 0))  # noqa: E731
        spooled = lambda: store.list_keys(paths.file(SPOOL))  # noqa: E731
        v_stop = version()
        _until("a step while MLflow hangs", lambda: version() > v_stop, run)
        writers = _procs("asyncrl.roles.environment", f"/{run_id}")
        _signal(writers, signal.SIGSTOP)  # hold the run while MLflow is down and restarted: it cannot end first
        _until("steps in the tracking spool", lambda: bool(spooled()), run, timeout_s=4 * RETRY_S + 120)
        figures["stop_to_first_spooled_s"] = round(time.monotonic() - t_stop, 1)
        # MLflow dies (the hung server is killed) and a new one starts on the same port and store
        _kill(servers[-1])
        time.sleep(RETRY_S)  # calls meanwhile are refused at once, retried, and spooled
        servers.append(_start_mlflow(mlflow_dir, port))
        figures["outage_s"] = round(time.monotonic() - t_stop, 1)
        figures["spool_entries_at_restart"] = len(spooled())
        _signal(writers, signal.SIGCONT)
        out, _ = run.communicate(timeout=1200)
    finally:
        if run.poll() is None:
            _kill_run(run, run_id, run_dir)
    assert run.returncode == 0, out[-3000:]
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["final_version"] == STEPS and summary["tracking_spool_left"] == 0, summary
    assert "kept in S3" in train_log.read_text()

    client = MlflowClient(tracking_uri=uri)
    [mlflow_run] = client.search_runs([client.get_experiment_by_name("asyncrl").experiment_id],
                                      f"attributes.run_name = '{run_id}'")
    assert mlflow_run.info.status == "FINISHED"
    for key in STEP_KEYS:  # every step once: nothing lost, nothing logged twice
        steps = [m.step for m in client.get_metric_history(mlflow_run.info.run_id, key)]
        assert sorted(steps) == list(range(1, STEPS + 1)), (key, sorted(steps))
    metrics = mlflow_run.data.metrics
    # the trainer's tracking counters, as it logged them last (after its last call)
    assert metrics["tracking/spooled_total"] > 0 and metrics["tracking/failures_total"] > 0, metrics
    assert metrics["tracking/replayed_total"] == metrics["tracking/spooled_total"], metrics
    assert metrics["samples_trained"] == summary["samples_trained"]  # the summary, logged after the outage
    children = child_runs(client, mlflow_run.info.run_id)  # the role instances' runs: made once each, outage or not
    keys = [r.data.tags[CHILD_TAG] for r in children]
    assert len(keys) == len(set(keys)) and {"generation-0", "training-0"} <= set(keys), keys
    assert all(r.info.status == "FINISHED" for r in children), [(r.info.run_name, r.info.status) for r in children]
    cpu = client.get_metric_history(children[keys.index("generation-0")].info.run_id, "system/cpu_cores")
    steps = [m.step for m in cpu]  # at the steps they were read at, each once (those of the outage replayed)
    assert len(steps) == len(set(steps)) and STEPS in steps, steps
    return figures, metrics, summary
