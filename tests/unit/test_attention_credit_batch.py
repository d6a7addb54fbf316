"""The vectorised `batch_credit_scale` against the per-sample reference loop: exactly equal γ, intermediates and
errors on random batches with ties, gaps and padding junk."""

from __future__ import annotations

import pytest
import torch

from asyncrl.training import attention_credit_batch as acb
from asyncrl.training.attention_credit import (
    MODES,
    batch_credit_scale,
    credit_scale,
    deltas,
    fai_from_band,
    head_spans,
    split_heads,
    waad_from_band,
)

T, F = True, False


def _batch_credit_scale_loop(
    span_sums: torch.Tensor,
    bands: torch.Tensor,
    response_mask: torch.Tensor,
    seq_lens: torch.Tensor,
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
) -> torch.Tensor:
    """Reference: the former `batch_credit_scale`, a Python loop of the per-sample functions."""
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
    rmask_all = response_mask.to(torch.bool)
    gamma = torch.ones(s_count, t_len, dtype=torch.float32, device=span_sums.device)
    for i in range(s_count):
        n = int(seq_lens[i])
        if not 0 <= n <= t_len:
            raise ValueError(f"seq_lens[{i}]: expected in [0, {t_len}], got {n}")
        if bool(rmask_all[i, n:].any()):
            raise ValueError(f"response_mask[{i}]: response token beyond seq_lens[{i}] = {n}")
        rmask = rmask_all[i, :n]
        if not bool(rmask.any()):
            continue
        spans = head_spans(span_sums[i, :, :n].float(), rmask)
        loc, glob = split_heads(spans, head_fraction)
        band_loc = bands[i, loc, :n].float().mean(0)
        band_glob = bands[i, glob, :n].float().mean(0)
        waad_t = waad_from_band(band_loc, window)
        fai_t = fai_from_band(band_glob, h_lo, h_hi, rmask)
        gamma[i, :n] = credit_scale(
            waad_t, fai_t, rmask, mode, gamma_amp=gamma_amp, alpha_c=alpha_c, top_fraction=top_fraction, k=k
        )
    return gamma


def _random_batch(g: torch.Generator, quantised: bool, t_max: int = 24) -> tuple[torch.Tensor, ...]:
    """(span_sums, bands, response_mask, seq_lens, width) with empty rows, gapped responses, padding junk."""
    s_count = int(torch.randint(1, 9, (1,), generator=g))
    heads = int(torch.randint(1, 7, (1,), generator=g))
    t_len = int(torch.randint(1, t_max + 1, (1,), generator=g))
    width = int(torch.randint(1, 12, (1,), generator=g))
    if quantised:  # a few levels, so ties in spans, WAAD, Δ, FAI and the medians really occur
        span_sums = torch.randint(0, 4, (s_count, heads, t_len), generator=g).double() / 2
        bands = torch.randint(0, 3, (s_count, heads, t_len, width), generator=g).float() / 8
    else:
        span_sums = torch.rand(s_count, heads, t_len, generator=g, dtype=torch.float64) * 30
        bands = torch.rand(s_count, heads, t_len, width, generator=g) / width
    seq_lens = torch.randint(0, t_len + 1, (s_count,), generator=g)
    rmask = torch.zeros(s_count, t_len, dtype=torch.bool)
    for i, n in enumerate(seq_lens.tolist()):
        kind = int(torch.randint(0, 4, (1,), generator=g))
        if kind == 0 or n == 0:
            continue  # no response token
        if kind == 1:
            start = int(torch.randint(0, n, (1,), generator=g))
            rmask[i, start:n] = True  # prompt + one response span
        else:
            rmask[i, :n] = torch.rand(n, generator=g) < 0.6  # multi-turn: gaps of environment tokens
        span_sums[i, :, n:] = float("nan")  # padding junk must never be read
        bands[i, :, n:] = float("nan") if kind == 2 else 7.0
    return span_sums, bands, rmask, seq_lens, torch.tensor(width)


