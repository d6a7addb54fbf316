"""Multi-turn supervised warm start of the tiny model on solved demonstrations of an agentic environment.

Owns the encoding of a demonstration into (ids, labels), the greedy multi-turn success rate of a HF model on
environment levels (no vLLM), and the SFT loop that stops early on that success rate.

Invariants:
- a training sequence is `chat_ids(tok, demo, add_generation_prompt=False)`; labels are IGNORE everywhere except on
  each assistant message's content tokens and its closing <eos> (never the role tokens, observations, system
  prompt or padding); the generation prompt <|assistant|> of every turn is a prefix of the next render;
- greedy evaluation plays every level with the same chat template: per turn the conversation so far is rendered with
  the generation prompt, up to `max_new_tokens` tokens are decoded greedily (stopping at <eos>), the decoded text is
  the action passed to `env.step`; an episode fails when the env ends it without success, after `max_turns` turns,
  or when the next prompt would not fit `max_positions - max_new_tokens` positions;
- batches are drawn with a torch.Generator seeded from TinyModelConfig.seed (reproducible on one machine); the
  learning rate follows `asyncrl.tiny_model.sft.lr_at`; the success rate is measured every `eval_every` steps and after
  the last step, and training stops at the first measurement >= sft_target_accuracy, or after sft_steps steps.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from asyncrl.config.schema import TinyModelConfig
from asyncrl.envs import make
from asyncrl.models.tokenizer import chat_ids, decode_response
from asyncrl.tiny_model.evaluate import greedy_generate
from asyncrl.tiny_model.sft import IGNORE, SftResult, sft_loop

log = logging.getLogger(__name__)

Message = Mapping[str, str]


def encode_demo(tok: PreTrainedTokenizerFast, messages: Sequence[Message]) -> tuple[list[int], list[int]]:
    """(ids, labels) of one demonstration; labels mark assistant content + <eos> only (see module docstring)."""
    ids = chat_ids(tok, messages, add_generation_prompt=False)
    labels = [IGNORE] * len(ids)
    for k, message in enumerate(messages):
        if message["role"] != "assistant":
            continue
        start = len(chat_ids(tok, messages[:k], add_generation_prompt=True))
        end = len(chat_ids(tok, messages[: k + 1], add_generation_prompt=False))
        if ids[:end] != chat_ids(tok, messages[: k + 1], add_generation_prompt=False) or end <= start:
            raise ValueError(f"chat template: rendering is not incremental at message {k}")
        if ids[end - 1] != int(tok.eos_token_id):
            raise ValueError(f"chat template: assistant message {k} does not end with <eos>")
        labels[start:end] = ids[start:end]
    return ids, labels


def encode_demos(
    tok: PreTrainedTokenizerFast, demos: Sequence[Sequence[Message]], max_positions: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, labels) of all demonstrations; each must fit `max_positions` tokens."""
    seqs = [encode_demo(tok, d) for d in demos]
    if not seqs:
        raise ValueError("demonstrations: expected at least one")
    width = max(len(s) for s, _ in seqs)
    if width > max_positions:
        raise ValueError(f"demonstrations: a demonstration has {width} tokens, more than the model's {max_positions}"
                         " positions (use compact observations, e.g. frozenlake instructions: false)")
    ids = torch.full((len(seqs), width), int(tok.pad_token_id), dtype=torch.long)
    lab = torch.full((len(seqs), width), IGNORE, dtype=torch.long)
    for i, (s, label) in enumerate(seqs):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(label)] = torch.tensor(label)
    return ids, lab


@dataclass
class EpisodeEval:
    success_rate: float
    num_success: int
    num_levels: int
    mean_turns: float
    transcripts: list[list[dict[str, str]]] = field(default_factory=list)


async def _play_levels(model: PreTrainedModel, tok: PreTrainedTokenizerFast, name: str, params: Mapping[str, Any],
                       seeds: Sequence[int], system_prompt: str, max_turns: int, max_new_tokens: int,
                       max_positions: int) -> EpisodeEval:
    envs = [make(name, **dict(params)) for _ in seeds]
    chats: list[list[dict[str, str]]] = []
    for env, seed in zip(envs, seeds, strict=True):
        observation, _ = await env.reset(seed)
        chat = [{"role": "system", "content": system_prompt}] if system_prompt else []
        chats.append([*chat, {"role": "user", "content": observation}])
    active = list(range(len(seeds)))
    success = [False] * len(seeds)
    turns = [0] * len(seeds)
    eos, pad = int(tok.eos_token_id), int(tok.pad_token_id)
    for _ in range(max_turns):
        prompts = {i: chat_ids(tok, chats[i], add_generation_prompt=True) for i in active}
        active = [i for i in active if len(prompts[i]) + max_new_tokens <= max_positions]
        if not active:
            break
        gens = greedy_generate(model, [prompts[i] for i in active], max_new_tokens, eos, pad)
        still: list[int] = []
        for i, gen in zip(active, gens, strict=True):
            reply = decode_response(tok, gen)
            chats[i].append({"role": "assistant", "content": reply})
            turns[i] += 1
            result = await envs[i].step(reply)
            if result.done:
                success[i] = bool(result.info.get("success", False))
            else:
                chats[i].append({"role": "user", "content": result.observation})
                still.append(i)
        active = still
    n = len(seeds)
    wins = sum(success)
    return EpisodeEval(wins / n if n else 0.0, wins, n, sum(turns) / n if n else 0.0, chats)


@torch.no_grad()
def evaluate_success(model: PreTrainedModel, tok: PreTrainedTokenizerFast, name: str, params: Mapping[str, Any],
                     seeds: Sequence[int], max_turns: int, max_new_tokens: int, max_positions: int,
                     system_prompt: str = "") -> EpisodeEval:
    """Greedy multi-turn success rate of the model on the levels `seeds` (see the module docstring)."""
    was_training = model.training
    model.eval()
    try:
        return asyncio.run(_play_levels(model, tok, name, params, seeds, system_prompt, max_turns, max_new_tokens,
                                        max_positions))
    finally:
        model.train(was_training)


def run_agentic_sft(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerFast,
    demos: Sequence[Sequence[Message]],
    evaluate: Callable[[PreTrainedModel], float],
    cfg: TinyModelConfig,
    max_positions: int,
    eval_every: int = 25,
) -> SftResult:
    """Train in place on the demonstrations until `evaluate(model)` (a success rate in [0, 1]) reaches
    cfg.sft_target_accuracy or cfg.sft_steps steps were taken. `accuracy` of the result is that success rate."""
    started = time.monotonic()
    ids, labels = encode_demos(tok, demos, max_positions)
    return sft_loop(model, ids, labels, int(tok.pad_token_id), cfg, evaluate, "success_rate", started, eval_every)
