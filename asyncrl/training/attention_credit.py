"""Attention-guided credit assignment (docs/algorithms.md §5): pure tensor math, no I/O.

Owns: WAAD (windowed average attention distance) and FAI (future attention influence) from banded
attention, head classification by attention span, preplan/anchor token selection, locally dominated
anchors, the per-token scale γ of each mode ("local", "global", "coupled"), and applying γ to advantages.
The batch path `batch_credit_scale` (γ [S, T] of a padded batch, vectorised over samples, bit-equal to these
per-sample functions) lives in `attention_credit_batch` and is re-exported here.

Conventions (invariants every function relies on):
- One sequence of length N, positions 0…N−1. An attention map `attn` is [N, N], row t is the query at
  position t, row-stochastic over its causal prefix (attn[t, s] = 0 for s > t).
- A band of width D is [N, D] with `band[t, d] = attn[t, t − d]`, and 0 where t − d < 0.
- `response_mask` is a bool [N]: R = the positions where it is true (the response tokens).
- Selections with ties are broken by position/index, lower first, so every result is deterministic.
- Fractions are applied as `max(1, ⌊fraction · n⌋)`; the floor is taken of `fraction · n + 1e-9` so that
  products like 0.29 · 100 = 28.999… count as 29.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

from asyncrl.training.attention_credit_batch import EPS_FLOOR as _EPS_FLOOR
from asyncrl.training.attention_credit_batch import MODES as MODES
from asyncrl.training.attention_credit_batch import batch_credit_scale as batch_credit_scale

log = logging.getLogger(__name__)


def _count(fraction: float, n: int) -> int:
    """`max(1, ⌊fraction · n⌋)` (with a 1e-9 guard against float round-down)."""
    return max(1, math.floor(fraction * n + _EPS_FLOOR))


def _check_mask(response_mask: Tensor, n: int, name: str = "response_mask") -> Tensor:
    if response_mask.shape != (n,):
        raise ValueError(f"{name}: expected shape ({n},), got {tuple(response_mask.shape)}")
    return response_mask.to(torch.bool)


def band_of(attn: Tensor, width: int) -> Tensor:
    """The band [N, width] of a full map [N, N]: `band[t, d] = attn[t, t − d]`, 0 where t − d < 0."""
    if attn.ndim != 2 or attn.shape[0] != attn.shape[1]:
        raise ValueError(f"attn: expected a square [N, N] map, got {tuple(attn.shape)}")
    if width < 1:
        raise ValueError(f"width: expected >= 1, got {width}")
    n = attn.shape[0]
    t = torch.arange(n, device=attn.device).unsqueeze(1)
    d = torch.arange(width, device=attn.device).unsqueeze(0)
    s = t - d
    vals = attn.gather(1, s.clamp(min=0).expand(n, width))
    return torch.where(s >= 0, vals, torch.zeros((), dtype=attn.dtype, device=attn.device))


def waad_from_band(band: Tensor, window: int) -> Tensor:
    """WAAD [N] from a band [N, D], D ≥ window: `Σ_{d<W} d·band[t,d] + W·(1 − Σ_{d<W} band[t,d])`.

    Equal to `Σ_{s≤t} attn[t,s]·min(t−s, W)` when each row of the map sums to 1 over s ≤ t: the mass
    outside the band (distance ≥ W) is counted at distance W.
    """
    if band.ndim != 2:
        raise ValueError(f"band: expected [N, D], got {tuple(band.shape)}")
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    if band.shape[1] < window:
        raise ValueError(f"band: width {band.shape[1]} is smaller than window {window}")
    inner = band[:, :window]
    dist = torch.arange(window, dtype=band.dtype, device=band.device)
    return (inner * dist).sum(1) + window * (1.0 - inner.sum(1))


def waad(attn: Tensor, window: int = 10) -> Tensor:
    """WAAD [N] of one head-averaged map [N, N]: `WAAD_t = Σ_{s≤t} attn[t,s]·min(t−s, W)` (via the band)."""
    return waad_from_band(band_of(attn, window), window)


def fai(attn: Tensor, h_lo: int, h_hi: int, response_mask: Tensor) -> Tensor:
    """FAI [N]: `FAI_s = mean of attn[t, s] over t ∈ R with s + h_lo ≤ t ≤ min(N−1, s + h_hi)`; 0 if no t."""
    if attn.ndim != 2 or attn.shape[0] != attn.shape[1]:
        raise ValueError(f"attn: expected a square [N, N] map, got {tuple(attn.shape)}")
    return fai_from_band(band_of(attn, h_hi + 1), h_lo, h_hi, response_mask)


def fai_from_band(band: Tensor, h_lo: int, h_hi: int, response_mask: Tensor) -> Tensor:
    """FAI [N] from a band [N, D] with D ≥ h_hi + 1 (same definition as `fai`).

    Row t contributes `band[t, t − s]` to FAI_s for every distance d = t − s in [h_lo, h_hi].
    """
    if band.ndim != 2:
        raise ValueError(f"band: expected [N, D], got {tuple(band.shape)}")
    if not 0 <= h_lo <= h_hi:
        raise ValueError(f"h_lo/h_hi: expected 0 <= h_lo <= h_hi, got h_lo={h_lo}, h_hi={h_hi}")
    n, width = band.shape
    if width < h_hi + 1:
        raise ValueError(f"band: width {width} is smaller than h_hi + 1 = {h_hi + 1}")
    rmask = _check_mask(response_mask, n)
    s = torch.arange(n, device=band.device).unsqueeze(1)
    d = torch.arange(h_lo, h_hi + 1, device=band.device).unsqueeze(0)
    t = s + d  # [N, h_hi − h_lo + 1]
    inside = t < n
    tc = t.clamp(max=n - 1)
    valid = inside & rmask[tc]
    vals = band[tc, d.expand_as(tc)]
    total = torch.where(valid, vals, torch.zeros((), dtype=band.dtype, device=band.device)).sum(1)
    count = valid.sum(1)
    return torch.where(count > 0, total / count.clamp(min=1).to(band.dtype), torch.zeros_like(total))


def head_spans(span_sums: Tensor, response_mask: Tensor) -> Tensor:
    """Head spans d_h [H] = mean over response rows t of `span_sums[h, t] = Σ_s A_h[t,s]·(t−s)`.

    Raises ValueError when the response is empty (a span over no rows is undefined).
    """
    if span_sums.ndim != 2:
        raise ValueError(f"span_sums: expected [H, N], got {tuple(span_sums.shape)}")
    rmask = _check_mask(response_mask, span_sums.shape[1])
    if not bool(rmask.any()):
        raise ValueError("response_mask: expected at least one response token to compute head spans")
    return span_sums[:, rmask].mean(1)


def split_heads(spans: Tensor, fraction: float = 0.3) -> tuple[Tensor, Tensor]:
    """(local_idx, global_idx): the `max(1, ⌊fraction·H⌋)` heads with the smallest / largest span.

    Ties are broken by head index, lower index first, in both orders (a stable sort). Both index
    tensors are returned sorted ascending. With few heads the two sets may overlap (e.g. H = 1, or all
    spans equal: both sets are then the lowest indices).
    """
    if spans.ndim != 1 or spans.numel() == 0:
        raise ValueError(f"spans: expected a non-empty [H] vector, got {tuple(spans.shape)}")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"fraction: expected in [0, 1], got {fraction}")
    k = _count(fraction, spans.numel())
    up = torch.sort(spans, stable=True).indices[:k]
    down = torch.sort(spans, descending=True, stable=True).indices[:k]
    return torch.sort(up).values, torch.sort(down).values


def select_top(scores: Tensor, response_mask: Tensor, fraction: float = 0.4) -> Tensor | None:
    """Bool [N]: the top `max(1, ⌊fraction·n⌋)` of the n response tokens by score; None when n = 0.

    Ties are broken by position, earlier first.
    """
    if scores.ndim != 1:
        raise ValueError(f"scores: expected [N], got {tuple(scores.shape)}")
    rmask = _check_mask(response_mask, scores.shape[0])
    pos = rmask.nonzero().squeeze(1)
    if pos.numel() == 0:
        return None
    k = _count(fraction, pos.numel())
    order = torch.sort(scores[pos], descending=True, stable=True).indices[:k]
    out = torch.zeros_like(rmask)
    out[pos[order]] = True
    return out


def deltas(waad_t: Tensor, response_mask: Tensor) -> Tensor:
    """Δ [N]: `|WAAD_t − WAAD_{t+1}|` where t and t+1 are both response tokens, 0 elsewhere.

    The last response token (and any response token followed by a non-response one) has Δ = 0.
    """
    if waad_t.ndim != 1:
        raise ValueError(f"waad_t: expected [N], got {tuple(waad_t.shape)}")
    rmask = _check_mask(response_mask, waad_t.shape[0])
    out = torch.zeros_like(waad_t)
    if waad_t.shape[0] < 2:
        return out
    both = rmask[:-1] & rmask[1:]
    diff = (waad_t[:-1] - waad_t[1:]).abs()
    out[:-1] = torch.where(both, diff, torch.zeros_like(diff))
    return out


def dominated_anchors(
    anchors: Tensor, waad_t: Tensor, delta: Tensor, response_mask: Tensor, k: int = 3
) -> tuple[Tensor, Tensor]:
    """(D, intro), bool [N] each: the locally dominated anchors and the tokens that introduce them.

    t ∈ D iff t is an anchor in R, `WAAD_t ≤ τ_waad` and `max_{u ∈ [t−k, t−1] ∩ R} Δ_u ≥ τ_Δ`; an anchor
    whose window holds no response token is not dominated. τ_waad, τ_Δ are `torch.median` over the
    response tokens, i.e. the LOWER median for an even count. intro = {argmax_u Δ_u over that window for
    t ∈ D}, ties to the earliest u. Empty response: both all False.
    """
    n = waad_t.shape[0]
    rmask = _check_mask(response_mask, n)
    amask = _check_mask(anchors, n, "anchors") & rmask
    if delta.shape != (n,):
        raise ValueError(f"delta: expected shape ({n},), got {tuple(delta.shape)}")
    if k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")
    dom = torch.zeros_like(rmask)
    intro = torch.zeros_like(rmask)
    if not bool(rmask.any()):
        return dom, intro
    tau_waad = torch.median(waad_t[rmask])
    tau_delta = torch.median(delta[rmask])
    t = torch.arange(n, device=waad_t.device).unsqueeze(1)
    u = t - k + torch.arange(k, device=waad_t.device).unsqueeze(0)  # [N, k], earliest first
    uc = u.clamp(min=0)
    valid = (u >= 0) & rmask[uc]
    neg_inf = torch.tensor(float("-inf"), dtype=delta.dtype, device=delta.device)
    window = torch.where(valid, delta[uc], neg_inf)
    arg = window.argmax(1)  # the first maximal index on ties (earliest u); faster than max(1) on CPU
    best = window.gather(1, arg.unsqueeze(1)).squeeze(1)
    dom = amask & (waad_t <= tau_waad) & valid.any(1) & (best >= tau_delta)
    chosen = uc.gather(1, arg.unsqueeze(1)).squeeze(1)[dom]
    intro[chosen] = True
    return dom, intro


def credit_scale(
    waad_t: Tensor,
    fai_t: Tensor,
    response_mask: Tensor,
    mode: str,
    gamma_amp: float = 1.5,
    alpha_c: float = 0.5,
    top_fraction: float = 0.4,
    k: int = 3,
) -> Tensor:
    """γ [N] for one sequence; 1 outside the response (and everywhere when the response is empty).

    - "local":  `1 + (γ_amp−1)·1[t∈T_loc]`, T_loc = top `top_fraction` of R by Δ (see `deltas`).
    - "global": `1 + (γ_amp−1)·1[t∈T_glob]`, T_glob = top `top_fraction` of R by FAI.
    - "coupled": `1 + (γ_amp−1)·1[t∈T_glob∖D] + (1−α_c)(γ_amp−1)·1[t∈D] + α_c(γ_amp−1)·1[t∈I(D)]`, D and
      I(D) from `dominated_anchors(T_glob, …, k)`; the terms add when a token is in several sets.
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    n = waad_t.shape[0]
    rmask = _check_mask(response_mask, n)
    if fai_t.shape != (n,):
        raise ValueError(f"fai_t: expected shape ({n},), got {tuple(fai_t.shape)}")
    gamma = torch.ones_like(waad_t)
    if not bool(rmask.any()):
        return gamma
    amp = gamma_amp - 1.0
    delta = deltas(waad_t, rmask)
    if mode == "local":
        t_loc = select_top(delta, rmask, top_fraction)
        assert t_loc is not None
        return gamma + amp * t_loc.to(gamma.dtype)
    t_glob = select_top(fai_t, rmask, top_fraction)
    assert t_glob is not None
    if mode == "global":
        return gamma + amp * t_glob.to(gamma.dtype)
    dom, intro = dominated_anchors(t_glob, waad_t, delta, rmask, k)
    f = gamma.dtype
    return (
        gamma
        + amp * (t_glob & ~dom).to(f)
        + (1.0 - alpha_c) * amp * dom.to(f)
        + alpha_c * amp * intro.to(f)
    )


def scale_advantages(adv: Tensor, gamma: Tensor, positive_only: bool = False) -> Tensor:
    """`γ·A`, detached; with `positive_only`, only where A > 0 (A unchanged elsewhere)."""
    adv = adv.detach()
    scaled = gamma.detach().to(adv.dtype) * adv
    if positive_only:
        scaled = torch.where(adv > 0, scaled, adv)
    return scaled
