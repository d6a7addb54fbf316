"""Attention-guided credit for a right-padded batch (docs/algorithms.md §5): γ [S, T], vectorised over samples.

Owns `batch_credit_scale` (re-exported by `asyncrl.training.attention_credit`, whose per-sample functions
define the math) and the `MODES` / floor-guard constants both modules share. Pure tensor math, no I/O.

Exactness contract: γ is bit-for-bit (`torch.equal`) what the per-sample path gives when run sample by
sample (`head_spans` → `split_heads` → head-mean bands → `waad_from_band` / `fai_from_band` with N = N_i →
`credit_scale`), for every mode, and it raises the same errors in the same order. How:
- Every floating-point reduction runs on a tensor whose reduced dimension has the same length, stride and
  contents as in the per-sample path, so torch reduces each row in the same order: head spans are a mean
  over a contiguous row of the n_i response values (one reduction per distinct response count n, never
  over padding: a padded sum groups the adds differently), head means reduce over the same k heads taken
  in ascending index order, WAAD over the first W band columns, FAI over the h_hi − h_lo + 1 offsets with
  the same zeros at the same places.
- Selections are order statistics per row: stable sorts over the whole row keep the relative order of the
  response positions (ties by position), counts `max(1, ⌊q·n_i + 1e-9⌋)` are computed in float64 like
  Python's float, τ is the LOWER median (`torch.median`, NaN when a NaN is present) of the response values.
- Positions ≥ N_i are never read into a result at a position < N_i; every masking is a `torch.where`, so
  padding junk (even NaN) cannot leak. γ = 1 at t ≥ N_i and for samples with no response token.
"""

from __future__ import annotations

import logging
import math

import torch
from torch import Tensor

log = logging.getLogger(__name__)

MODES = ("local", "global", "coupled")
EPS_FLOOR = 1e-9


def _count(fraction: float, n: int) -> int:
    """`max(1, ⌊fraction · n⌋)` (with the 1e-9 guard), as `attention_credit._count`."""
    return max(1, math.floor(fraction * n + EPS_FLOOR))


def _counts(fraction: float, n: Tensor) -> Tensor:
    """`_count(fraction, n_i)` for every n_i of an int tensor (float64 math, as Python floats)."""
    return torch.floor(fraction * n.to(torch.float64) + EPS_FLOOR).clamp(min=1).to(torch.int64)


def _sample_error(seq_lens: Tensor, rmask: Tensor, i: int, t_len: int) -> None:
    """Raise the per-sample path's error for sample i (its seq_len or response tokens beyond it)."""
    n = int(seq_lens[i])
    if not 0 <= n <= t_len:
        raise ValueError(f"seq_lens[{i}]: expected in [0, {t_len}], got {n}")
    raise ValueError(f"response_mask[{i}]: response token beyond seq_lens[{i}] = {n}")


def _param_errors(
    heads: int, head_fraction: float, window: int, h_lo: int, h_hi: int, top_fraction: float, n_first: int,
    mode: str, k: int,
) -> None:
    """Raise what the per-sample path raises on its first sample with a response (n_first tokens), if any."""
    if heads == 0:
        raise ValueError(f"spans: expected a non-empty [H] vector, got {(0,)}")
    if not 0.0 <= head_fraction <= 1.0:
        raise ValueError(f"fraction: expected in [0, 1], got {head_fraction}")
    if window < 1:
        raise ValueError(f"window: expected >= 1, got {window}")
    if not 0 <= h_lo <= h_hi:
        raise ValueError(f"h_lo/h_hi: expected 0 <= h_lo <= h_hi, got h_lo={h_lo}, h_hi={h_hi}")
    _count(top_fraction, n_first)  # NaN / inf fractions raise here, as in `select_top`
    if mode == "coupled" and k < 1:
        raise ValueError(f"k: expected >= 1, got {k}")


def _head_spans(span_sums: Tensor, rmask: Tensor, n_resp: Tensor) -> Tensor:
    """Spans [S, H] float32: mean of each head's response rows; 0 for samples without a response.

    One reduction per distinct response count m over contiguous [g, H, m] rows (the per-sample layout).
    """
    s_count, heads, t_len = span_sums.shape
    spans = torch.zeros(s_count, heads, dtype=torch.float32, device=span_sums.device)
    m_max = int(n_resp.max())
    order = torch.sort((~rmask).to(torch.uint8), dim=1, stable=True).indices[:, :m_max]  # response first
    packed = span_sums.gather(2, order.unsqueeze(1).expand(s_count, heads, m_max))
    for m in torch.unique(n_resp[n_resp > 0]).tolist():
        idx = (n_resp == m).nonzero().squeeze(1)
        spans[idx] = packed[idx, :, :m].float().contiguous().mean(2)
    return spans


def _split_heads(spans: Tensor, fraction: float) -> tuple[Tensor, Tensor]:
    """(local, global) head indices [S, kh] each, ascending: `split_heads` row by row."""
    kh = _count(fraction, spans.shape[1])
    up = torch.sort(spans, dim=1, stable=True).indices[:, :kh]
    down = torch.sort(spans, dim=1, descending=True, stable=True).indices[:, :kh]
    return torch.sort(up, dim=1).values, torch.sort(down, dim=1).values


