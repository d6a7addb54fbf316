"""The policy loss of a step and its aggregation (docs/algorithms.md §3). Pure torch, no I/O.

The per-token terms are the registered losses' (`asyncrl.training.loss_registry`: the built-in ones, and yours via
`register_loss`); this module masks their inputs, aggregates them, adds the KL and entropy terms and merges the
metrics of micro batches.

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

import torch
from torch import Tensor

from asyncrl.config.loss_params import LossParams, TOPRParams, parse_loss_params
from asyncrl.config.schema import TrainingConfig
from asyncrl.training.behaviour_gap import behaviour_gap, clip_bounds
from asyncrl.training.loss_registry import LossInputs, TokenLoss, register_loss, token_loss_of
from asyncrl.training.seq_correction import correction_weights

__all__ = ["LossInputs", "LossParams", "TokenLoss", "aggregate", "kl_k3", "merge_metrics", "per_token_loss",
           "policy_loss", "register_loss"]


def kl_k3(logp: Tensor, ref_logp: Tensor) -> Tensor:
    """k3 estimator of KL(π_θ‖π_ref) per token: `exp(ref − logp) − (ref − logp) − 1` (≥ 0)."""
    d = ref_logp - logp
    return torch.exp(d) - d - 1.0


def aggregate(token_loss: Tensor, mask: Tensor, mode: str, denom: float | None = None) -> Tensor:
    """Aggregate per-token values [S, T] over `mask` (public API).

    "seq-mean-token-mean": `Σ_i (Σ_t v_it m_it / Σ_t m_it) / denom`, denom defaulting to the number of
    samples with at least one token. "token-mean": `Σ_it v_it m_it / denom`, denom defaulting to Σ m.
    A sample i is a row: each segment of a segmented sample is a sequence of its own (`asyncrl.training.segments`).
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

    `variant` is a registered loss name (or `package.module:name`). `logp` carries the gradient; `prox_logp`,
    `behav_logp` and `advantages` are detached here, and every importance weight is a stop-gradient, so gradients
    flow only through the `logp` (and r) terms of docs/algorithms.md §3. `rewards` is the sample's reward broadcast to
    its tokens (same shape as `logp`; topr splits on reward > 0, required for topr). `params` are the loss's
    parameters by their names in its class (`asyncrl.config.loss_params`); the rest take the class's defaults, an
    unknown name is an error. Masked positions may hold anything (inf, nan): they never reach the loss or its
    gradient.
    """
    p = parse_loss_params(variant, params, "per_token_loss")
    if isinstance(p, TOPRParams) and rewards is None:
        raise ValueError("per_token_loss: topr needs rewards (the sample's reward broadcast to its tokens)")
    if rewards is not None and rewards.shape != logp.shape:
        raise ValueError(f"per_token_loss: rewards expected shape {tuple(logp.shape)}, got {tuple(rewards.shape)}")
    m, zero, logp, prox, behav, adv = _masked_inputs(
        "per_token_loss", logp, prox_logp=prox_logp, behav_logp=behav_logp, advantages=advantages, mask=mask
    )
    positive = (rewards > 0) & m if rewards is not None else torch.zeros_like(m)
    tok = token_loss_of(p, LossInputs(logp=logp, prox=prox, behav=behav, adv=adv, positive=positive, mask=m))
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
    """The loss of `cfg.loss` with `cfg.loss_params`, `agg(ℓ_t·m_t) + kl_coef·agg(KL_k3) − ent_coef·agg(H_t)`, and
    its metrics.

    With `cfg.seq_correction`, each ℓ_t is multiplied by the correction's detached weight
    (`asyncrl.training.seq_correction`); the tokens it masks lose their KL and entropy terms too and stay in the
    denominators; its `corr_*` metrics join (`*_count` are counts, added up by `merge_metrics`).
    `ent_mask` [S, T] (AsyPPO's entropy filter) keeps the bonus only where it is 1, and `ent_coef` overrides
    `cfg.ent_coef`. All per-token tensors are [S, T]; `rewards` is per sample [S] or per token [S, T] (topr splits
    positive/negative by reward > 0). `num_samples` / `num_tokens` are the aggregation denominators of
    the whole batch (for micro batches); by default those of this call. Metrics are means over this
    call's masked tokens except `*_max` (max) and `tokens` (count); merge micro batches with
    `merge_metrics`. `clip_fraction` is 0 by construction with one optimizer step per batch (r = 1) and can
    be non-zero from a step's second mini-batch update on (`training.mini_batches`, `training.epochs`); the
    engine-trainer gap (`behav_clip_fraction`, `gap_abs`, `gap_k3`: `asyncrl.training.behaviour_gap`) is not.
    """
    shape = logp.shape
    m, zero, logp, prox, behav, adv = _masked_inputs("policy_loss", logp, prox=prox, behav=behav, adv=adv, mask=mask)
    positive = (rewards > 0) if rewards.dim() == 2 else (rewards > 0).unsqueeze(-1).expand(shape)
    tok = token_loss_of(cfg.loss_params, LossInputs(logp=logp, prox=prox, behav=behav, adv=adv, positive=positive,
                                                    mask=m))
    denom = num_tokens if cfg.aggregation == "token-mean" else num_samples
    metrics: dict[str, float] = {}
    token_pg, keep = tok.loss, m  # keep: the tokens no correction masked (denominators still count them all)
    if cfg.seq_correction is not None:
        c = cfg.seq_correction
        corr = correction_weights(prox, behav, m, c.level, c.mode, c.cap, c.band)
        token_pg, keep = tok.loss * corr.weight, corr.keep
        metrics.update(corr.metrics())
    pg = aggregate(token_pg, m, cfg.aggregation, denom)
    loss = pg
    if cfg.kl_coef > 0:
        if ref_logp is None:
            raise ValueError("policy_loss: training.kl_coef > 0 needs ref_logp")
        kl = kl_k3(logp, torch.where(m, ref_logp.detach(), zero))
        loss = loss + cfg.kl_coef * aggregate(torch.where(keep, kl, zero), m, cfg.aggregation, denom)
        metrics["kl_ref"] = _masked_mean(kl.detach(), m)
    if entropy is not None:
        ent = torch.where(m, entropy, zero)
        coef = cfg.ent_coef if ent_coef is None else ent_coef
        if coef > 0:
            bonus = ent if ent_mask is None else ent * ent_mask.detach().to(ent.dtype)
            loss = loss - coef * aggregate(torch.where(keep, bonus, zero), m, cfg.aggregation, denom)
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
        metrics.update(behaviour_gap(prox, behav, m, *clip_bounds(cfg.loss_params)))
    return loss, metrics


def _masked_mean(x: Tensor, m: Tensor) -> float:
    n = int(m.sum())
    return float((x * m).sum() / n) if n else 0.0


def merge_metrics(parts: list[dict[str, float]]) -> dict[str, float]:
    """Merge the metrics of the micro batches of one batch.

    `loss`/`pg_loss` add up (each micro loss already carries the batch denominator), `tokens` and `*_count` add up,
    `*_max` take the max, everything else is a token-weighted mean.
    """
    if not parts:
        return {}
    total = sum(p.get("tokens", 0.0) for p in parts)
    out: dict[str, float] = {}
    for key in parts[0]:
        vals = [p[key] for p in parts]
        if key in ("loss", "pg_loss", "tokens") or key.endswith("_count"):
            out[key] = float(sum(vals))
        elif key.endswith("_max"):
            out[key] = float(max(vals))
        else:
            out[key] = float(sum(v * p.get("tokens", 0.0) for v, p in zip(vals, parts, strict=True)) / total) if total else 0.0
    return out
