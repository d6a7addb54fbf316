"""Which task prompts fit in the generation context: a prompt longer than `generation.max_model_len -
rollout.max_new_tokens` tokens could never be answered in full (`/generate` refuses it with a 400), so an environment
writer leaves it out of its prompt stream and counts it, and a task where no prompt fits is a configuration error."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from asyncrl.config import RunConfig
from asyncrl.models.tokenizer import encode_prompt

log = logging.getLogger(__name__)
P = TypeVar("P")


def prompts_that_fit(cfg: RunConfig, tokenizer: Any, problems: Sequence[P]) -> tuple[list[P], int]:
    """(the problems whose prompt fits, how many were left out), in order; ValueError when none fits. `Problem.index`
    is kept, so a resumed writer's prompt stream lines up with the first attempt's."""
    limit = cfg.generation.max_model_len - cfg.rollout.max_new_tokens
    fits = [p for p in problems if len(encode_prompt(tokenizer, p.prompt)) <= limit]  # type: ignore[attr-defined]
    skipped = len(problems) - len(fits)
    if not fits:
        raise ValueError(f"task {cfg.task.name}: no train prompt fits in generation.max_model_len - "
                         f"rollout.max_new_tokens = {limit} tokens (of {len(problems)} prompts)")
    if skipped:
        log.warning("%d of %d train prompts are longer than generation.max_model_len - rollout.max_new_tokens = %d "
                    "tokens: skipped", skipped, len(problems), limit)
    return fits, skipped
