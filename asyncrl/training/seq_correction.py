"""The engine-trainer importance correction applied on top of any policy loss (docs/algorithms.md §7). Pure torch.

The engine samples with log-probs `behav`; the trainer's proximal policy gives `prox` to the same tokens. Their gap
(staleness under α > 1, and numeric mismatch between two implementations and precisions) biases the gradient; this
module turns it into one detached weight per token that multiplies the policy loss's ℓ_t:
- `level: token`: `w_t = exp(prox_t − behav_t)`;
- `level: sequence`: `ρ_i = exp(Σ_t (prox − behav))` over sample i's trained tokens, the same for all of them;
- `level: geometric`: `ρ̄_i = exp((1/|y_i|) Σ_t (prox − behav))`, the per-token geometric mean (long answers
  make the product explode or vanish).
- `mode: truncate` (TIS): the weight is `min(ρ, cap)`;
- `mode: mask` (MIS): the weight is `ρ` when `lo ≤ ρ ≤ hi`, else the token (token level) or the whole sample is
  masked: its policy-gradient term, KL term and entropy bonus are 0.

Invariants: the weights carry no gradient; a masked token stays in the aggregation denominators (masking never
rescales the other samples, as a loss's own dropped tokens); ratios are formed in log space and exponentiated only
where they are used, so a sequence whose summed log-ratio is ±1000 gives a finite weight (capped, or masked) and no
nan; positions outside `mask` get weight 0 and never enter a sum, whatever they hold. A sequence (sample i) is a
batch row: each segment of a segmented sample is corrected as its own sequence (`asyncrl.training.segments`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Literal

import torch
from torch import Tensor

__all__ = ["Correction", "correction_weights"]

Level = Literal["token", "sequence", "geometric"]
Mode = Literal["truncate", "mask"]


@dataclass(frozen=True)
class Correction:
    """The per-token weights [S, T] (detached; 0 outside the mask and where masked) and what the correction cut."""

    weight: Tensor
    keep: Tensor  # bool [S, T]: trained tokens the correction did not mask
    capped_tokens: int  # trained tokens whose ratio exceeded the cap (truncate)
    masked_tokens: int  # trained tokens masked (mask mode; all of a masked sample's tokens at sequence level)
    masked_sequences: int  # samples with at least one trained token that lost all of them to the mask
    sequences: int  # samples with at least one trained token
    trained_tokens: int  # tokens in the mask

    def metrics(self, prefix: str = "corr_") -> dict[str, float]:
        """Counts add up over micro batches (`*_count`); the weight's mean is over trained tokens."""
        n = self.trained_tokens
        return {
            f"{prefix}weight_mean": float(self.weight.double().sum()) / n if n else 0.0,
            f"{prefix}capped_tokens_count": float(self.capped_tokens),
            f"{prefix}masked_tokens_count": float(self.masked_tokens),
            f"{prefix}masked_sequences_count": float(self.masked_sequences),
            f"{prefix}sequences_count": float(self.sequences),
        }


def _log_ratio(prox: Tensor, behav: Tensor, m: Tensor, level: Level) -> Tensor:
    """log of the ratio each trained token is weighted by, [S, T] float64 (0 outside `m`)."""
    d = torch.where(m, prox.detach().double() - behav.detach().double(), torch.zeros((), dtype=torch.float64))
    if level == "token":
        return d
    total = d.sum(dim=-1, keepdim=True)
    if level == "geometric":
        total = total / m.sum(dim=-1, keepdim=True).clamp(min=1)
    elif level != "sequence":
        raise ValueError(f"training.seq_correction.level: expected 'token', 'sequence' or 'geometric', got {level!r}")
    return torch.where(m, total.expand_as(d), torch.zeros((), dtype=torch.float64))


@torch.no_grad()
def correction_weights(prox: Tensor, behav: Tensor, mask: Tensor, level: Level, mode: Mode, cap: float = 2.0,
                       band: tuple[float, float] = (0.5, 2.0)) -> Correction:
    """The weights of the correction `(level, mode)` for a batch [S, T] (module docstring); `cap` for truncate,
    `band = (lo, hi)` for mask."""
    for name, t in (("behav", behav), ("mask", mask)):
        if t.shape != prox.shape:
            raise ValueError(f"correction_weights: {name} expected shape {tuple(prox.shape)}, got {tuple(t.shape)}")
    m = mask.bool()
    log_r = _log_ratio(prox, behav, m, level)
    zero = torch.zeros((), dtype=torch.float64)
    if mode == "truncate":
        if not cap > 0:
            raise ValueError(f"training.seq_correction.cap: expected > 0, got {cap}")
        capped = m & (log_r > math.log(cap))
        weight = torch.where(m, torch.exp(torch.clamp(log_r, max=math.log(cap))), zero)
        keep = m
    elif mode == "mask":
        lo, hi = band
        if not 0 <= lo < 1 < hi:
            raise ValueError(f"training.seq_correction.band: expected [lo, hi] with 0 <= lo < 1 < hi, got {list(band)}")
        log_lo = math.log(lo) if lo > 0 else -math.inf
        keep = m & (log_r >= log_lo) & (log_r <= math.log(hi))
        weight = torch.where(keep, torch.exp(torch.clamp(log_r, max=math.log(hi))), zero)
        capped = torch.zeros_like(m)
    else:
        raise ValueError(f"training.seq_correction.mode: expected 'truncate' or 'mask', got {mode!r}")
    has_tokens = m.any(dim=-1)
    masked_rows = has_tokens & ~keep.any(dim=-1)
    return Correction(weight=weight.to(prox.dtype), keep=keep, capped_tokens=int(capped.sum()),
                      masked_tokens=int((m & ~keep).sum()), masked_sequences=int(masked_rows.sum()),
                      sequences=int(has_tokens.sum()), trained_tokens=int(m.sum()))