def _head_mean(bands: Tensor, idx: Tensor) -> Tensor:
    """Mean band [S, T, D] float32 over the heads idx [S, kh] (ascending) of each sample."""
    rows = torch.arange(bands.shape[0], device=bands.device).unsqueeze(1)
    return bands[rows, idx].float().mean(1)  # [S, kh, T, D] contiguous, reduced over kh as `mean(0)` per sample


def _waad(band: Tensor, window: int) -> Tensor:
    """WAAD [S, T] from bands [S, T, D]: the formula of `waad_from_band`, row by row."""
    inner = band[..., :window]
    dist = torch.arange(window, dtype=band.dtype, device=band.device)
    return (inner * dist).sum(-1) + window * (1.0 - inner.sum(-1))


def _fai(band: Tensor, h_lo: int, h_hi: int, rmask: Tensor) -> Tensor:
    """FAI [S, T] from bands [S, T, D]: `fai_from_band` of each sample with N = N_i.

    Needs rmask False at t ≥ N_i (checked by the caller), so `t < N_i` is implied by `rmask[t]`. Offsets
    d ∈ [h_lo, h_hi] of row s read `band[s + d, d]`: a strided view of the band padded by h_hi zero rows.
    """
    s_count, t_len, width = band.shape
    nd = h_hi - h_lo + 1
    band_p = torch.cat([band, band.new_zeros(s_count, h_hi, width)], 1).contiguous()
    vals = band_p.as_strided((s_count, t_len, nd), (band_p.stride(0), width, width + 1), h_lo * (width + 1))
    mask_p = torch.cat([rmask, rmask.new_zeros(s_count, h_hi)], 1).contiguous()
    valid = mask_p.as_strided((s_count, t_len, nd), (mask_p.stride(0), 1, 1), h_lo)
    total = vals.contiguous().masked_fill_(~valid, 0.0).sum(2)  # [S, T, nd] contiguous, like `fai_from_band`
    count = valid.sum(2)
    return torch.where(count > 0, total / count.clamp(min=1).to(band.dtype), torch.zeros_like(total))


def _deltas(waad_t: Tensor, rmask: Tensor) -> Tensor:
    """Δ [S, T]: `deltas` row by row (0 unless t and t+1 are both response tokens)."""
    out = torch.zeros_like(waad_t)
    if waad_t.shape[1] < 2:
        return out
    both = rmask[:, :-1] & rmask[:, 1:]
    diff = (waad_t[:, :-1] - waad_t[:, 1:]).abs()
    out[:, :-1] = torch.where(both, diff, torch.zeros_like(diff))
    return out


def _select_top(scores: Tensor, rmask: Tensor, n_resp: Tensor, fraction: float) -> Tensor:
    """Bool [S, T]: `select_top` row by row (top `_count(fraction, n_i)` response tokens, ties by position)."""
    order = torch.sort(scores, dim=1, descending=True, stable=True).indices
    flag = rmask.gather(1, order)
    chosen = flag & (flag.cumsum(1) <= _counts(fraction, n_resp).unsqueeze(1))
    return torch.zeros_like(rmask).scatter(1, order, chosen)


