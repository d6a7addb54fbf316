"""The per-token terms of the built-in policy losses (docs/algorithms.md §3) and what every token loss returns.

Pure torch, no I/O, no configuration: each function takes its tensors [S, T] and its parameters by their
docs/algorithms.md names and returns a `TokenLoss`: ℓ_t on every position (callers mask and aggregate) with its
diagnostics. `LossInputs` is what a registered loss function receives (`asyncrl.training.loss_registry`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

__all__ = ["LossInputs", "TokenLoss", "cispo_token_loss", "decoupled_ppo_token_loss", "gspo_token_loss",
           "ppo_token_loss", "tis_token_loss", "topr_token_loss"]


@dataclass(frozen=True)
class LossInputs:
    """The per-token tensors a loss function gets, all [S, T], masked positions already zeroed.

    `logp` = log π_θ (carries the gradient); `prox` = log π_prox and `behav` = log π_behav (the engine's
    log-probs), `adv` = the advantage, all detached; `positive` (bool) marks the tokens of samples with reward > 0;
    `mask` (bool) the trained tokens, for losses that reduce over a sample (gspo); None where the caller has none.
    """

    logp: Tensor
    prox: Tensor
    behav: Tensor
    adv: Tensor
    positive: Tensor
    mask: Tensor | None = None


@dataclass
class TokenLoss:
    """A per-token loss with its diagnostics (bool tensors, same shape as the loss)."""

    loss: Tensor
    weight: Tensor  # the raw importance weight of this loss, detached (before any cap)
    clipped: Tensor  # the clip/clamp of this loss changed the token's term
    capped: Tensor  # the importance weight was capped (or clamped)
    dropped: Tensor  # the token was masked out by a loss option

    @classmethod
    def plain(cls, loss: Tensor, weight: Tensor | None = None) -> TokenLoss:
        """A loss without clip, cap or drop; `weight` is its importance weight (ones when it has none)."""
        w = torch.ones_like(loss).detach() if weight is None else weight.detach()
        return cls(loss=loss, weight=w, clipped=_none(loss), capped=_none(loss), dropped=_none(loss))


def _none(x: Tensor) -> Tensor:
    return torch.zeros_like(x, dtype=torch.bool)


def ppo_token_loss(
    logp: Tensor, prox: Tensor, adv: Tensor, clip_low: float, clip_high: float, dual_clip: float | None = None
) -> TokenLoss:
    """`ℓ = −min(r·A, clip(r, 1−ε_lo, 1+ε_hi)·A)`, `r = exp(logp − prox)`.

    Dual clip `c` (None = off): for A < 0, `ℓ = min(ℓ, −c·A)`. `clipped` marks tokens where the clipped
    term is the one taken: (A > 0 and r > 1+ε_hi) or (A < 0 and r < 1−ε_lo), or where the dual clip bit.
    """
    ratio = torch.exp(logp - prox)
    unclipped = -ratio * adv
    clipped_term = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = torch.maximum(unclipped, clipped_term)
    r = ratio.detach()
    clipped = ((adv > 0) & (r > 1.0 + clip_high)) | ((adv < 0) & (r < 1.0 - clip_low))
    if dual_clip is not None:
        bound = -dual_clip * adv
        dual = (adv < 0) & (loss.detach() > bound)
        loss = torch.where(dual, bound, loss)
        clipped = clipped | dual
    return TokenLoss(loss=loss, weight=r, clipped=clipped, capped=_none(r), dropped=_none(r))


def decoupled_ppo_token_loss(
    logp: Tensor,
    prox: Tensor,
    behav: Tensor,
    adv: Tensor,
    clip_low: float,
    clip_high: float,
    w_max: float,
    w_mask: tuple[float, float] | None = None,
    dual_clip: float | None = None,
) -> TokenLoss:
    """`ℓ = −sg(min(w, w_max)) · min(r·A, clip(r, 1−ε_lo, 1+ε_hi)·A)`, `w = exp(prox − behav)`.

    With `w_mask = (lo, hi)` the token is dropped (ℓ = 0) when w is outside [lo, hi], and w is not capped.
    The PPO part is `ppo_token_loss` (dual clip included when set).
    """
    inner = ppo_token_loss(logp, prox, adv, clip_low, clip_high, dual_clip)
    w = torch.exp(prox - behav).detach()
    if w_mask is not None:
        lo, hi = w_mask
        dropped = (w < lo) | (w > hi)
        weight = torch.where(dropped, torch.zeros_like(w), w)
        capped = _none(w)
    else:
        capped = w > w_max
        dropped = _none(w)
        weight = torch.clamp(w, max=w_max)
    return TokenLoss(loss=weight * inner.loss, weight=w, clipped=inner.clipped, capped=capped, dropped=dropped)


def gspo_token_loss(logp: Tensor, prox: Tensor, adv: Tensor, mask: Tensor, clip_low: float,
                    clip_high: float) -> TokenLoss:
    """GSPO in its token form: `s_i = exp((1/|y_i|) Σ_t (logp − prox))` over sample i's trained tokens (`mask`),
    `s_it = sg(s_i) · exp(logp_t − sg(logp_t))` (value s_i, gradient s_i·∇logp_t) and
    `ℓ_t = −min(s_it·A_t, clip(s_it, 1−ε_lo, 1+ε_hi)·A_t)`.

    With one advantage per sample and a per-sample mean of ℓ_t (`seq-mean-token-mean`), the sample's loss is GSPO's
    `−min(s_i·A_i, clip(s_i)·A_i)` and its gradient GSPO's, whatever the sample's length. `clipped` marks the tokens
    of samples whose clipped term is taken; `weight` is s_i. A sample without trained tokens has s_i = 1.
    """
    m = mask.bool()
    d = torch.where(m, logp - prox, torch.zeros_like(logp))
    mean = d.detach().sum(dim=-1, keepdim=True) / m.sum(dim=-1, keepdim=True).clamp(min=1)
    s = torch.exp(mean).expand_as(logp)
    ratio = s * torch.exp(logp - logp.detach())
    unclipped = -ratio * adv
    clipped_term = -torch.clamp(ratio, 1.0 - clip_low, 1.0 + clip_high) * adv
    loss = torch.maximum(unclipped, clipped_term)
    clipped = ((adv > 0) & (s > 1.0 + clip_high)) | ((adv < 0) & (s < 1.0 - clip_low))
    return TokenLoss(loss=loss, weight=s.detach(), clipped=clipped, capped=_none(s), dropped=_none(s))


def tis_token_loss(logp: Tensor, behav: Tensor, adv: Tensor, cap: float) -> TokenLoss:
    """`ℓ = −sg(clamp(exp(logp − behav), 0, c)) · A · logp` (truncated importance sampling)."""
    ratio = torch.exp(logp - behav).detach()
    capped = ratio > cap
    loss = -torch.clamp(ratio, 0.0, cap) * adv * logp
    return TokenLoss(loss=loss, weight=ratio, clipped=capped, capped=capped, dropped=_none(ratio))


def cispo_token_loss(
    logp: Tensor, behav: Tensor, adv: Tensor, eps_low: float, eps_high: float, unified_mask: bool = False
) -> TokenLoss:
    """`ℓ = −sg(clamp(exp(logp − behav), 1−ε_lo, 1+ε_hi)) · A · logp` (CISPO).

    Unified mask: drop the token (ℓ = 0) where (A > 0 and ratio > 1+ε_hi) or (A < 0 and ratio < 1−ε_lo).
    """
    ratio = torch.exp(logp - behav).detach()
    clamped = (ratio > 1.0 + eps_high) | (ratio < 1.0 - eps_low)
    loss = -torch.clamp(ratio, 1.0 - eps_low, 1.0 + eps_high) * adv * logp
    if unified_mask:
        dropped = ((adv > 0) & (ratio > 1.0 + eps_high)) | ((adv < 0) & (ratio < 1.0 - eps_low))
        loss = torch.where(dropped, torch.zeros_like(loss), loss)
    else:
        dropped = _none(ratio)
    return TokenLoss(loss=loss, weight=ratio, clipped=clamped, capped=clamped, dropped=dropped)


def topr_token_loss(
    logp: Tensor, behav: Tensor, adv: Tensor, positive: Tensor, pos_weight: float, neg_weight: float
) -> TokenLoss:
    """Tapered off-policy REINFORCE.

    Positive samples (reward > 0): `ℓ = −w⁺ · A · logp`; the rest:
    `ℓ = −w⁻ · sg(clamp(exp(logp − behav), 0, 1)) · A · logp`.
    """
    ratio = torch.exp(logp - behav).detach()
    neg_w = torch.clamp(ratio, 0.0, 1.0)
    coef = torch.where(positive, torch.full_like(ratio, pos_weight), neg_weight * neg_w)
    capped = (~positive) & (ratio > 1.0)
    return TokenLoss(loss=-coef * adv * logp, weight=ratio, clipped=capped, capped=capped, dropped=_none(ratio))
