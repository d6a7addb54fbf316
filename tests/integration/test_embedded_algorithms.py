"""End to end from config alone: `asyncrl run` with CISPO, AsyPPO (two mini-critics, GAE) and coupled attention
credit together, on the smoke config with one vLLM server.

Checks that the run finishes, every step logged the loss, critic, AsyPPO and credit metrics to MLflow (finite), the
first step only warmed the critics up, and the committed checkpoint holds both critics and their optimizer state.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import mlflow
import pytest

from asyncrl.config import load_config
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.checkpoints import latest_committed_version, load_checkpoint_tensors
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from tests.integration.conftest import ALGORITHMS_RUN_ID, ALGORITHMS_STEPS, mlflow_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS = ALGORITHMS_STEPS


@pytest.fixture
def finished_run(algorithms_run: Path) -> Path:
    """The run folder (tests/integration/conftest.py: run once per session, beside the smoke run)."""
    return algorithms_run


def test_metrics_of_every_algorithm_are_logged(finished_run):
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{finished_run.parent / 'mlflow.db'}")
    run = mlflow_run(finished_run.parent, ALGORITHMS_RUN_ID)
    assert run.info.status == "FINISHED"
    assert run.data.params["training.loss"] == "cispo" and run.data.params["training.asyppo.num_critics"] == "2"
    every_step = ("critic/loss", "critic/loss_0", "critic/loss_1", "critic/explained_variance",
                  "asyppo/adv_masked_fraction", "asyppo/ent_filtered_fraction", "train/actor_updated")
    for name in every_step:
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), name
        assert all(math.isfinite(m.value) for m in history), name
    updated = sorted(client.get_metric_history(run.info.run_id, "train/actor_updated"), key=lambda m: m.step)
    assert [m.value for m in updated] == [0.0] + [1.0] * (STEPS - 1)  # one critic warm-up step
    actor_steps = ("train/loss", "train/iw_max", "train/masked_fraction", "train/entropy",
                   "train/credit_amplified_fraction", "train/credit_gamma_mean")
    for name in actor_steps:
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(2, STEPS + 1)), name
        assert all(math.isfinite(m.value) for m in history), name
    masked = client.get_metric_history(run.info.run_id, "asyppo/adv_masked_fraction")
    assert all(0.1 <= m.value <= 0.2 for m in masked)  # ⌊0.2·n⌋ of n tokens


def test_checkpoint_holds_the_critics(finished_run, monkeypatch):
    cfg = load_config(ROOT / "configs/smoke.yaml")
    summary = json.loads((finished_run / "run_summary.json").read_text())
    with EmbeddedS3(finished_run / "s3") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        store = S3Store(s3.endpoint_url, cfg.storage.bucket)
        paths = RunPaths(cfg.storage.prefix, summary["run_id"])
        version = latest_committed_version(store, paths)
        assert version == STEPS
        critic = load_checkpoint_tensors(store, paths, version, "critic")
        optim = load_checkpoint_tensors(store, paths, version, "critic_optimizer")
    assert {"critic0.value_head.weight", "critic1.value_head.weight"} <= set(critic)
    assert optim["critic0.step"].item() == STEPS and optim["critic1.step"].item() == STEPS
    # the two critics trained on different shares: their heads differ
    assert not critic["critic0.value_head.weight"].equal(critic["critic1.value_head.weight"])
