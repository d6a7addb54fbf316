"""Checkpoints as complete Hugging Face folders, logged as MLflow models and registered, on the session's real S3
server and a real MLflow store (a sqlite file in tmp): both modes of `asyncrl.run.checkpoint_models`.

Cluster mode references the checkpoint's s3:// folder (no weights in MLflow); embedded mode copies the folder, and
the registered version loads with transformers with the checkpoint's exact logits. MLflow down at the run's end:
the checkpoints are recorded as not logged, and a later call or `asyncrl tracking replay` logs and registers them.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

import mlflow
import pytest
import torch
from mlflow import MlflowClient
from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast

from asyncrl.config import load_config
from asyncrl.models.checkpoint_folder import checkpoint_folder_files
from asyncrl.models.folder import check_model_folder
from asyncrl.models.tokenizer import build_tokenizer, load_tokenizer
from asyncrl.run.checkpoint_models import (
    NOT_LOGGED,
    PUBLISHED,
    REGISTERED,
    checkpoint_uri,
    model_folder_files,
    publish_embedded_models,
    publish_models,
)
from asyncrl.storage.checkpoints import (
    CheckpointError,
    checkpoint_file_names,
    load_checkpoint,
    read_checkpoint_file,
    save_checkpoint,
)
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store
from tests.helpers.tiny_random_model import build_tiny_random_model

INPUT = torch.tensor([[1, 5, 9, 3, 7, 2]])
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def start_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The run's model folder: a tiny random Qwen2 (tied embeddings), a tokenizer and a generation config."""
    folder = build_tiny_random_model(tmp_path_factory.mktemp("start"))
    build_tokenizer(folder)
    (folder / "generation_config.json").write_text('{"eos_token_id": 2, "pad_token_id": 0}')
    return folder


def _trained(start: Path, seed: int) -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
    """The start model with its weights moved (a stand-in for training) and its state as the trainer saves it:
    `named_parameters()`, a tied lm_head once."""
    model = AutoModelForCausalLM.from_pretrained(str(start), dtype=torch.float32).eval()
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn(p.shape, generator=gen) * 0.05)
    return model, {n: p.detach().clone() for n, p in model.named_parameters()}


def _save(store: S3Store, paths: RunPaths, version: int, state: dict[str, torch.Tensor], start: Path) -> None:
    save_checkpoint(store, paths, version, state, {"step": torch.tensor(float(version))},
                    {"version": version, "cursors": {}}, folder_files=checkpoint_folder_files(start))


def _logits(model: torch.nn.Module) -> torch.Tensor:
    with torch.no_grad():
        return model(INPUT).logits


def _eval_point(store: S3Store, paths: RunPaths, version: int, accuracy: float) -> None:
    doc = {"version": version, "metrics": {"eval/accuracy": accuracy, "eval/n": 32.0}, "time": 0.0}
    store.put_json(paths.file(f"eval/{version:08d}.json"), doc)


def _mlflow_run(tmp_path: Path) -> tuple[MlflowClient, str, dict[str, str]]:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    experiment = client.create_experiment("asyncrl", artifact_location=(tmp_path / "artifacts").as_uri())
    run_id = client.create_run(experiment).info.run_id
    return client, experiment, {"tracking_uri": uri, "mlflow_run_id": run_id}


@pytest.fixture
def bounded_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """`publish_models` bounds MLflow's HTTP requests in os.environ: given back after the test."""
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "0")
    monkeypatch.setenv("MLFLOW_HTTP_REQUEST_TIMEOUT", "10")


def test_a_committed_checkpoint_is_a_complete_hugging_face_folder(s3_store, start_folder, tmp_path):
    paths = RunPaths("runs", "hf")
    model, state = _trained(start_folder, seed=1)
    _save(s3_store, paths, 2, state, start_folder)
    names = checkpoint_file_names(s3_store, paths, 2)
    assert {"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
            "model.safetensors", "optimizer.safetensors", "meta.json"} <= set(names)
    folder = tmp_path / "checkpoint-2"
    folder.mkdir()
    for name in model_folder_files(names):
        (folder / name).write_bytes(read_checkpoint_file(s3_store, paths, 2, name))
    assert not (folder / "optimizer.safetensors").exists() and check_model_folder(folder) == folder
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert torch.equal(_logits(loaded), _logits(model))
    assert loaded.generation_config.eos_token_id == 2
    text = "12+34="
    assert PreTrainedTokenizerFast.from_pretrained(str(folder))(text)["input_ids"] == \
        load_tokenizer(start_folder)(text)["input_ids"]
    # the resume path reads it back as before
    model_state, _, meta = load_checkpoint(s3_store, paths, 2)
    assert meta["version"] == 2 and all(torch.equal(model_state[n], t) for n, t in state.items())


def test_a_changed_config_or_tokenizer_file_fails_the_load_naming_it(s3_store, start_folder):
    paths = RunPaths("runs", "corrupt")
    _save(s3_store, paths, 1, _trained(start_folder, seed=2)[1], start_folder)
    s3_store.put_bytes(paths.checkpoint(1, "tokenizer.json"), b"{}")
    with pytest.raises(CheckpointError, match="checkpoint 1: .*tokenizer.json does not match its sha256"):
        load_checkpoint(s3_store, paths, 1)


