"""Greedy evaluation of a Hugging Face causal LM on task problems (used by the SFT warm start).

Owns batched greedy decoding with the HF model (no vLLM) and the accuracy it gives.

Invariants:
- prompts are left-padded with the pad id; attention masks hide the padding and position ids count
  only real tokens, so a prompt decodes to the same tokens alone or in any batch;
- decoding of a row stops at its first <eos> or after `max_new_tokens` tokens; the returned ids
  include that <eos> if one was produced and nothing after it;
- accuracy is the mean of `asyncrl.rewards.verifier.score` over the problems (0.0 for no problem).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerFast

from asyncrl.models.tokenizer import decode_response, encode_prompt
from asyncrl.rewards.verifier import score
from asyncrl.tasks.arithmetic import Problem

log = logging.getLogger(__name__)


@dataclass
class EvalResult:
    accuracy: float
    num_correct: int
    num_problems: int
    responses: list[str] = field(default_factory=list)


@torch.no_grad()
def greedy_generate(
    model: PreTrainedModel,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_id: int,
    pad_id: int,
) -> list[list[int]]:
    """Greedy continuations of token-id prompts (one list per prompt, eos included when produced)."""
    if not prompts:
        return []
    if any(len(p) == 0 for p in prompts):
        raise ValueError("prompts: expected non-empty token id lists")
    device = next(model.parameters()).device
    width = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), width), pad_id, dtype=torch.long, device=device)
    mask = torch.zeros_like(ids)
    for row, p in enumerate(prompts):
        ids[row, width - len(p) :] = torch.tensor(list(p), dtype=torch.long)
        mask[row, width - len(p) :] = 1
    done = torch.zeros(len(prompts), dtype=torch.bool, device=device)
    out: list[list[int]] = [[] for _ in prompts]
    for _ in range(max_new_tokens):
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = model(input_ids=ids, attention_mask=mask, position_ids=positions, use_cache=False).logits
        nxt = logits[:, -1, :].argmax(-1)
        for row in torch.nonzero(~done).flatten().tolist():
            out[row].append(int(nxt[row]))
        nxt = torch.where(done, torch.full_like(nxt, pad_id), nxt)
        ids = torch.cat([ids, nxt[:, None]], dim=1)
        mask = torch.cat([mask, (~done).long()[:, None]], dim=1)
        done |= nxt == eos_id
        if bool(done.all()):
            break
    return out


def evaluate_accuracy(
    model: PreTrainedModel,
    tok: PreTrainedTokenizerFast,
    problems: Sequence[Problem],
    max_new_tokens: int,
    batch_size: int = 256,
    task: str = "arithmetic",
) -> EvalResult:
    """Greedy accuracy of the model on the problems, scored by the task's verifier."""
    was_training = model.training
    model.eval()
    responses: list[str] = []
    correct = 0
    try:
        for start in range(0, len(problems), batch_size):
            chunk = problems[start : start + batch_size]
            prompts = [encode_prompt(tok, p.prompt) for p in chunk]
            gens = greedy_generate(
                model, prompts, max_new_tokens, int(tok.eos_token_id), int(tok.pad_token_id)
            )
            for prob, gen in zip(chunk, gens, strict=True):
                text = decode_response(tok, gen)
                reward, _ = score(task, text, prob.answer)
                correct += int(reward == 1.0)
                responses.append(text)
    finally:
        model.train(was_training)
    n = len(problems)
    return EvalResult(
        accuracy=correct / n if n else 0.0, num_correct=correct, num_problems=n, responses=responses
    )
