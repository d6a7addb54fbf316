"""The engine-trainer gap of a batch and a clip metric that can be non-zero (docs/algorithms.md §7). Pure torch.

With one optimizer step per batch the PPO ratio `r = exp(logp − prox)` is 1 on every token and `clip_fraction`
is 0 by construction (it moves only with mini-batch updates: `training.mini_batches`, `training.epochs`). What
does move is the behaviour importance weight `w = exp(prox − behav)` between the trainer's log-probs at the
step's start and the engine's, so per step, over the trained tokens (mask 1):
- `behav_clip_fraction`: the share of tokens whose w lies outside [1 − clip_low, 1 + clip_high] (the loss's clip
  parameters when it has them, else 0.2 / 0.2: `clip_bounds`);
- `gap_abs = mean |prox − behav|`;
- `gap_k3 = mean (exp(prox − behav) − 1 − (prox − behav))`, the k3 estimate of KL(π_behav ‖ π_prox) from the
  engine's samples (≥ 0 per token).
Each is a mean over this call's trained tokens, so `merge_metrics` (token-weighted) keeps it exact over micro batches
and ranks. Whatever masked positions hold never enters.
"""

from __future__ import annotations

import torch
from torch import Tensor

__all__ = ["DEFAULT_CLIP", "behaviour_gap", "clip_bounds"]

DEFAULT_CLIP = 0.2  # the bounds' ε for a loss without clip parameters


def clip_bounds(loss_params: object) -> tuple[float, float]:
    """(clip_low, clip_high) of a loss's parameters when it has them, else (0.2, 0.2)."""
    low = getattr(loss_params, "clip_low", DEFAULT_CLIP)
    high = getattr(loss_params, "clip_high", DEFAULT_CLIP)
    return float(low), float(high)


@torch.no_grad()
def behaviour_gap(prox: Tensor, behav: Tensor, mask: Tensor, clip_low: float, clip_high: float) -> dict[str, float]:
    """`behav_clip_fraction`, `gap_abs` and `gap_k3` over the tokens where `mask` is 1 (module docstring); all 0 when
    there is none. All tensors [S, T]."""
    for name, t in (("behav", behav), ("mask", mask)):
        if t.shape != prox.shape:
            raise ValueError(f"behaviour_gap: {name} expected shape {tuple(prox.shape)}, got {tuple(t.shape)}")
    m = mask.bool()
    n = int(m.sum())
    if n == 0:
        return {"behav_clip_fraction": 0.0, "gap_abs": 0.0, "gap_k3": 0.0}
    d = (prox.detach() - behav.detach())[m].double()
    w = torch.exp(d)
    outside = (w < 1.0 - clip_low) | (w > 1.0 + clip_high)
    return {
        "behav_clip_fraction": float(outside.sum()) / n,
        "gap_abs": float(d.abs().sum()) / n,
        "gap_k3": float((w - 1.0 - d).sum()) / n,
    }