def test_cluster_mode_models_reference_the_s3_folders_and_the_best_by_eval_is_registered_once(
        s3_store, start_folder, tmp_path, bounded_mlflow_env):
    paths = RunPaths("runs", "cluster")
    client, experiment, tracking = _mlflow_run(tmp_path)
    for version, seed in ((2, 3), (4, 4)):
        _save(s3_store, paths, version, _trained(start_folder, seed)[1], start_folder)
    _eval_point(s3_store, paths, 2, 0.75)
    _eval_point(s3_store, paths, 3, 0.9375)  # not a checkpoint
    _eval_point(s3_store, paths, 4, 0.5)
    out = publish_models(s3_store, paths, tracking, "arith", by_reference=True, deadline_s=30)
    assert out["models_logged"] == [2, 4] and out["models_not_logged"] == [] and "models_error" not in out
    reg = out["registered_model"]
    assert (reg["name"], reg["version"], reg["checkpoint_version"], reg["reason"], reg["eval_accuracy"]) == \
        ("arith", "1", 2, "best_eval", 0.75)
    assert reg["source"] == checkpoint_uri(s3_store, paths, 2) == f"s3://{s3_store.bucket}/runs/cluster/checkpoints/2"
    assert s3_store.get_json(paths.file(REGISTERED)) == reg

    models = {m.name: m for m in client.search_logged_models([experiment])}
    assert sorted(models) == ["checkpoint-2", "checkpoint-4"]
    for version in (2, 4):
        m = models[f"checkpoint-{version}"]
        assert str(m.status) == "READY" and m.source_run_id == tracking["mlflow_run_id"]
        assert m.tags["mlflow.model.isExternal"] == "true"
        assert m.tags["asyncrl.checkpoint_uri"] == checkpoint_uri(s3_store, paths, version)
        assert m.params["checkpoint_version"] == str(version)
        # no weights copied: MLflow holds only the model's description
        assert [a.path for a in client.list_logged_model_artifacts(m.model_id)] == ["MLmodel"]
    assert models["checkpoint-2"].params["eval/accuracy"] == "0.75"
    outputs = client.get_run(tracking["mlflow_run_id"]).outputs.model_outputs
    assert sorted((o.model_id, o.step) for o in outputs) == sorted(
        (models[f"checkpoint-{v}"].model_id, v) for v in (2, 4))
    (mv,) = client.search_model_versions("name='arith'")
    assert mv.source == reg["source"] and mv.run_id == tracking["mlflow_run_id"]

    # a retried finalize logs and registers nothing twice
    again = publish_models(s3_store, paths, tracking, "arith", by_reference=True, deadline_s=30)
    assert again["registered_model"] == reg and len(client.search_logged_models([experiment])) == 2
    assert len(client.search_model_versions("name='arith'")) == 1
    # a resumed run: its new, better checkpoint is logged and registered as the next version
    _save(s3_store, paths, 6, _trained(start_folder, 5)[1], start_folder)
    _eval_point(s3_store, paths, 6, 0.875)
    resumed = publish_models(s3_store, paths, tracking, "arith", by_reference=True, deadline_s=30)
    assert resumed["models_logged"] == [2, 4, 6] and len(client.search_logged_models([experiment])) == 3
    assert (resumed["registered_model"]["version"], resumed["registered_model"]["checkpoint_version"]) == ("2", 6)


def test_mlflow_down_records_what_was_not_logged_and_a_later_call_logs_it(
        s3_store, start_folder, tmp_path, bounded_mlflow_env):
    paths = RunPaths("runs", "down")
    client, experiment, tracking = _mlflow_run(tmp_path)
    _save(s3_store, paths, 3, _trained(start_folder, 6)[1], start_folder)
    with socket.socket() as s:  # nobody listens there
        s.bind(("127.0.0.1", 0))
        down = {**tracking, "tracking_uri": f"http://127.0.0.1:{s.getsockname()[1]}"}
    out = publish_models(s3_store, paths, down, "arith", by_reference=True, deadline_s=2)
    assert out["models_logged"] == [] and out["models_not_logged"] == [3] and out["models_error"]
    assert "registered_model" not in out
    assert s3_store.get_json(paths.file(NOT_LOGGED))["versions"] == [3]
    back = publish_models(s3_store, paths, tracking, "arith", by_reference=True, deadline_s=30)
    assert back["models_logged"] == [3] and back["registered_model"]["reason"] == "last"
    assert back["registered_model"]["eval_accuracy"] is None
    assert not s3_store.exists(paths.file(NOT_LOGGED))
    assert [m.name for m in client.search_logged_models([experiment])] == ["checkpoint-3"]


