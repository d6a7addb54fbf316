"""Overlong handling of single-turn samples (docs/algorithms.md §7, "Overlong"): pure, no I/O.

A sample is *truncated* when it stopped on its token budget without an end token: its finish reason is "length"
(`is_truncated`). `rollout.overlong` decides what happens to it, before the scheduler sees its reward:
- `keep`: nothing (the sample trains as it is);
- `mask`: a truncated sample's loss mask is all 0, so it teaches nothing; it keeps its reward and still counts in
  its group's reward statistics (the GRPO mean and std of the other samples);
- `soft_penalty` (DAPO): every sample's reward gets `soft_penalty(|y|, L_max, L_c)` added, from its response
  length |y| alone (truncated or not), with L_max = `rollout.max_new_tokens` and the cache L_c =
  `rollout.overlong_cache_tokens` (default L_max // 4, `cache_tokens`):
  `0` if |y| ≤ L_max − L_c, `((L_max − L_c) − |y|) / L_c` if L_max − L_c < |y| ≤ L_max.
  The scheduler, dynamic filtering and the trainer all see the shaped reward.

Invariants: `keep` changes nothing; `mask` changes only the loss mask of truncated samples; `soft_penalty` changes
only the reward, by a value in [−1, 0], and never the reward of a sample of at most L_max − L_c tokens.
The multi-turn (agentic) path does not apply these: an episode's length is spread over turns and observations.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from asyncrl.types import Sample

__all__ = ["LENGTH", "Overlong", "OverlongOutcome", "OverlongShaper", "apply_overlong", "cache_tokens", "is_truncated",
           "soft_penalty"]

Overlong = Literal["keep", "mask", "soft_penalty"]
LENGTH = "length"  # the finish reason of a request that stopped on its token budget


def is_truncated(finish_reason: str) -> bool:
    """The sample stopped on its token budget without an end token."""
    return finish_reason == LENGTH


def cache_tokens(max_new_tokens: int, configured: int | None) -> int:
    """L_c: `configured` (rollout.overlong_cache_tokens), or max_new_tokens // 4 when it is None."""
    return max_new_tokens // 4 if configured is None else configured


def soft_penalty(length: int, max_tokens: int, cache: int) -> float:
    """DAPO's soft overlong penalty of a response of `length` tokens, L_max = `max_tokens`, L_c = `cache`:
    0 up to L_max − L_c, then falling linearly to −1 at L_max."""
    if not 1 <= cache < max_tokens:
        raise ValueError(f"rollout.overlong_cache_tokens: expected 1 <= L_c < max_new_tokens ({max_tokens}), "
                         f"got {cache}")
    if not 0 <= length <= max_tokens:
        raise ValueError(f"soft_penalty: expected a response length in 0..{max_tokens} (max_new_tokens), got {length}")
    start = max_tokens - cache
    return 0.0 if length <= start else (start - length) / cache


@dataclass(frozen=True)
class OverlongOutcome:
    """What `apply_overlong` made of one sample: its reward and loss mask, and what it did."""

    reward: float
    loss_mask: list[int] | None
    truncated: bool
    masked: bool  # mask mode set the loss mask to all 0
    penalty: float  # added to the reward (soft_penalty mode; 0 otherwise)


def apply_overlong(mode: Overlong, reward: float, length: int, finish_reason: str, loss_mask: list[int] | None,
                   max_new_tokens: int, cache: int) -> OverlongOutcome:
    """The reward and loss mask of a sample of `length` response tokens under `mode` (module docstring);
    `loss_mask` None means all ones, as in `Sample`."""
    truncated = is_truncated(finish_reason)
    if mode == "keep":
        return OverlongOutcome(reward, loss_mask, truncated, False, 0.0)
    if mode == "mask":
        if truncated:
            return OverlongOutcome(reward, [0] * length, True, True, 0.0)
        return OverlongOutcome(reward, loss_mask, False, False, 0.0)
    if mode == "soft_penalty":
        penalty = soft_penalty(length, max_new_tokens, cache)
        return OverlongOutcome(reward + penalty, loss_mask, truncated, False, penalty)
    raise ValueError(f"rollout.overlong: expected 'keep', 'mask' or 'soft_penalty', got {mode!r}")


class OverlongShaper:
    """`rollout.overlong` for one environment writer: applies `apply_overlong` to each scored sample, in place, and
    counts what it did (the writer's rollout metrics)."""

    def __init__(self, mode: Overlong, max_new_tokens: int, cache_tokens_configured: int | None) -> None:
        self.mode, self.max_new_tokens = mode, max_new_tokens
        self.cache = cache_tokens(max_new_tokens, cache_tokens_configured)
        self.truncated = self.masked = self.penalized = 0

    def apply(self, sample: Sample) -> float:
        """Set `sample`'s reward and loss mask by the mode; its (shaped) reward."""
        out = apply_overlong(self.mode, sample.reward, len(sample.token_ids), sample.finish_reason, sample.loss_mask,
                             self.max_new_tokens, self.cache)
        sample.reward, sample.loss_mask = out.reward, out.loss_mask
        self.truncated += out.truncated
        self.masked += out.masked
        self.penalized += out.penalty != 0.0
        return out.reward

    def metrics(self) -> dict[str, float]:
        """Counters since the writer started: scored samples that were truncated, masked, given a penalty."""
        return {"rollout/truncated_samples": float(self.truncated),
                "rollout/overlong_masked_samples": float(self.masked),
                "rollout/overlong_penalized_samples": float(self.penalized)}