def _lower_median(vals: Tensor, rmask: Tensor, n_resp: Tensor) -> Tensor:
    """[S]: `torch.median(vals[i][rmask[i]])` per row (lower median; NaN if a response value is NaN)."""
    filled = torch.where(rmask, vals, torch.full((), float("inf"), dtype=vals.dtype, device=vals.device))
    ordered = torch.sort(filled, dim=1).values
    med = ordered.gather(1, ((n_resp - 1).clamp(min=0) // 2).unsqueeze(1)).squeeze(1)
    has_nan = (rmask & vals.isnan()).any(1)
    return torch.where(has_nan, torch.full_like(med, float("nan")), med)


def _dominated(
    anchors: Tensor, waad_t: Tensor, delta: Tensor, rmask: Tensor, n_resp: Tensor, k: int
) -> tuple[Tensor, Tensor]:
    """(D, intro) bool [S, T]: `dominated_anchors` row by row."""
    s_count, t_len = waad_t.shape
    tau_waad = _lower_median(waad_t, rmask, n_resp)
    tau_delta = _lower_median(delta, rmask, n_resp)
    t = torch.arange(t_len, device=waad_t.device).unsqueeze(1)
    u = t - k + torch.arange(k, device=waad_t.device).unsqueeze(0)  # [T, k], earliest first
    uc = u.clamp(min=0)
    valid = (u >= 0).unsqueeze(0) & rmask[:, uc]  # [S, T, k]
    neg_inf = torch.tensor(float("-inf"), dtype=delta.dtype, device=delta.device)
    window = torch.where(valid, delta[:, uc], neg_inf)
    arg = window.argmax(2, keepdim=True)  # the first maximal index on ties (earliest u)
    best = window.gather(2, arg).squeeze(2)
    dom = (
        anchors & rmask & (waad_t <= tau_waad.unsqueeze(1)) & valid.any(2) & (best >= tau_delta.unsqueeze(1))
    )
    chosen = uc.unsqueeze(0).expand(s_count, t_len, k).gather(2, arg).squeeze(2)
    target = torch.where(dom, chosen, torch.full_like(chosen, t_len))
    intro = torch.zeros(s_count, t_len + 1, dtype=torch.bool, device=waad_t.device)
    intro.scatter_(1, target, True)
    return dom, intro[:, :t_len]


def batch_credit_scale(
    span_sums: Tensor,
    bands: Tensor,
    response_mask: Tensor,
    seq_lens: Tensor,
    *,
    mode: str,
    window: int = 10,
    h_lo: int = 10,
    h_hi: int = 100,
    head_fraction: float = 0.3,
    top_fraction: float = 0.4,
    gamma_amp: float = 1.5,
    alpha_c: float = 0.5,
    k: int = 3,
) -> Tensor:
    """γ [S, T] float32 for a right-padded batch from captured stats (see `asyncrl.training.attention_capture`).

    span_sums [S, Hs, T], bands [S, Hs, T, D] (D ≥ max(window, h_hi + 1)), response_mask [S, T] bool,
    seq_lens [S] (N_i = prompt + response length of sample i; only positions < N_i are read). Per
    sample: head spans over its response rows, split into local/global heads, mean band of each set,
    WAAD from the local band, FAI from the global band (with N = N_i), then `credit_scale`. γ = 1 at
    non-response positions and for samples without a response token. Vectorised over samples; equal bit
    for bit to running the per-sample functions sample by sample (see the module docstring).
    """
    if mode not in MODES:
        raise ValueError(f"mode: expected one of {MODES}, got {mode!r}")
    if span_sums.ndim != 3:
        raise ValueError(f"span_sums: expected [S, Hs, T], got {tuple(span_sums.shape)}")
    s_count, heads, t_len = span_sums.shape
    if bands.ndim != 4 or bands.shape[:3] != (s_count, heads, t_len):
        raise ValueError(f"bands: expected [{s_count}, {heads}, {t_len}, D], got {tuple(bands.shape)}")
    if bands.shape[3] < max(window, h_hi + 1):
        raise ValueError(f"bands: width {bands.shape[3]} is smaller than max(window, h_hi + 1)")
    if response_mask.shape != (s_count, t_len):
        raise ValueError(f"response_mask: expected ({s_count}, {t_len}), got {tuple(response_mask.shape)}")
    if seq_lens.shape != (s_count,):
        raise ValueError(f"seq_lens: expected ({s_count},), got {tuple(seq_lens.shape)}")
    dev = span_sums.device
    gamma = torch.ones(s_count, t_len, dtype=torch.float32, device=dev)
    rmask = response_mask.to(device=dev, dtype=torch.bool)
    lens_raw = seq_lens.to(dev)
    bad = torch.zeros(s_count, dtype=torch.bool, device=dev)
    if lens_raw.is_floating_point():  # int() truncates toward 0: (-1, t_len + 1) maps into [0, t_len]
        bad = ~torch.isfinite(lens_raw) | (lens_raw <= -1) | (lens_raw >= t_len + 1)
    lens = torch.where(bad, 0, lens_raw).to(torch.int64)
    bad |= (lens < 0) | (lens > t_len)
    inside = torch.arange(t_len, device=dev).unsqueeze(0) < lens.unsqueeze(1)  # [S, T]
    bad |= (rmask & ~inside).any(1)
    n_resp = (rmask & inside).sum(1)
    active = (n_resp > 0) & ~bad
    bad_idx = bad.nonzero()
    first_bad = int(bad_idx[0, 0]) if bad_idx.numel() else s_count
    act_idx = active.nonzero()
    if act_idx.numel() and int(act_idx[0, 0]) < first_bad:
        first = int(act_idx[0, 0])
        _param_errors(heads, head_fraction, window, h_lo, h_hi, top_fraction, int(n_resp[first]), mode, k)
    if first_bad < s_count:
        _sample_error(seq_lens, response_mask, first_bad, t_len)
    if not act_idx.numel():
        return gamma

    spans = _head_spans(span_sums, rmask, n_resp)
    loc, glob = _split_heads(spans, head_fraction)
    waad_t = _waad(_head_mean(bands, loc), window)
    f = gamma.dtype
    amp = gamma_amp - 1.0
    delta = _deltas(waad_t, rmask)
    if mode == "local":
        out = gamma + amp * _select_top(delta, rmask, n_resp, top_fraction).to(f)
    else:
        fai_t = _fai(_head_mean(bands, glob), h_lo, h_hi, rmask)
        t_glob = _select_top(fai_t, rmask, n_resp, top_fraction)
        if mode == "global":
            out = gamma + amp * t_glob.to(f)
        else:
            dom, intro = _dominated(t_glob, waad_t, delta, rmask, n_resp, k)
            out = (
                gamma
                + amp * (t_glob & ~dom).to(f)
                + (1.0 - alpha_c) * amp * dom.to(f)
                + alpha_c * amp * intro.to(f)
            )
    return torch.where(inside & active.unsqueeze(1), out, gamma)
