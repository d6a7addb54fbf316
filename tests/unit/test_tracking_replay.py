"""A run's end while MLflow is down, and the replay later: `publish_summary` keeps the summary's numbers in the
tracking spool and says so (`tracking_spool_left`), never fails; `asyncrl tracking replay` (a real process, real
S3, MLflow's sqlite store) logs the spool into the run's MLflow run, empties it and ends the run; with MLflow still
unreachable it keeps everything and exits 1."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient

from asyncrl.run.summary import publish_summary
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.tracking.spool import MetricSpool

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def _restore_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _replay(store: S3Store, paths: RunPaths, *extra: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": store.endpoint_url}
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", "tracking", "replay", "--run-url",
                           run_url(store.bucket, paths.prefix, paths.run_id), *extra],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def test_summary_with_mlflow_down_is_spooled_then_replayed_by_the_command(s3_store: S3Store, tmp_path: Path) -> None:
    paths = RunPaths("runs", f"r-{uuid.uuid4().hex[:8]}")
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run_id = Tracker.create(uri, "replay-test", paths.run_id).run_id
    down = Tracker.for_run(f"http://127.0.0.1:{_closed_port()}", run_id)  # the same run, behind a dead server
    summary = {"run_id": paths.run_id, "final_version": 3, "samples_trained": 48, "weights_in_sync": True}
    publish_summary(s3_store, paths, summary, down, tmp_path, tracking_deadline_s=0.5)
    assert summary["tracking_spool_left"] == 1
    assert s3_store.get_json(paths.file("run_summary.json"))["tracking_spool_left"] == 1
    assert json.loads((tmp_path / "run_summary.json").read_text())["samples_trained"] == 48

    # MLflow unreachable still: everything kept, exit 1
    s3_store.put_json(paths.tracking(), {"tracking_uri": down.tracking_uri, "mlflow_run_id": run_id})
    r = _replay(s3_store, paths, "--deadline-s", "0.5")
    assert r.returncode == 1 and json.loads(r.stdout.splitlines()[-1])["left"] == 1, r.stderr[-2000:]
    assert len(MetricSpool(s3_store, paths).keys()) == 1

    # MLflow back: logged once, the spool empty, the run ended
    s3_store.put_json(paths.tracking(), {"tracking_uri": uri, "mlflow_run_id": run_id})
    r = _replay(s3_store, paths, "--end", "FINISHED")
    assert r.returncode == 0, r.stderr[-2000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert {k: out[k] for k in ("replayed", "left", "failures", "ended", "models")} == \
        {"replayed": 1, "left": 0, "failures": 0, "ended": "FINISHED", "models": "skip"}
    assert "pass --models reference" in out["models_skipped"]  # no checkpoints, no mode recorded: nothing to log
    assert MetricSpool(s3_store, paths).keys() == []
    client = MlflowClient(tracking_uri=uri)
    assert [(m.step, m.value) for m in client.get_metric_history(run_id, "samples_trained")] == [(3, 48.0)]
    assert client.get_run(run_id).info.status == "FINISHED"


def test_replay_of_a_run_without_tracking_names_the_document(s3_store: S3Store) -> None:
    paths = RunPaths("runs", f"r-{uuid.uuid4().hex[:8]}")
    r = _replay(s3_store, paths)
    assert r.returncode == 2 and "tracking.json: expected the run's MLflow tracking document" in r.stderr, r.stderr
