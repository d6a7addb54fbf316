"""The pipeline's `finalize` step while MLflow is down (`python -m asyncrl.cluster.finalize`, as the exit handler's
pod runs it, on a real SeaweedFS server): the final status is written all the same and says what MLflow missed
(`tracking_error`, `tracking_spool_left`), the tracking spool stays in S3; once MLflow is back (its real sqlite
store), `asyncrl tracking replay --end FINISHED` logs the spool and ends the MLflow run. finalize gives MLflow 5 s instead of
its 60 s before giving up (SHORT_DEADLINE_S), so the test waits seconds, not minutes, on a server that is down."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.spool import MetricSpool, metrics_entry

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


# finalize retries MLflow until asyncrl.run.finalize.TRACKING_DEADLINE_S (60 s) has passed, once for the spool's
# replay and once for ending the run: two minutes of refused connections that show nothing more than a few seconds
# do. The same module runs, its deadline set this short first.
SHORT_DEADLINE_S = 5.0
FINALIZE_WITH_SHORT_DEADLINE = (
    "import runpy, asyncrl.run.finalize as f; "
    f"f.TRACKING_DEADLINE_S = {SHORT_DEADLINE_S}; "
    "runpy.run_module('asyncrl.cluster.finalize', run_name='__main__', alter_sys=True)")


def _module(module: str, *args: str, endpoint: str, code: str = "") -> subprocess.CompletedProcess:
    """`python -m module args` (or `python -c code args`) with the S3 endpoint, as the pipeline's pods run it."""
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "ASYNCRL_GIT_REVISION": "abc123"}
    env.pop("MLFLOW_RUN_ID", None)
    how = ["-c", code] if code else ["-m", module]
    return subprocess.run([sys.executable, *how, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=600, env=env)


def test_finalize_with_mlflow_down_keeps_the_status_and_the_spool(s3_server, s3_store: S3Store, tmp_path: Path):
    uri, endpoint = f"sqlite:///{tmp_path / 'mlflow.db'}", s3_server.endpoint_url
    setup = _module("asyncrl.cluster.setup", "--bucket", s3_store.bucket, "--prefix", "runs", "--run-id", "kfp-run-1",
                    "--generation-ids-json", '["0"]', "--environment-ids-json", '["env0"]',
                    "--set", f"tracking.tracking_uri={uri}", endpoint=endpoint)
    assert setup.returncode == 0, setup.stderr[-3000:]
    paths = RunPaths("runs", "kfp-run-1")
    tracking = s3_store.get_json(paths.tracking())
    with socket.socket() as s:  # MLflow down: nobody listens there
        s.bind(("127.0.0.1", 0))
        down = f"http://127.0.0.1:{s.getsockname()[1]}"
    s3_store.put_json(paths.tracking(), {**tracking, "tracking_uri": down})
    MetricSpool(s3_store, paths).append(metrics_entry([({"reward/mean": 0.5}, 1, 1_000)], "MLflow down"))

    done = _module("asyncrl.cluster.finalize", "--run-url", f"s3://{s3_store.bucket}/runs/kfp-run-1", "--status",
                   "SUCCEEDED", endpoint=endpoint, code=FINALIZE_WITH_SHORT_DEADLINE)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "MLflow unavailable at the run's end" in done.stderr, done.stderr[-3000:]  # it did try, and gave up
    status = s3_store.get_json(paths.file("final_status.json"))
    assert status["status"] == "SUCCEEDED" and status["tracking_spool_left"] == 1 and status["tracking_error"], status
    assert "registered_model" not in status and s3_store.exists(paths.done())
    assert len(MetricSpool(s3_store, paths).keys()) == 1

    s3_store.put_json(paths.tracking(), tracking)  # MLflow back
    replay = _module("asyncrl.cli", "tracking", "replay", "--run-url", f"s3://{s3_store.bucket}/runs/kfp-run-1",
                     "--end", "FINISHED", endpoint=endpoint)
    assert replay.returncode == 0, replay.stderr[-3000:]
    assert json.loads(replay.stdout.splitlines()[-1])["replayed"] == 1
    client = MlflowClient(tracking_uri=uri)
    assert [(m.step, m.value) for m in client.get_metric_history(tracking["mlflow_run_id"], "reward/mean")] == [(1, 0.5)]
    assert client.get_run(tracking["mlflow_run_id"]).info.status == "FINISHED"
    assert MetricSpool(s3_store, paths).keys() == []