def _random_params(g: torch.Generator, width: int) -> dict:
    def pick(options: list) -> object:
        return options[int(torch.randint(0, len(options), (1,), generator=g))]

    h_hi = int(torch.randint(0, width, (1,), generator=g))
    return dict(
        window=int(torch.randint(1, width + 1, (1,), generator=g)),
        h_lo=int(torch.randint(0, h_hi + 1, (1,), generator=g)),
        h_hi=h_hi,
        head_fraction=pick([0.0, 0.3, 0.5, 0.29, 1.0]),
        top_fraction=pick([0.4, 0.29, 0.5, 0.01, 1.0, 1.5]),
        gamma_amp=pick([1.5, 2.0, 0.7]),
        alpha_c=pick([0.5, 0.25, 1.0]),
        k=int(torch.randint(1, 5, (1,), generator=g)),
    )


@pytest.mark.parametrize("quantised", [True, False])
def test_batch_credit_scale_equals_per_sample_loop(quantised: bool) -> None:
    g = torch.Generator().manual_seed(1234 + quantised)
    amplified = 0
    for _ in range(300):
        span_sums, bands, rmask, seq_lens, width = _random_batch(g, quantised)
        kw = _random_params(g, int(width))
        for mode in MODES:
            ref = _batch_credit_scale_loop(span_sums, bands, rmask, seq_lens, mode=mode, **kw)
            got = batch_credit_scale(span_sums, bands, rmask, seq_lens, mode=mode, **kw)
            assert got.dtype == torch.float32
            assert torch.equal(got, ref), (mode, kw, seq_lens.tolist())
            amplified += int((ref != 1).sum())
    assert amplified > 1000  # the batches really exercise the selections


def test_batch_credit_scale_equals_loop_on_long_rows() -> None:
    """Response counts above one vector of lanes and above the cascade threshold of torch's sum."""
    g = torch.Generator().manual_seed(7)
    for quantised in (False, True):
        for _ in range(4):
            span_sums, bands, rmask, seq_lens, width = _random_batch(g, quantised, t_max=400)
            kw = _random_params(g, int(width))
            for mode in MODES:
                ref = _batch_credit_scale_loop(span_sums, bands, rmask, seq_lens, mode=mode, **kw)
                assert torch.equal(batch_credit_scale(span_sums, bands, rmask, seq_lens, mode=mode, **kw), ref)


def test_batch_intermediates_are_bit_equal_on_continuous_values() -> None:
    """Spans, head-mean bands, WAAD, FAI and Δ equal the per-sample functions bit for bit (no ties needed)."""
    g = torch.Generator().manual_seed(99)
    s_count, heads, t_len, width = 6, 5, 300, 48
    span_sums = torch.rand(s_count, heads, t_len, generator=g) * 50
    bands = torch.rand(s_count, heads, t_len, width, generator=g) / width
    lens = torch.tensor([300, 290, 17, 1, 256, 40])
    rmask = torch.zeros(s_count, t_len, dtype=torch.bool)
    for i, n in enumerate(lens.tolist()):
        rmask[i, : n] = torch.rand(n, generator=g) < 0.8
    rmask[3, 0] = True
    n_resp = rmask.sum(1)
    spans = acb._head_spans(span_sums, rmask, n_resp)
    loc, glob = acb._split_heads(spans, 0.4)
    band_loc, band_glob = acb._head_mean(bands, loc), acb._head_mean(bands, glob)
    waad_b = acb._waad(band_loc, 7)
    fai_b = acb._fai(band_glob, 3, 45, rmask)
    delta_b = acb._deltas(waad_b, rmask)
    for i, n in enumerate(lens.tolist()):
        r = rmask[i, :n]
        sp = head_spans(span_sums[i, :, :n], r)
        assert torch.equal(spans[i], sp)
        lo, gl = split_heads(sp, 0.4)
        assert torch.equal(loc[i], lo) and torch.equal(glob[i], gl)
        bl = bands[i, lo, :n].mean(0)
        assert torch.equal(band_loc[i, :n], bl)
        assert torch.equal(waad_b[i, :n], waad_from_band(bl, 7))
        assert torch.equal(fai_b[i, :n], fai_from_band(bands[i, gl, :n].mean(0), 3, 45, r))
        assert torch.equal(delta_b[i, :n], deltas(waad_from_band(bl, 7), r))
        for vals in (waad_b[i, :n], delta_b[i, :n]):
            assert torch.equal(acb._lower_median(vals[None], r[None], n_resp[i : i + 1])[0], torch.median(vals[r]))


