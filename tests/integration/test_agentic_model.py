"""Build the agentic tiny model for real (text tokenizer, chat template, short multi-turn SFT on FrozenLake demos)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config.schema import RunConfig
from asyncrl.models.tokenizer import chat_ids, load_tokenizer
from asyncrl.tiny_model.build import (
    BUILD_INFO,
    SFT_DEV_LEVELS,
    TEXT_MAX_POSITIONS,
    build_tiny_model,
    tiny_model_dir,
)
from asyncrl.tiny_model.demonstrations import DEV_SEED_BASE, collect_demonstrations
from asyncrl.tiny_model.sft_agentic import evaluate_success

pytestmark = pytest.mark.integration

PARAMS = {"size": 4, "instructions": False}
SFT_STEPS = 50


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[RunConfig, Path]:
    cfg = RunConfig.model_validate({
        "cache_dir": str(tmp_path_factory.mktemp("cache")),
        "env": {"name": "frozenlake", "params": PARAMS, "max_turns": 8, "demonstrations": 16},
        "rollout": {"max_new_tokens": 8},
        "model": {"tiny": {"sft_steps": SFT_STEPS, "sft_batch_size": 16, "sft_target_accuracy": 0.99}},
    })
    return cfg, build_tiny_model(cfg)


def test_folder_loads_with_chat_template(built: tuple[RunConfig, Path]) -> None:
    cfg, path = built
    assert path == tiny_model_dir(cfg) and [p.name for p in path.parent.iterdir()] == [path.name]
    conf = json.loads((path / "config.json").read_text())
    assert conf["vocab_size"] == 104 and conf["max_position_embeddings"] == TEXT_MAX_POSITIONS
    assert (conf["bos_token_id"], conf["eos_token_id"], conf["pad_token_id"]) == (1, 2, 0)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    assert type(model).__name__ == "Qwen2ForCausalLM"
    prompt = chat_ids(tok, [{"role": "user", "content": "P...\n....\n....\n...G"}], add_generation_prompt=True)
    assert prompt[:2] == [1, 101] and prompt[-1] == 102 and len(prompt) == 22
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([prompt])).logits
    assert logits.shape == (1, 22, 104) and bool(torch.isfinite(logits).all())


def test_build_info_records_dev_success(built: tuple[RunConfig, Path]) -> None:
    cfg, path = built
    info = json.loads((path / BUILD_INFO).read_text())
    assert info["inputs"]["env"]["params"] == PARAMS and "task" not in info["inputs"]
    assert info["demonstrations"] == 16 and info["dev_levels"] == SFT_DEV_LEVELS
    assert info["sft_steps"] == SFT_STEPS and info["reached_target"] is False
    assert [h["step"] for h in info["history"]] == [25, 50]
    rate = info["dev_success_rate"]
    assert 0.0 <= rate <= 1.0 and rate == info["dev_accuracy"] == info["history"][-1]["success_rate"]
    assert info["history"][-1]["loss"] < info["history"][0]["loss"]
    # the recorded rate is the greedy success of the saved model on the dev levels (decoding is deterministic)
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    dev = [DEV_SEED_BASE + i for i in range(SFT_DEV_LEVELS)]
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # as in the build: the same reduction order, so the same argmaxes
    try:
        result = evaluate_success(model, tok, "frozenlake", PARAMS, dev, 8, cfg.rollout.max_new_tokens,
                                  TEXT_MAX_POSITIONS)
    finally:
        torch.set_num_threads(threads)
    assert result.success_rate == pytest.approx(rate)
    assert result.num_levels == SFT_DEV_LEVELS and 1 <= result.mean_turns <= 8
    replies = [m["content"] for t in result.transcripts for m in t if m["role"] == "assistant"]
    assert sum(r in ("left", "down", "right", "up") for r in replies) > 0.9 * len(replies)  # learned the format


def test_demonstrations_are_learned(built: tuple[RunConfig, Path]) -> None:
    """Greedy decoding of the trained demonstrations reproduces most of their actions (teacher-forced)."""
    _, path = built
    tok = load_tokenizer(path)
    model = AutoModelForCausalLM.from_pretrained(str(path))
    demos = collect_demonstrations("frozenlake", PARAMS, 16, max_turns=8)
    hits = total = 0
    for demo in demos:
        for k, message in enumerate(demo):
            if message["role"] != "assistant":
                continue
            prompt = chat_ids(tok, demo[:k], add_generation_prompt=True)
            with torch.no_grad():
                first = int(model(input_ids=torch.tensor([prompt])).logits[0, -1].argmax())
            hits += int(tok.convert_ids_to_tokens(first) == message["content"][0])
            total += 1
    assert hits / total > 0.7, (hits, total)
