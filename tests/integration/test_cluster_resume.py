"""Resuming a crashed run on the cluster (pipeline parameter `resume_run_id`), with the setup and finalize steps as
the pods run them, against a real SeaweedFS server and a real MLflow store (no vLLM, no DeepSpeed): setup outputs the
old run id, rewinds versions/latest.json to the last committed checkpoint's cursors, deletes the heartbeats,
withdraws the rendezvous, re-attaches and tags the MLflow run and records the attempt; an unknown run, a run the
trainer finished and a changed configuration are refused naming the problem, with nothing stored changed; finalize
ends a resumed run only for the pipeline run that resumed it, and registers its new last checkpoint."""

import json
import os
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch

from asyncrl.storage.checkpoints import save_checkpoint
from asyncrl.storage.run_layout import RunPaths

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
OLD = "kfp-run-1"


def _step(module: str, *args: str, endpoint: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint}
    env.pop("MLFLOW_RUN_ID", None)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=120, env=env)


def _snapshot(store, paths):
    return {k: store.get_bytes(k) for k in store.list_keys(paths.root + "/")}


def test_resume_a_crashed_run(s3_server, s3_store, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    bucket, endpoint = s3_store.bucket, s3_server.endpoint_url
    paths = RunPaths("runs", OLD)

    def setup(kfp_run: str, *extra: str, resume: str = "", steps: int = 6) -> subprocess.CompletedProcess:
        return _step("asyncrl.cluster.setup", "--bucket", bucket, "--prefix", "runs", "--run-id", kfp_run,
                     "--config-yaml", "rollout:\n  async_ratio: 2\n", "--generation-ids-json", '["0"]',
                     "--environment-ids-json", '["env0"]', "--set", f"tracking.tracking_uri={uri}",
                     "--set", f"training.steps={steps}", "--resume-run-id", resume,
                     "--run-id-output", str(tmp_path / kfp_run / "run_id"), *extra, endpoint=endpoint)

    first = setup(OLD)
    assert first.returncode == 0, first.stderr
    assert (tmp_path / OLD / "run_id").read_text() == OLD
    mlflow_run = s3_store.get_json(paths.tracking())["mlflow_run_id"]
    # the crashed attempt: a committed checkpoint at version 2, steps 3 and 4 published after it, a failed trainer's
    # heartbeat, a generation server's address
    save_checkpoint(s3_store, paths, 2, {"w": torch.ones(2)}, {"m": torch.zeros(2)},
                    {"cursors": {"env0": 5}, "counters": {"trained_by_writer": {"env0": 4}, "trained_groups": 4}})
    s3_store.put_json(paths.versions_latest(), {"version": 4, "consumed": {"env0": 9}, "trained": {"env0": 8}})
    s3_store.put_json(paths.heartbeat("training", "0"), {"seq": 9, "state": "failed", "error": "killed"})
    s3_store.put_json(paths.rendezvous("generation", "0"), {"host": "10.0.0.7", "port": 8000, "epoch": 3})

    # refusals: nothing stored changes
    before = _snapshot(s3_store, paths)
    unknown = setup("kfp-run-2", resume="no-such-run")
    assert unknown.returncode == 2
    assert (f"resume_run_id no-such-run: no such run: runs/no-such-run/config.json does not exist in bucket {bucket}"
            in unknown.stderr)
    changed = setup("kfp-run-2", "--set", "rollout.async_ratio=3", resume=OLD)
    assert changed.returncode == 2
    assert ("differs from the stored runs/kfp-run-1/config.json in 1 field(s): rollout.async_ratio (stored 2, given 3)"
            in changed.stderr)
    s3_store.put_json(paths.done(), {"version": 6, "time": 1.0})  # the trainer finished the run
    finished = setup("kfp-run-2", resume=OLD)
    assert finished.returncode == 2 and f"run {OLD} is already done: its trainer finished it" in finished.stderr
    s3_store.delete(paths.done())
    assert _snapshot(s3_store, paths) == before
    assert not (tmp_path / "kfp-run-2" / "run_id").exists()
    client = mlflow.MlflowClient(tracking_uri=uri)
    assert client.get_run(mlflow_run).info.status == "RUNNING" and "kfp.resume_run" not in client.get_run(
        mlflow_run).data.tags

    # the failed pipeline's exit step ended the run (done by finalize, FAILED): that run can be resumed
    ended = _step("asyncrl.cluster.finalize", "--run-url", f"s3://{bucket}/runs/{OLD}", "--status", "FAILED",
                  "--kfp-run-id", OLD, endpoint=endpoint)
    assert ended.returncode == 0, ended.stderr
    assert s3_store.get_json(paths.done())["by"] == "finalize" and client.get_run(mlflow_run).info.status == "FAILED"

    resumed = setup("kfp-run-2", resume=OLD, steps=8)  # training.steps may grow
    assert resumed.returncode == 0, resumed.stderr
    assert (tmp_path / "kfp-run-2" / "run_id").read_text() == OLD  # every role drives the old run's folder
    out = json.loads(resumed.stdout.strip().splitlines()[-1])
    assert (out["run_id"], out["resumed_from"], out["lost_steps"], out["mlflow_run_id"]) == (OLD, 2, 2, mlflow_run)
    latest = s3_store.get_json(paths.versions_latest())
    assert (latest["version"], latest["consumed"], latest["trained"], latest["resumed_from"]) == (
        2, {"env0": 5}, {"env0": 4}, 2)
    assert s3_store.list_keys(paths.heartbeats_prefix()) == []
    assert s3_store.get_json(paths.rendezvous("generation", "0")) == {"epoch": 3, "withdrawn": "the run was resumed"}
    assert not s3_store.exists(paths.done()) and not s3_store.exists(paths.file("final_status.json"))
    assert s3_store.get_json(paths.config())["training"]["steps"] == 8
    record = s3_store.get_json(paths.file("resumes.json"))
    assert record["current"] == "kfp-run-2" and [a["kfp_run_id"] for a in record["attempts"]] == ["kfp-run-2"]
    assert record["attempts"][0]["training_steps"] == {"stored": 6, "now": 8}
    assert record["attempts"][0]["previous_end"]["final_status"]["status"] == "FAILED"
    run = client.get_run(mlflow_run)
    assert run.info.status == "RUNNING"
    assert (run.data.tags["asyncrl.resumed_from"], run.data.tags["kfp.resume_run"], run.data.tags["kfp.run_id"]) == (
        "2", "kfp-run-2", OLD)

    # finalize: another pipeline run (one whose resume was refused) leaves the run alone; the resuming one ends it
    # and registers the new last checkpoint as a second model version
    save_checkpoint(s3_store, paths, 8, {"w": torch.ones(2)}, {"m": torch.zeros(2)}, {"cursors": {"env0": 17}})
    other = _step("asyncrl.cluster.finalize", "--run-url", f"s3://{bucket}/runs/{OLD}", "--status", "FAILED",
                  "--kfp-run-id", "kfp-run-3", endpoint=endpoint)
    assert other.returncode == 0 and json.loads(other.stdout.strip().splitlines()[-1])["finalized"] is False
    assert not s3_store.exists(paths.done()) and client.get_run(mlflow_run).info.status == "RUNNING"
    done = _step("asyncrl.cluster.finalize", "--run-url", f"s3://{bucket}/runs/{OLD}", "--status", "SUCCEEDED",
                 "--kfp-run-id", "kfp-run-2", endpoint=endpoint)
    assert done.returncode == 0, done.stderr
    assert s3_store.get_json(paths.file("final_status.json"))["final_version"] == 8
    sources = sorted(v.source for v in client.search_model_versions("name='asyncrl-asyncrl'"))
    assert sources == [f"s3://{bucket}/runs/{OLD}/checkpoints/2", f"s3://{bucket}/runs/{OLD}/checkpoints/8"]
    assert client.get_run(mlflow_run).info.status == "FINISHED"
    again = setup("kfp-run-4", resume=OLD, steps=8)  # the pipeline succeeded: nothing to resume
    assert again.returncode == 2 and "its pipeline ended with status SUCCEEDED" in again.stderr
