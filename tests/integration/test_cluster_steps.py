"""The pipeline's setup and finalize steps as the pods run them (`python -m asyncrl.cluster.setup|finalize`),
against a real SeaweedFS server and a real MLflow store: the configuration lands once under the KFP run id, a
retried setup is idempotent and a different configuration is refused without overwriting; finalize marks the run
done, records the final status, registers the last committed checkpoint and ends the MLflow run."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest

from asyncrl.storage.run_layout import RunPaths

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _step(module: str, *args: str, endpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, "ASYNCRL_GIT_REVISION": "abc123"}
    env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def test_setup_then_finalize(s3_server, s3_store, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bucket, endpoint = s3_store.bucket, s3_server.endpoint_url
    setup = ["--bucket", bucket, "--prefix", "runs", "--run-id", "kfp-run-1", "--config-yaml",
             "rollout:\n  async_ratio: 2\n", "--generation-ids-json", '["0", "1"]', "--environment-ids-json",
             '["env0", "env1"]', "--set", f"tracking.tracking_uri={uri}", "--set", "tracking.experiment=cluster",
             "--overrides-json", '["training.steps=7"]', "--tags-json", '["image.training=asyncrl-training:abc"]']
    first = _step("asyncrl.cluster.setup", *setup, endpoint=endpoint)
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout.strip().splitlines()[-1])
    assert out["run_url"] == f"s3://{bucket}/runs/kfp-run-1" and out["written"] is True
    paths = RunPaths("runs", "kfp-run-1")
    cfg = s3_store.get_json(paths.config())
    assert cfg["run_id"] == "kfp-run-1" and cfg["rollout"]["async_ratio"] == 2 and cfg["training"]["steps"] == 7
    assert cfg["generation"]["num_servers"] == 2 and cfg["rollout"]["num_writers"] == 2
    assert cfg["storage"]["endpoint_url"] == endpoint
    tracking = s3_store.get_json(paths.tracking())
    client = mlflow.MlflowClient(tracking_uri=uri)
    run = client.get_run(tracking["mlflow_run_id"])
    assert run.data.tags["kfp.run_id"] == "kfp-run-1" and run.data.tags["image.training"] == "asyncrl-training:abc"
    assert run.data.tags["git.revision"] == "abc123"
    assert run.data.params["rollout.async_ratio"] == "2"
    # a retried step with the same configuration succeeds; a different one is refused and nothing changes
    again = _step("asyncrl.cluster.setup", *setup[:-4], "--overrides-json", '["training.steps=7"]',
                  endpoint=endpoint)
    assert again.returncode == 0 and json.loads(again.stdout.strip().splitlines()[-1])["written"] is False
    other = _step("asyncrl.cluster.setup", *setup[:-4], "--overrides-json", '["training.steps=8"]',
                  endpoint=endpoint)
    assert other.returncode == 2 and "a different configuration is already stored" in other.stderr
    assert s3_store.get_json(paths.config())["training"]["steps"] == 7
    bad = _step("asyncrl.cluster.setup", "--bucket", bucket, "--run-id", "kfp-run-2", "--set",
                "rollout.async_ratio=-1", endpoint=endpoint)
    assert bad.returncode == 2 and "async_ratio" in bad.stderr
    assert s3_store.get_json(RunPaths("runs", "kfp-run-2").config()) is None

    s3_store.put_json(paths.checkpoint_committed(3), {"files": {}})  # the trainer's last committed checkpoint
    done = _step("asyncrl.cluster.finalize", "--run-url", out["run_url"], "--status", "SUCCEEDED",
                 endpoint=endpoint)
    assert done.returncode == 0, done.stderr
    assert s3_store.exists(paths.done())
    status = s3_store.get_json(paths.file("final_status.json"))
    assert status["status"] == "SUCCEEDED" and status["final_version"] == 3
    reg = status["registered_model"]
    assert reg["name"] == "cluster-asyncrl" and reg["source"] == f"s3://{bucket}/runs/kfp-run-1/checkpoints/3"
    (version,) = client.search_model_versions("name='cluster-asyncrl'")
    assert version.run_id == tracking["mlflow_run_id"] and version.source == reg["source"]
    assert client.get_run(tracking["mlflow_run_id"]).info.status == "FINISHED"
    # finalize is idempotent: a retry registers nothing twice
    assert _step("asyncrl.cluster.finalize", "--run-url", out["run_url"], "--status", "SUCCEEDED",
                 endpoint=endpoint).returncode == 0
    assert len(client.search_model_versions("name='cluster-asyncrl'")) == 1
