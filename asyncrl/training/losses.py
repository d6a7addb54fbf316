"""Per-token policy losses and their aggregation (docs/algorithms.md §3). Pure torch, no I/O.

Notation (all tensors [S, T], label-aligned as in `TrainBatch`): `logp` = log π_θ (with grad),
`prox` = log π_prox (no grad), `behav` = log π_behav (the engine's log-probs), `adv` = advantage,
`mask` = 1 on tokens the policy produced. `r = exp(logp − prox)`, `w = exp(prox − behav)`,
`sg` = detach.

Invariants:
- masked positions contribute nothing to the loss or its gradient, whatever their inputs hold;
- a token that a loss option drops (w outside [lo, hi], the CISPO unified mask) gets loss 0 but
  stays in the aggregation denominator, so dropping tokens never rescales the others;
- with explicit denominators (`num_samples` / `num_tokens` of the whole batch), the losses of the
  micro batches of one batch sum to the loss of the whole batch (exact gradient accumulation).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from asyncrl.config.schema import TrainingConfig


@dataclass
class TokenLoss:
    """A per-token loss with its diagnostics (bool tensors, same shape as the loss)."""

    loss: Tensor
    weight: Tensor  # the raw importance weight of this loss, detached (before any cap)
    clipped: Tensor  # the clip/clamp of this loss changed the token's term
    capped: Tensor  # the importance weight was capped (or clamped)
    dropped: Tensor  # the token was masked out by a loss option


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


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ‖π_ref) per token: `exp(ref − logp) − (ref − logp) − 1` (≥ 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(token_loss: Tensor, mask: Tensor, mode: str, denom: float | None = None) -> Tensor:
    """Aggregate per-token values [S, T] over `mask` (public API).

    "seq-mean-token-mean": `Σ_i (Σ_t v_it m_it / Σ_t m_it) / denom`, denom defaulting to the number of
    samples with at least one token. "token-mean": `Σ_it v_it m_it / denom`, denom defaulting to Σ m.
    """
    mask = mask.to(token_loss.dtype)
    if mode == "token-mean":
        d = denom if denom is not None else mask.sum().clamp(min=1.0)
        return (token_loss * mask).sum() / d
    if mode == "seq-mean-token-mean":
        lengths = mask.sum(-1)
        per_seq = (token_loss * mask).sum(-1) / lengths.clamp(min=1.0)
        d = denom if denom is not None else (lengths > 0).sum().clamp(min=1)
        return per_seq.sum() / d
    raise ValueError(f"training.aggregation: expected 'seq-mean-token-mean' or 'token-mean', got {mode!r}")


# The knobs of each variant, by their docs/algorithms.md names, with their defaults.
LOSS_PARAMS: dict[str, dict[str, object]] = {
    "ppo": {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None},
    "decoupled_ppo": {"clip_low": 0.2, "clip_high": 0.2, "dual_clip": None, "w_max": 2.0, "w_mask": None},
    "tis": {"tis_cap": 2.0},
    "cispo": {"eps_low": 0.1, "eps_high": 0.1, "unified_mask": False},
    "topr": {"pos_weight": 1.0, "neg_weight": 1.0},
}


def loss_params(cfg: TrainingConfig) -> dict[str, object]:
    """The knobs of `cfg.loss` from the run config, by their docs/algorithms.md names."""
    every = {
        "clip_low": cfg.clip_low, "clip_high": cfg.clip_high, "dual_clip": cfg.dual_clip, "w_max": cfg.w_max,
        "w_mask": cfg.w_mask, "tis_cap": cfg.tis_cap, "eps_low": cfg.cispo_eps_low, "eps_high": cfg.cispo_eps_high,
        "unified_mask": cfg.cispo_unified_mask, "pos_weight": cfg.topr_pos_weight, "neg_weight": cfg.topr_neg_weight,
    }
    return {k: every[k] for k in LOSS_PARAMS[cfg.loss]}


def variant_token_loss(
    variant: str, logp: Tensor, prox: Tensor, behav: Tensor, adv: Tensor, positive: Tensor, **params: object
) -> TokenLoss:
    """ℓ_t of `variant` with its diagnostics, on every position (callers mask). `positive` [S, T] bool marks tokens of
    samples with reward > 0 (topr). `params` must be knobs of `variant` (see `LOSS_PARAMS`); the rest default."""
    if variant not in LOSS_PARAMS:
        raise ValueError(f"loss variant: expected one of {sorted(LOSS_PARAMS)}, got {variant!r}")
    unknown = sorted(set(params) - set(LOSS_PARAMS[variant]))
    if unknown:
        raise ValueError(f"loss {variant!r}: unknown parameter(s) {unknown}; it takes {sorted(LOSS_PARAMS[variant])}")
    p: dict = {**LOSS_PARAMS[variant], **params}
    if variant == "ppo":
        return ppo_token_loss(logp, prox, adv, p["clip_low"], p["clip_high"], p["dual_clip"])
    if variant == "decoupled_ppo":
        return decoupled_ppo_token_loss(
            logp, prox, behav, adv, p["clip_low"], p["clip_high"], p["w_max"], p["w_mask"], p["dual_clip"]
        )
    if variant == "tis":
        return tis_token_loss(logp, behav, adv, p["tis_cap"])
    if variant == "cispo":
        return cispo_token_loss(logp, behav, adv, p["eps_low"], p["eps_high"], p["unified_mask"])
    return topr_token_loss(logp, behav, adv, positive, p["pos_weight"], p["neg_weight"])


def _masked_inputs(caller: str, logp: Tensor, **others: Tensor) -> tuple[Tensor, ...]:
    """Check that the four per-token tensors (prox, behav, adv, mask, in that order, named as the caller names them)
    have the shape of `logp`; return (mask as bool, zeros, logp, prox, behav, adv) with masked positions zeroed and
    prox/behav/adv detached, so that whatever masked positions hold (prompt, padding, inf, nan) never leaks in."""
    for name, t in others.items():
        if t.shape != logp.shape:
            raise ValueError(f"{caller}: {name} expected shape {tuple(logp.shape)}, got {tuple(t.shape)}")
    prox, behav, adv, mask = others.values()
    m = mask.bool()
    zero = torch.zeros_like(logp)
    return (m, zero, torch.where(m, logp, zero), torch.where(m, prox.detach(), zero),
            torch.where(m, behav.detach(), zero), torch.where(m, adv.detach(), zero))


def per_token_loss(
    variant: str,
    logp: Tensor,
    prox_logp: Tensor,
    behav_logp: Tensor,
    advantages: Tensor,
    mask: Tensor,
    rewards: Tensor | None = None,
    **params: object,
) -> Tensor:
    """ℓ_t of the policy loss `variant` for every token, 0 where `mask` is 0, before aggregation (public API).

    `logp` carries the gradient; `prox_logp`, `behav_logp` and `advantages` are detached here, and every importance
    weight is a stop-gradient, so gradients flow only through the `logp` (and r) terms of docs/algorithms.md §3.
    `rewards` is the sample's reward broadcast to its tokens (same shape as `logp`; topr splits on reward > 0,
    required for topr). `params` are the variant's knobs by their docs/algorithms.md names (`LOSS_PARAMS`); an unknown
    name is an error. Masked positions may hold anything (inf, nan): they never reach the loss or its gradient.
    """
    if variant == "topr" and rewards is None:
        raise ValueError("per_token_loss: topr needs rewards (the sample's reward broadcast to its tokens)")
    if rewards is not None and rewards.shape != logp.shape:
        raise ValueError(f"per_token_loss: rewards expected shape {tuple(logp.shape)}, got {tuple(rewards.shape)}")
    m, zero, logp, prox, behav, adv = _masked_inputs(
        "per_token_loss", logp, prox_logp=prox_logp, behav_logp=behav_logp, advantages=advantages, mask=mask
    )
    positive = (rewards > 0) & m if rewards is not None else torch.zeros_like(m)
    tok = variant_token_loss(variant, logp, prox, behav, adv, positive, **params)
    return torch.where(m, tok.loss, zero)


def policy_loss(
    cfg: TrainingConfig,
    logp: Tensor,
    prox: Tensor,
    behav: Tensor,
    adv: Tensor,
    mask: Tensor,
    rewards: Tensor,
    ref_logp: Tensor | None = None,
    entropy: Tensor | None = None,
    num_samples: float | None = None,
    num_tokens: float | None = None,
    ent_mask: Tensor | None = None,
    ent_coef: float | None = None,
) -> tuple[Tensor, dict[str, float]]:
    """The loss of `cfg.loss`: `agg(ℓ_t·m_t) + kl_coef·agg(KL_k3) − ent_coef·agg(H_t)`, and its metrics.

    `ent_mask` [S, T] (AsyPPO's entropy filter) keeps the bonus only where it is 1, and `ent_coef` overrides
    `cfg.ent_coef`. All per-token tensors are [S, T]; `rewards` is per sample [S] or per token [S, T] (topr splits
    positive/negative by reward > 0). `num_samples` / `num_tokens` are the aggregation denominators of
    the whole batch (for micro batches); by default those of this call. Metrics are means over this
    call's masked tokens except `*_max` (max) and `tokens` (count); merge micro batches with
    `merge_metrics`.
    """
    shape = logp.shape
    m, zero, logp, prox, behav, adv = _masked_inputs("policy_loss", logp, prox=prox, behav=behav, adv=adv, mask=mask)
    positive = (rewards > 0) if rewards.dim() == 2 else (rewards > 0).unsqueeze(-1).expand(shape)
    tok = variant_token_loss(cfg.loss, logp, prox, behav, adv, positive, **loss_params(cfg))
    denom = num_tokens if cfg.aggregation == "token-mean" else num_samples
    pg = aggregate(tok.loss, m, cfg.aggregation, denom)
    loss = pg
    metrics: dict[str, float] = {}
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("policy_loss: training.kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, torch.where(m, ref_logp.detach(), zero))
        loss = loss + cfg.kl_coef * aggregate(kl, m, cfg.aggregation, denom)
        metrics["kl_ref"] = _masked_mean(kl.detach(), m)
    if entropy is not None:
        ent = torch.where(m, entropy, zero)
        coef = cfg.ent_coef if ent_coef is None else ent_coef
        if coef > 0:
            bonus = ent if ent_mask is None else ent * ent_mask.detach().to(ent.dtype)
            loss = loss - coef * aggregate(bonus, m, cfg.aggregation, denom)
        metrics["entropy"] = _masked_mean(ent.detach(), m)
    with torch.no_grad():
        log_r = logp.detach() - prox
        metrics.update(
            loss=float(loss.detach()),
            pg_loss=float(pg.detach()),
            clip_fraction=_masked_mean(tok.clipped.float(), m),
            capped_fraction=_masked_mean(tok.capped.float(), m),
            masked_fraction=_masked_mean(tok.dropped.float(), m),
            iw_mean=_masked_mean(tok.weight, m),
            iw_max=float(tok.weight[m].max()) if m.any() else 0.0,
            approx_kl=_masked_mean(torch.exp(log_r) - 1.0 - log_r, m),
            behav_prox_abs_diff=_masked_mean((behav - prox).abs(), m),
            tokens=float(m.sum()),
        )
    return loss, metrics


def _masked_mean(x: Tensor, m: Tensor) -> float:
    n = int(m.sum())
    return float((x * m).sum() / n) if n else 0.0


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Merge the metrics of the micro batches of one batch.

    `loss`/`pg_loss` add up (each micro loss already carries the batch denominator), `tokens` adds up,
    `*_max` take the max, everything else is a token-weighted mean.
    """
    if not parts:
        return {}
    total = sum(p.get("tokens", 0.0) for p in parts)
    out: dict[str, float] = {}
    for key in parts[0]:
        vals = [p[key] for p in parts]
        if key in ("loss", "pg_loss", "tokens"):
            out[key] = float(sum(vals))
        elif key.endswith("_max"):
            out[key] = float(max(vals))
        else:
            out[key] = float(sum(v * p.get("tokens", 0.0) for v, p in zip(vals, parts, strict=True)) / total) if total else 0.0
    return out