def _down(tracking: dict[str, str]) -> dict[str, str]:
    """The same MLflow run behind a port nobody listens on."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return {**tracking, "tracking_uri": f"http://127.0.0.1:{s.getsockname()[1]}"}


@pytest.mark.parametrize("mode", ["cluster", "embedded"])
def test_mlflow_down_at_the_end_then_tracking_replay_logs_and_registers_the_models(
        s3_store, start_folder, tmp_path, bounded_mlflow_env, mode):
    """The run's end (finalize, or the embedded launcher) finds MLflow down; `asyncrl tracking replay` (a real
    process) later logs the checkpoints by reference (cluster) or as artifacts (embedded) and registers the choice.
    Cluster: tracking.json records the mode; embedded: a run recorded before that, known by models/published.json."""
    paths = RunPaths("runs", f"replay-{mode}")
    client, experiment, tracking = _mlflow_run(tmp_path)
    cfg = load_config(None, ["name=replayed", "tracking.registered_model=arith-replay"])
    s3_store.put_json(paths.config(), cfg.model_dump(mode="json"))
    s3_store.put_json(paths.tracking(), {**tracking, "mode": "cluster"} if mode == "cluster" else tracking)
    for version, seed in ((2, 8), (4, 9)):
        _save(s3_store, paths, version, _trained(start_folder, seed)[1], start_folder)
    _eval_point(s3_store, paths, 4, 0.625)
    if mode == "cluster":  # finalize: its outcome in final_status.json
        end = publish_models(s3_store, paths, _down(tracking), "arith-replay", by_reference=True, deadline_s=2)
        s3_store.put_json(paths.file("final_status.json"), {"status": "SUCCEEDED", **end})
    else:
        end = publish_embedded_models(s3_store, paths, _down(tracking)["tracking_uri"], tracking["mlflow_run_id"],
                                      "arith-replay", deadline_s=2)
    assert end["models_not_logged"] == [2, 4] and "registered_model" not in end
    assert s3_store.get_json(paths.file(NOT_LOGGED))["versions"] == [2, 4]

    env = {**os.environ, "AWS_ENDPOINT_URL": s3_store.endpoint_url}
    r = subprocess.run([sys.executable, "-m", "asyncrl.cli", "tracking", "replay", "--run-url",
                        run_url(s3_store.bucket, paths.prefix, paths.run_id), "--deadline-s", "30"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr[-3000:]
    out = json.loads(r.stdout.splitlines()[-1])
    assert out["models"] == ("reference" if mode == "cluster" else "artifacts")
    assert out["models_logged"] == [2, 4] and out["models_not_logged"] == [] and "models_error" not in out
    reg = out["registered_model"]
    assert (reg["name"], reg["version"], reg["checkpoint_version"], reg["reason"]) == ("arith-replay", "1", 4,
                                                                                       "best_eval")
    assert s3_store.get_json(paths.file(REGISTERED)) == reg and not s3_store.exists(paths.file(NOT_LOGGED))
    models = {m.name: m for m in client.search_logged_models([experiment])}
    assert sorted(models) == ["checkpoint-2", "checkpoint-4"]
    artifacts = {a.path for a in client.list_logged_model_artifacts(models["checkpoint-4"].model_id)}
    if mode == "cluster":
        assert artifacts == {"MLmodel"} and models["checkpoint-4"].tags["mlflow.model.isExternal"] == "true"
        assert reg["source"] == checkpoint_uri(s3_store, paths, 4)
        status = s3_store.get_json(paths.file("final_status.json"))
        assert status["status"] == "SUCCEEDED" and status["registered_model"] == reg
        assert status["models_not_logged"] == [] and "models_error" not in status
    else:
        assert {"MLmodel", "model.safetensors", "config.json"} <= artifacts
        assert reg["source"] == models["checkpoint-4"].artifact_location
        assert s3_store.get_json(paths.file(PUBLISHED))["registered_model"] == reg
    (mv,) = client.search_model_versions("name='arith-replay'")
    assert mv.run_id == tracking["mlflow_run_id"]


def test_embedded_mode_copies_the_folder_and_the_registered_version_loads_with_transformers(
        s3_store, start_folder, tmp_path, bounded_mlflow_env, monkeypatch):
    paths = RunPaths("runs", "embedded")
    client, experiment, tracking = _mlflow_run(tmp_path)
    model, state = _trained(start_folder, seed=7)
    _save(s3_store, paths, 5, state, start_folder)
    out = publish_models(s3_store, paths, tracking, "arith-embedded", by_reference=False, deadline_s=30)
    reg = out["registered_model"]
    (logged,) = client.search_logged_models([experiment])
    assert reg["model_uri"] == "models:/arith-embedded/1" and reg["source"] == logged.artifact_location
    assert "mlflow.model.isExternal" not in logged.tags
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", tracking["tracking_uri"])  # models:/<name>/<version>: the registry
    folder = Path(mlflow.artifacts.download_artifacts(reg["model_uri"], dst_path=str(tmp_path / "dl"),
                                                      tracking_uri=tracking["tracking_uri"]))
    assert not (folder / "optimizer.safetensors").exists() and (folder / "MLmodel").is_file()
    loaded = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
    assert torch.equal(_logits(loaded), _logits(model))
