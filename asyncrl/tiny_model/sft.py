"""Supervised warm start of the tiny model on the task's train split (plain torch AdamW on CPU).

Owns the SFT batches, the loss and the early-stopping loop.

Invariants:
- a training sequence is encode_prompt(prompt) + answer characters + <eos>; the loss is the mean
  token cross-entropy over the answer tokens and the <eos> only (never the prompt or padding);
- batches are drawn with a torch.Generator seeded from TinyModelConfig.seed, so a build is
  reproducible for a given config on a given machine;
- the learning rate warms up linearly, then follows a cosine from sft_lr to sft_lr/10 over sft_steps;
- greedy accuracy on the eval subset is measured every `eval_every` steps and after the last step;
  training stops at the first measurement >= sft_target_accuracy, or after sft_steps steps.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from asyncrl.config.schema import TinyModelConfig
from asyncrl.models.tokenizer import encode_prompt, encode_response
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tiny_model.evaluate import evaluate_accuracy

log = logging.getLogger(__name__)

IGNORE = -100


@dataclass
class SftResult:
    steps: int
    final_loss: float
    accuracy: float
    seconds: float
    reached_target: bool
    history: list[dict[str, float]] = field(default_factory=list)


def encode_examples(
    tok: PreTrainedTokenizerFast, problems: Sequence[Problem]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, labels) for all problems; labels are IGNORE except answer + eos."""
    seqs: list[list[int]] = []
    labels: list[list[int]] = []
    for p in problems:
        prompt = encode_prompt(tok, p.prompt)
        target = encode_response(tok, p.answer)
        seqs.append(prompt + target)
        labels.append([IGNORE] * len(prompt) + target)
    width = max(len(s) for s in seqs)
    pad = int(tok.pad_token_id)
    ids = torch.full((len(seqs), width), pad, dtype=torch.long)
    lab = torch.full((len(seqs), width), IGNORE, dtype=torch.long)
    for i, (s, label) in enumerate(zip(seqs, labels, strict=True)):
        ids[i, : len(s)] = torch.tensor(s)
        lab[i, : len(label)] = torch.tensor(label)
    return ids, lab


def sft_loss(model: PreTrainedModel, ids: torch.Tensor, labels: torch.Tensor, pad_id: int) -> torch.Tensor:
    """Mean next-token cross-entropy over the labelled (answer + eos) positions."""
    mask = (ids != pad_id).long()
    logits = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    return torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, logits.size(-1)).float(), labels[:, 1:].reshape(-1), ignore_index=IGNORE
    )


def lr_at(step: int, total: int, base_lr: float) -> float:
    """Linear warmup over min(50, total // 10) steps, then cosine from base_lr to base_lr / 10."""
    warmup = max(1, min(50, total // 10))
    if step < warmup:
        return base_lr * (step + 1) / warmup
    progress = min(1.0, (step - warmup) / max(1, total - warmup))
    return base_lr * (0.1 + 0.9 * 0.5 * (1.0 + math.cos(math.pi * progress)))


def sft_step(model: PreTrainedModel, opt: torch.optim.Optimizer, gen: torch.Generator, ids: torch.Tensor,
             labels: torch.Tensor, pad: int, step: int, cfg: TinyModelConfig) -> float:
    """One supervised step (1-based `step` of `cfg.sft_steps`) on a batch of rows drawn with `gen`, padding cut to the
    batch's longest row, gradient clipped at 1; returns the loss. Shared by the single-turn and multi-turn builds."""
    for group in opt.param_groups:
        group["lr"] = lr_at(step - 1, cfg.sft_steps, cfg.sft_lr)
    rows = torch.randint(0, ids.size(0), (cfg.sft_batch_size,), generator=gen)
    batch_ids, batch_labels = ids[rows], labels[rows]
    width = int((batch_ids != pad).sum(1).max())
    loss = sft_loss(model, batch_ids[:, :width], batch_labels[:, :width], pad)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
    opt.step()
    return float(loss.detach())


def run_sft(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerFast,
    train: Sequence[Problem],
    eval_problems: Sequence[Problem],
    cfg: TinyModelConfig,
    max_new_tokens: int,
    eval_every: int = 25,
) -> SftResult:
    """Train in place until greedy eval accuracy >= cfg.sft_target_accuracy or cfg.sft_steps steps."""
    if not train:
        raise ValueError("train: expected at least one training problem")
    started = time.monotonic()
    ids, labels = encode_examples(tok, train)

    def evaluate(m: PreTrainedModel) -> float:
        return evaluate_accuracy(m, tok, eval_problems, max_new_tokens).accuracy

    return sft_loop(model, ids, labels, int(tok.pad_token_id), cfg, evaluate, "accuracy", started, eval_every)


def sft_loop(model: PreTrainedModel, ids: torch.Tensor, labels: torch.Tensor, pad: int, cfg: TinyModelConfig,
             evaluate: Callable[[PreTrainedModel], float], metric: str, started: float, eval_every: int = 25) -> SftResult:
    """Train in place (`sft_step`) until `evaluate(model)` (greedy dev accuracy, or success rate, in [0, 1]) reaches
    cfg.sft_target_accuracy, checked every `eval_every` steps and at the last, or cfg.sft_steps steps were taken.
    The history records `metric` under that name; the result's `accuracy` is the last figure."""
    gen = torch.Generator().manual_seed(cfg.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.sft_lr, weight_decay=0.0, betas=(0.9, 0.98))
    history: list[dict[str, float]] = []
    figure, loss_value, step = 0.0, float("nan"), 0
    model.train()
    if cfg.sft_steps == 0:
        figure = float(evaluate(model))
    for step in range(1, cfg.sft_steps + 1):
        loss_value = sft_step(model, opt, gen, ids, labels, pad, step, cfg)
        if step % eval_every == 0 or step == cfg.sft_steps:
            figure = float(evaluate(model))
            elapsed = time.monotonic() - started
            history.append({"step": step, "loss": loss_value, metric: figure, "seconds": elapsed})
            log.info("sft step %d/%d loss %.4f dev %s %.3f (%.1fs)", step, cfg.sft_steps, loss_value, metric, figure,
                     elapsed)
            if figure >= cfg.sft_target_accuracy:
                break
    model.eval()
    return SftResult(steps=step, final_loss=loss_value, accuracy=figure, seconds=time.monotonic() - started,
                     reached_target=figure >= cfg.sft_target_accuracy, history=history)
