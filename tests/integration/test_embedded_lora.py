"""End to end from config alone: `asyncrl run` on the smoke config with LoRA adapters (`training.lora`), GSPO with
two mini-batch updates a step, and the geometric-mean sequence mask on top (docs/algorithms.md §3, §8).

Checks: the run finishes (its end-of-run check compares what the trainer pushed with what the server received, here
adapters); every step logged its updates, the correction's counts and the engine-trainer gap to MLflow; the
registered model is the adapters with the description of their base (`asyncrl_lora.json`), and `asyncrl model merge`
turns it into a plain Hugging Face model that differs from the base (the adapters trained).
"""

from __future__ import annotations

import json
import math
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from safetensors.torch import load_file

from asyncrl.config import load_config
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from tests.helpers.subprocess_runs import run_embedded
from tests.integration.conftest import mlflow_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "lora-test"
STEPS = 3
OVERRIDES = [
    "generation.num_servers=1", f"training.steps={STEPS}", "training.checkpoint_every=2", "eval.every_steps=0",
    'training.lora={"rank":4,"alpha":8}', "training.lr=0.01", "training.loss=gspo", "training.mini_batches=2",
    'training.seq_correction={"level":"geometric","mode":"mask"}',
]


@pytest.fixture(scope="module")
def lora_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    runs = tmp_path_factory.mktemp("lora-runs")
    run_embedded(ROOT / "configs/smoke.yaml", runs, RUN_ID, OVERRIDES)
    return runs / RUN_ID


def test_every_step_logged_its_updates_and_corrections(lora_run: Path) -> None:
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{lora_run.parent / 'mlflow.db'}")
    run = mlflow_run(lora_run.parent, RUN_ID)
    assert run.info.status == "FINISHED" and run.data.params["training.loss"] == "gspo"
    for name in ("train/updates", "train/corr_sequences_count", "train/corr_masked_sequences_count",
                 "train/corr_weight_mean", "train/gap_abs", "train/gap_k3", "train/clip_fraction"):
        history = client.get_metric_history(run.info.run_id, name)
        assert sorted(m.step for m in history) == list(range(1, STEPS + 1)), name
        assert all(math.isfinite(m.value) for m in history), name
    assert {m.value for m in client.get_metric_history(run.info.run_id, "train/updates")} == {2.0}
    assert all(m.value > 0 for m in client.get_metric_history(run.info.run_id, "train/corr_sequences_count"))


def test_the_registered_model_is_the_adapters_and_merges_into_its_base(lora_run: Path, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    from transformers import AutoModelForCausalLM

    summary = json.loads((lora_run / "run_summary.json").read_text())
    assert summary["weights_in_sync"] is True  # the server received exactly the adapters the trainer holds
    cfg = load_config(ROOT / "configs/smoke.yaml")
    with EmbeddedS3(lora_run / "s3") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        store = S3Store(s3.endpoint_url, cfg.storage.bucket)
        registered = store.get_json(RunPaths(cfg.storage.prefix, summary["run_id"]).file("models/registered.json"))
    uri = f"sqlite:///{lora_run.parent / 'mlflow.db'}"
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)
    folder = Path(mlflow.artifacts.download_artifacts(registered["model_uri"], dst_path=str(tmp_path / "model"),
                                                      tracking_uri=uri))
    doc = json.loads((folder / "asyncrl_lora.json").read_text())
    assert (doc["rank"], doc["alpha"], doc["scale"]) == (4, 8.0, 2.0)
    adapters = load_file(str(folder / "model.safetensors"))
    assert adapters and all(n.endswith((".lora_A", ".lora_B")) for n in adapters)
    merged = tmp_path / "merged"
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "model", "merge", str(folder), "--out", str(merged)],
                          capture_output=True, text=True, timeout=300, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout.strip().splitlines()[-1])["layers"] == len(adapters) // 2
    assert not (merged / "asyncrl_lora.json").exists()
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    with torch.no_grad():
        trained = AutoModelForCausalLM.from_pretrained(str(merged), dtype=torch.float32).eval()(ids).logits
        base = AutoModelForCausalLM.from_pretrained(doc["base_model"], dtype=torch.float32).eval()(ids).logits
    assert not torch.allclose(trained, base)


def test_merge_refuses_a_folder_that_is_not_a_lora_checkpoint(tmp_path: Path) -> None:
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "model", "merge", str(tmp_path), "--out",
                           str(tmp_path / "out")], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and "asyncrl_lora.json: not found; expected a LoRA checkpoint folder" in proc.stderr
    assert not (tmp_path / "out").exists()
