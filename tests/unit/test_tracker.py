"""MLflow tracking against a real sqlite store (offline), including a second process logging to the run."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
from mlflow import MlflowClient

from asyncrl.tracking.mlflow_tracker import Tracker, embedded_tracking_uri, flatten_params, is_secret_key


def test_flatten_params_nested_and_secrets_dropped() -> None:
    cfg = {
        "training": {"lr": 0.0002, "w_mask": None, "loss": "cispo"},
        "rollout": {"max_new_tokens": 8, "operations": ["+", "-"]},
        "storage": {"bucket": "asyncrl", "aws_access_key_id": "AKIA", "secret_key": "s", "access_key": "a"},
        "hub": {"hf_token": "hf_x", "api-token": "t", "password": "p", "auth": {"user": "u"}},
        "name": "run",
    }
    assert flatten_params(cfg) == {
        "training.lr": "0.0002",
        "training.w_mask": "null",
        "training.loss": "cispo",
        "rollout.max_new_tokens": "8",
        "rollout.operations": '["+", "-"]',
        "storage.bucket": "asyncrl",
        "name": "run",
    }
    assert is_secret_key("x.AWS_SECRET_ACCESS_KEY") and is_secret_key("access_token")
    assert not is_secret_key("rollout.max_new_tokens") and not is_secret_key("task.max_operand")
    assert len(flatten_params({"long": "x" * 10_000})["long"]) == 6000


@pytest.fixture(scope="module")
def store_uri(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    yield embedded_tracking_uri(tmp_path_factory.mktemp("run"))


def test_create_log_attach_finish(store_uri: str) -> None:
    tracker = Tracker.create(
        store_uri, "asyncrl-test", "run-a",
        params={"training": {"lr": 0.1, "steps": 3}, "storage": {"secret_key": "shh"}},
        tags={"asyncrl.mode": "embedded"},
    )  # fmt: skip
    tracker.log_metrics({"reward/mean": 0.25, "loss": -1.5}, step=1)
    tracker.log_metrics({"reward/mean": 0.5, "flag": True}, step=2)
    other = Tracker.attach(store_uri, tracker.run_id)  # e.g. the training role
    other.log_metrics({"reward/mean": 0.75}, step=3)
    other.set_tags({"phase": "train"})
    other.log_dict({"final": 1}, "summary/run_summary.json")
    tracker.finish()

    client = MlflowClient(store_uri)
    run = client.get_run(tracker.run_id)
    assert run.data.params == {"training.lr": "0.1", "training.steps": "3"}
    assert run.data.tags["asyncrl.mode"] == "embedded" and run.data.tags["phase"] == "train"
    assert run.info.status == "FINISHED" and run.info.run_name == "run-a"
    hist = client.get_metric_history(tracker.run_id, "reward/mean")
    assert sorted((m.step, m.value) for m in hist) == [(1, 0.25), (2, 0.5), (3, 0.75)]
    assert client.get_metric_history(tracker.run_id, "flag")[0].value == 1.0
    db_dir = Path(store_uri.removeprefix("sqlite:///")).parent
    artifact = db_dir / "artifacts" / tracker.run_id / "artifacts" / "summary" / "run_summary.json"
    assert artifact.read_text().strip().replace(" ", "").replace("\n", "") == '{"final":1}'

    with pytest.raises(ValueError, match="metric 'x': expected a number"):
        tracker.log_metrics({"x": "high"}, step=0)  # type: ignore[dict-item]
    with pytest.raises(ValueError, match="expected a finite number or NaN"):
        tracker.log_metrics({"x": float("inf")}, step=0)
    with pytest.raises(ValueError, match="status"):
        tracker.finish("DONE")
    with pytest.raises(ValueError, match="MLflow run 'nope' not found"):
        Tracker.attach(store_uri, "nope")


def test_second_process_logs_to_same_run(store_uri: str) -> None:
    tracker = Tracker.create(store_uri, "asyncrl-test", "run-b", params={}, tags={})
    code = (
        "import sys; from asyncrl.tracking.mlflow_tracker import Tracker\n"
        "t = Tracker.attach(sys.argv[1], sys.argv[2])\n"
        "for s in range(20): t.log_metrics({'child': float(s)}, step=s)\n"
    )
    child = subprocess.Popen([sys.executable, "-c", code, store_uri, tracker.run_id])
    try:
        for s in range(20):
            tracker.log_metrics({"parent": float(s) * 2}, step=s)
        assert child.wait(timeout=120) == 0
    finally:
        if child.poll() is None:
            child.kill()
            child.wait()
    client = MlflowClient(store_uri)
    assert sorted(m.step for m in client.get_metric_history(tracker.run_id, "child")) == list(range(20))
    assert client.get_run(tracker.run_id).data.metrics == {"child": 19.0, "parent": 38.0}
