"""Per-sample workload shaping and rollout rates. Pure, no I/O.

- `decode_budget`: the decode length of one sample under `rollout.length_tail` (a lognormal draw, deterministic
  for a seed, clipped to [1, max_tokens]).
- `loss_mask_to_first_eos`: 1 on the response up to and including its first EOS, 0 after it (the padding a
  length-shaped request decodes past its answer is paid for but never trained on).
- `server_rates`: busy fraction and tokens/s of each generation server between two `/health` snapshots.
"""

from __future__ import annotations

import math
import random
from collections.abc import Mapping, Sequence
from typing import Any


def decode_budget(seed: int, median_tokens: int, sigma: float, max_tokens: int) -> int:
    """A lognormal draw with the given median and sigma, rounded, clipped to [1, max_tokens]."""
    if median_tokens < 1 or max_tokens < 1 or sigma < 0:
        raise ValueError(f"decode_budget: expected median >= 1, max >= 1, sigma >= 0, got {median_tokens}, "
                         f"{max_tokens}, {sigma}")
    draw = random.Random(seed).lognormvariate(math.log(median_tokens), sigma) if sigma > 0 else median_tokens
    return max(1, min(max_tokens, round(draw)))


def loss_mask_to_first_eos(token_ids: Sequence[int], eos_id: int) -> list[int]:
    """1 up to and including the first `eos_id`, 0 after; all ones if there is no EOS."""
    try:
        cut = list(token_ids).index(eos_id) + 1
    except ValueError:
        cut = len(token_ids)
    return [1] * cut + [0] * (len(token_ids) - cut)


def server_rates(before: Sequence[Mapping[str, Any]], after: Sequence[Mapping[str, Any]]) -> list[dict[str, float]]:
    """Per server, from two `/health` snapshots (cumulative `busy_s`, `uptime_s`, `tokens_generated`):
    `busy_fraction` = Δbusy / Δuptime and `tokens_per_s` = Δtokens / Δuptime; empty dict when a field is missing
    or the server restarted (its counters went back)."""
    out: list[dict[str, float]] = []
    for b, a in zip(before, after, strict=True):
        try:
            dt = float(a["uptime_s"]) - float(b["uptime_s"])
            d_busy = float(a["busy_s"]) - float(b["busy_s"])
            d_tok = float(a["tokens_generated"]) - float(b["tokens_generated"])
        except (KeyError, TypeError, ValueError):
            out.append({})
            continue
        if dt <= 0 or d_busy < 0 or d_tok < 0:
            out.append({})
            continue
        out.append({"busy_fraction": min(1.0, d_busy / dt), "tokens_per_s": d_tok / dt})
    return out