def test_lower_median_is_torch_median_with_nan_and_even_counts() -> None:
    vals = torch.tensor([[3.0, 1.0, 2.0, 4.0, 9.0], [1.0, float("nan"), 0.0, 5.0, 5.0]])
    rmask = torch.tensor([[T, T, T, T, F], [T, T, T, F, F]])
    got = acb._lower_median(vals, rmask, rmask.sum(1))
    assert got[0].item() == 2.0 == torch.median(vals[0, :4]).item()  # lower median of 1, 2, 3, 4
    assert got[1].isnan() and torch.median(vals[1, :3]).isnan()


def _outcome(fn, *args, **kw) -> tuple[str, object]:  # noqa: ANN001
    try:
        return "ok", fn(*args, **kw)
    except (ValueError, OverflowError) as e:
        return type(e).__name__, str(e)


@pytest.mark.parametrize(
    ("change", "lens"),
    [
        (dict(mode="bogus"), [4, 3]),
        (dict(head_fraction=1.5), [4, 3]),
        (dict(window=0), [4, 3]),
        (dict(h_lo=2, h_hi=1), [4, 3]),
        (dict(k=0), [4, 3]),
        (dict(k=0, mode="local"), [4, 3]),  # k is not read outside "coupled"
        (dict(top_fraction=float("nan")), [4, 3]),
        (dict(top_fraction=float("inf")), [4, 3]),
        (dict(), [5, 3]),  # seq_len out of range
        (dict(), [4, -1]),
        (dict(), [4, 1]),  # response token beyond seq_len
        (dict(head_fraction=1.5), [4, 1]),  # sample 0 (with a response) fails first
        (dict(head_fraction=1.5), [0, 3]),  # no response at all: parameters are never read
        (dict(), [4.7, 3.2]),  # float lengths truncate like int()
        (dict(), [4.0, float("nan")]),
    ],
)
def test_batch_credit_scale_errors_match_loop(change: dict, lens: list) -> None:
    rmask = torch.tensor([[F, T, T, T], [F, T, F, F]])
    if lens[0] == 0:
        rmask[0] = False
        rmask[1] = False
    kw = {**dict(mode="coupled", window=2, h_lo=1, h_hi=2, k=2), **change}
    args = (torch.rand(2, 3, 4), torch.rand(2, 3, 4, 3), rmask, torch.tensor(lens))
    ref, got = _outcome(_batch_credit_scale_loop, *args, **kw), _outcome(batch_credit_scale, *args, **kw)
    assert got[0] == ref[0]
    if ref[0] == "ok":
        assert torch.equal(got[1], ref[1])
    else:
        assert got[1] == ref[1]


def test_batch_credit_scale_empty_batch_and_no_responses() -> None:
    for s_count, t_len in ((0, 5), (3, 0), (2, 4)):
        args = (torch.zeros(s_count, 2, t_len), torch.zeros(s_count, 2, t_len, 3),
                torch.zeros(s_count, t_len, dtype=torch.bool), torch.full((s_count,), t_len))
        got = batch_credit_scale(*args, mode="coupled", window=2, h_lo=1, h_hi=2)
        assert torch.equal(got, torch.ones(s_count, t_len))
