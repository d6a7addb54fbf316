"""Build the built-in tiny model for real (small SFT) and check the folder, the cache and greedy eval."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
from safetensors import safe_open
from transformers import PreTrainedTokenizerFast, Qwen2ForCausalLM

from asyncrl.config.schema import RunConfig
from asyncrl.models.tokenizer import encode_prompt, load_tokenizer
from asyncrl.tasks.arithmetic import load_split
from asyncrl.tiny_model.build import (
    BUILD_INFO,
    SFT_THREADS,
    build_tiny_model,
    tiny_model_dir,
)
from asyncrl.tiny_model.evaluate import evaluate_accuracy, greedy_generate
from asyncrl.tiny_model.prepare import resolve_model_path

pytestmark = pytest.mark.integration

SFT_STEPS = 150


def _cfg(cache_dir: Path, **tiny: object) -> RunConfig:
    return RunConfig.model_validate(
        {
            "cache_dir": str(cache_dir),
            "task": {"num_train": 1600, "num_eval": 200, "max_operand": 29},
            "model": {"tiny": {"sft_steps": SFT_STEPS, "sft_lr": 2e-3, "sft_target_accuracy": 0.99, **tiny}},
        }
    )


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path, float]:
    cfg = _cfg(tmp_path_factory.mktemp("cache"))
    started = time.monotonic()
    path = build_tiny_model(cfg)
    return cfg, path, time.monotonic() - started


def test_folder_layout_and_config(built: tuple[RunConfig, Path, float]) -> None:
    cfg, path, _ = built
    assert path == tiny_model_dir(cfg) and path.parent == Path(cfg.cache_dir) / "models"
    assert path.name.startswith("tiny-")
    conf = json.loads((path / "config.json").read_text())
    assert conf["model_type"] == "qwen2" and conf["architectures"] == ["Qwen2ForCausalLM"]
    assert conf["head_dim"] == 64 and conf["hidden_size"] // conf["num_attention_heads"] == 64
    assert conf["num_attention_heads"] == conf["num_key_value_heads"] == 2
    assert conf["tie_word_embeddings"] is True and conf["vocab_size"] == 24
    assert conf["max_position_embeddings"] >= cfg.generation.max_model_len
    assert (conf["bos_token_id"], conf["eos_token_id"], conf["pad_token_id"]) == (1, 2, 0)
    with safe_open(str(path / "model.safetensors"), "pt") as f:
        names = set(f.keys())
        assert f.get_tensor("model.embed_tokens.weight").dtype == torch.float32
    assert "model.embed_tokens.weight" in names and "model.layers.1.self_attn.q_proj.weight" in names
    # only the temp-free final folder is left in the cache
    assert [p.name for p in path.parent.iterdir()] == [path.name]


def test_build_info_records_sft(built: tuple[RunConfig, Path, float]) -> None:
    cfg, path, _ = built
    info = json.loads((path / BUILD_INFO).read_text())
    assert info["sft_steps"] == SFT_STEPS and info["reached_target"] is False
    assert (
        info["inputs"]["task"]["max_operand"] == 29
        and info["inputs"]["max_new_tokens"] == cfg.rollout.max_new_tokens
    )
    assert [h["step"] for h in info["history"]] == [25, 50, 75, 100, 125, 150]
    # the untrained model's loss is about ln(24) = 3.18; SFT must have learned something
    assert info["sft_final_loss"] < 2.0
    assert 0.0 <= info["dev_accuracy"] <= 1.0 and info["dev_problems"] == 200


def test_tokenizer_loads_from_folder(built: tuple[RunConfig, Path, float]) -> None:
    _, path, _ = built
    plain = PreTrainedTokenizerFast(tokenizer_file=str(path / "tokenizer.json"))
    tok = load_tokenizer(path)
    assert plain("12+7=", add_special_tokens=False)["input_ids"] == encode_prompt(tok, "12+7=")[1:]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id) == (1, 2, 0)


def test_second_call_is_cached(built: tuple[RunConfig, Path, float]) -> None:
    cfg, path, first_seconds = built
    stamp = (path / "model.safetensors").stat().st_mtime_ns
    started = time.monotonic()
    assert build_tiny_model(cfg) == path
    assert resolve_model_path(cfg) == path
    assert time.monotonic() - started < first_seconds  # no rebuild: the stamp below shows it exactly
    assert (path / "model.safetensors").stat().st_mtime_ns == stamp
    # a different tiny config is a different folder
    assert tiny_model_dir(_cfg(Path(cfg.cache_dir), seed=1)) != path


def test_greedy_eval_of_saved_model_matches_build(built: tuple[RunConfig, Path, float]) -> None:
    cfg, path, _ = built
    model = Qwen2ForCausalLM.from_pretrained(str(path))
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    tok = load_tokenizer(path)
    problems = load_split(cfg.task, "train")[-200:]  # the SFT dev set: the end of the train split
    threads = torch.get_num_threads()
    torch.set_num_threads(SFT_THREADS)  # the build's kernels, so the same float sums and argmaxes
    try:
        result = evaluate_accuracy(model, tok, problems, cfg.rollout.max_new_tokens)
    finally:
        torch.set_num_threads(threads)
    info = json.loads((path / BUILD_INFO).read_text())
    assert result.num_problems == 200 and result.accuracy == info["dev_accuracy"]
    assert any(r for r in result.responses), "SFT should have taught the model to emit digits"
    # left padding is invisible: decoding alone or in a batch of mixed lengths gives the same tokens
    prompts = [encode_prompt(tok, p.prompt) for p in problems[:12]]
    assert len({len(p) for p in prompts}) > 1
    batched = greedy_generate(model, prompts, cfg.rollout.max_new_tokens, 2, 0)
    alone = [greedy_generate(model, [p], cfg.rollout.max_new_tokens, 2, 0)[0] for p in prompts]
    assert batched == alone
    for ids in batched:
        assert 1 <= len(ids) <= cfg.rollout.max_new_tokens
        assert 2 not in ids[:-1]


def test_resolve_model_path_errors(tmp_path: Path) -> None:
    missing = RunConfig.model_validate({"model": {"path": str(tmp_path / "nope")}})
    with pytest.raises(FileNotFoundError, match="model.path"):
        resolve_model_path(missing)
    empty = RunConfig.model_validate({"model": {"path": str(tmp_path)}})
    with pytest.raises(FileNotFoundError, match="config.json"):
        resolve_model_path(empty)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "tokenizer.json").write_text("{}")
    (tmp_path / "model.safetensors").write_bytes(b"")
    assert resolve_model_path(empty) == tmp_path
