"""Which task prompts fit in the generation context: a prompt longer than `generation.max_model_len -
rollout.max_new_tokens` tokens could never be answered in full (`/generate` refuses it with a 400), so an environment
writer leaves it out of its prompt stream and counts it, and a task where no prompt fits is a configuration error.

A prompt's length is that of the ids the model gets (`asyncrl.models.prompts.PromptFormat`): chat-rendered prompts
are counted with their template's tokens."""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any, TypeVar

from asyncrl.config import RunConfig
from asyncrl.models.prompts import PromptFormat, prompt_format

log = logging.getLogger(__name__)
P = TypeVar("P")


def describe(fmt: PromptFormat) -> str:
    """How prompts are counted, for messages: " once chat-rendered", or nothing for raw prompts."""
    return " once chat-rendered" if fmt.format == "chat" else ""


def prompts_that_fit(cfg: RunConfig, tokenizer: Any, problems: Sequence[P]) -> tuple[list[P], int]:
    """(the problems whose prompt fits, how many were left out), in order; ValueError when none fits. `Problem.index`
    is kept, so a resumed writer's prompt stream lines up with the first attempt's."""
    fmt = prompt_format(cfg, tokenizer)
    limit = cfg.generation.max_model_len - cfg.rollout.max_new_tokens
    lengths = [len(fmt.ids(p.prompt)) for p in problems]  # type: ignore[attr-defined]
    fits = [p for p, n in zip(problems, lengths, strict=True) if n <= limit]
    skipped = len(problems) - len(fits)
    if not fits:
        raise ValueError(f"task {cfg.task.name}: no train prompt fits in generation.max_model_len - "
                         f"rollout.max_new_tokens = {limit} tokens{describe(fmt)} (of {len(problems)} prompts; "
                         f"the shortest has {min(lengths, default=0)})")
    if skipped:
        log.warning("%d of %d train prompts are longer than generation.max_model_len - rollout.max_new_tokens = %d "
                    "tokens%s: skipped", skipped, len(problems), limit, describe(fmt))
    return fits, skipped
