"""Exact, hand-computed checks of asyncrl.training.attention_credit (docs/algorithms.md §5)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.training.attention_credit import (
    band_of,
    batch_credit_scale,
    credit_scale,
    deltas,
    dominated_anchors,
    fai,
    fai_from_band,
    head_spans,
    scale_advantages,
    select_top,
    split_heads,
    waad,
    waad_from_band,
)

T, F = True, False

ATTN4 = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0],
        [0.5, 0.5, 0.0, 0.0],
        [0.2, 0.3, 0.5, 0.0],
        [0.1, 0.2, 0.3, 0.4],
    ],
    dtype=torch.float64,
)

ATTN5 = torch.tensor(
    [
        [1.0, 0.0, 0.0, 0.0, 0.0],
        [0.6, 0.4, 0.0, 0.0, 0.0],
        [0.5, 0.3, 0.2, 0.0, 0.0],
        [0.1, 0.2, 0.3, 0.4, 0.0],
        [0.4, 0.1, 0.2, 0.2, 0.1],
    ],
    dtype=torch.float64,
)


def waad_full(attn: torch.Tensor, window: int) -> torch.Tensor:
    """Reference: WAAD_t = Σ_{s≤t} attn[t,s]·min(t−s, W), straight from the definition."""
    n = attn.shape[0]
    out = torch.zeros(n, dtype=attn.dtype)
    for t in range(n):
        for s in range(t + 1):
            out[t] += attn[t, s] * min(t - s, window)
    return out


def random_causal(n: int, seed: int) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(n, n, generator=g, dtype=torch.float64)
    logits = logits.masked_fill(torch.triu(torch.ones(n, n, dtype=torch.bool), 1), float("-inf"))
    return logits.softmax(-1)


def mask(*bits: bool) -> torch.Tensor:
    return torch.tensor(bits, dtype=torch.bool)


# ---- WAAD ------------------------------------------------------------------------------------------


def test_waad_hand_values_window_2() -> None:
    # t3: 0.1·2 + 0.2·2 + 0.3·1 = 0.9 ; banded: 1·0.3 + 2·(1 − 0.7) = 0.9
    expected = torch.tensor([0.0, 0.5, 0.7, 0.9], dtype=torch.float64)
    assert torch.allclose(waad(ATTN4, window=2), expected, atol=1e-12)
    assert torch.allclose(waad_full(ATTN4, 2), expected, atol=1e-12)


def test_waad_window_longer_than_sequence() -> None:
    expected = torch.tensor([0.0, 0.5, 0.7, 1.0], dtype=torch.float64)
    assert torch.allclose(waad(ATTN4, window=10), expected, atol=1e-12)


@pytest.mark.parametrize("window", [1, 3, 10])
def test_waad_banded_equals_full_formula(window: int) -> None:
    attn = random_causal(8, seed=window)
    assert torch.allclose(waad(attn, window), waad_full(attn, window), atol=1e-12)
    wide = band_of(attn, window + 4)  # a band wider than W gives the same WAAD
    assert torch.allclose(waad_from_band(wide, window), waad_full(attn, window), atol=1e-12)


def test_band_of_layout() -> None:
    band = band_of(ATTN4, 3)
    expected = torch.tensor(
        [[1.0, 0.0, 0.0], [0.5, 0.5, 0.0], [0.5, 0.3, 0.2], [0.4, 0.3, 0.2]], dtype=torch.float64
    )
    assert torch.equal(band, expected)


def test_waad_from_band_rejects_narrow_band() -> None:
    with pytest.raises(ValueError, match="band"):
        waad_from_band(torch.zeros(4, 2), window=3)


# ---- FAI -------------------------------------------------------------------------------------------


def test_fai_windows_and_edges() -> None:
    r = mask(F, F, T, T, T)
    # s0: t∈{1,2}∩R={2} → .5 ; s1: t∈{2,3} → (.3+.2)/2 ; s2: t∈{3,4} → (.3+.2)/2 ;
    # s3: t∈{4} (h_hi beyond N−1) → .2 ; s4: no t → 0
    expected = torch.tensor([0.5, 0.25, 0.25, 0.2, 0.0], dtype=torch.float64)
    assert torch.allclose(fai(ATTN5, 1, 2, r), expected, atol=1e-12)
    assert torch.allclose(fai_from_band(band_of(ATTN5, 3), 1, 2, r), expected, atol=1e-12)


def test_fai_no_response_row_in_window_gives_zero() -> None:
    r = mask(T, T, F, F, F)
    expected = torch.tensor([0.6, 0.0, 0.0, 0.0, 0.0], dtype=torch.float64)
    assert torch.allclose(fai(ATTN5, 1, 2, r), expected, atol=1e-12)


def test_fai_full_equals_banded_on_random_map() -> None:
    attn = random_causal(8, seed=7)
    r = mask(F, F, T, T, F, T, T, T)
    ref = torch.zeros(8, dtype=torch.float64)
    for s in range(8):
        ts = [t for t in range(s + 2, min(7, s + 4) + 1) if r[t]]
        if ts:
            ref[s] = sum(attn[t, s] for t in ts) / len(ts)
    assert torch.allclose(fai(attn, 2, 4, r), ref, atol=1e-12)
    assert torch.allclose(fai_from_band(band_of(attn, 9), 2, 4, r), ref, atol=1e-12)


def test_fai_from_band_rejects_narrow_band() -> None:
    with pytest.raises(ValueError, match="h_hi"):
        fai_from_band(torch.zeros(5, 3), 1, 3, mask(T, T, T, T, T))


# ---- heads ------------------------------------------------------------------------------------------


def test_head_spans_mean_over_response_rows() -> None:
    span_sums = torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])
    assert torch.equal(head_spans(span_sums, mask(F, T, T)), torch.tensor([2.5, 5.5]))
    with pytest.raises(ValueError, match="response_mask"):
        head_spans(span_sums, mask(F, F, F))


def test_split_heads_with_ties() -> None:
    spans = torch.tensor([3.0, 1.0, 1.0, 5.0, 5.0, 2.0])
    loc, glob = split_heads(spans, 0.3)  # ⌊1.8⌋ = 1 head each
    assert loc.tolist() == [1] and glob.tolist() == [3]
    loc, glob = split_heads(spans, 0.5)  # 3 heads each
    assert loc.tolist() == [1, 2, 5] and glob.tolist() == [0, 3, 4]
    loc, glob = split_heads(spans, 0.1)  # at least one
    assert loc.tolist() == [1] and glob.tolist() == [3]


def test_split_heads_all_equal_takes_lowest_indices_in_both() -> None:
    loc, glob = split_heads(torch.full((4,), 2.0), 0.5)
    assert loc.tolist() == [0, 1] and glob.tolist() == [0, 1]


# ---- token selection ----------------------------------------------------------------------------------


def test_select_top_with_ties_and_non_response() -> None:
    scores = torch.tensor([9.0, 1.0, 3.0, 3.0, 0.0, 3.0, 2.0])
    r = mask(F, T, T, T, F, T, T)  # n = 5 → ⌊0.4·5⌋ = 2; position 0 (score 9) is not a response token
    assert select_top(scores, r, 0.4).tolist() == [F, F, T, T, F, F, F]
    assert select_top(scores, r, 0.1).tolist() == [F, F, T, F, F, F, F]
    assert select_top(scores, mask(F, F, F, F, F, F, F), 0.4) is None


def test_select_top_fraction_floor_guard() -> None:
    scores = torch.arange(100, dtype=torch.float32)
    picked = select_top(scores, torch.ones(100, dtype=torch.bool), 0.29)  # 0.29·100 = 28.999…
    assert int(picked.sum()) == 29 and bool(picked[71:].all())


def test_deltas_contiguous_and_gapped() -> None:
    waad_t = torch.tensor([5.0, 1.0, 2.0, 4.0, 4.0, 0.0])
    assert deltas(waad_t, mask(F, T, T, T, T, F)).tolist() == [0.0, 1.0, 2.0, 0.0, 0.0, 0.0]
    waad_t = torch.tensor([0.0, 3.0, 7.0, 1.0, 2.0])
    assert deltas(waad_t, mask(T, T, F, T, T)).tolist() == [3.0, 0.0, 0.0, 1.0, 0.0]


def test_dominated_anchors_and_intro() -> None:
    waad_t = torch.tensor([1.0, 1, 1, 1, 1, 1, 1, 9, 1, 1])  # τ_waad = 1
    delta = torch.tensor([1.0, 3, 3, 1, 2, 2, 5, 0, 0, 0])  # sorted 0,0,0,1,1,2,… → lower median τ_Δ = 1
    r = torch.ones(10, dtype=torch.bool)
    anchors = torch.zeros(10, dtype=torch.bool)
    anchors[[0, 1, 2, 3, 5, 7, 9]] = True
    dom, intro = dominated_anchors(anchors, waad_t, delta, r, k=2)
    # t0: empty window; t1: {0} max 1 ≥ τ_Δ (lower median) → intro 0; t2: {0,1} → 1;
    # t3: {1,2} tie 3,3 → earliest 1; t5: {3,4} → 4; t7: WAAD 9 > τ; t9: {7,8} max 0 < τ
    assert dom.nonzero().squeeze(1).tolist() == [1, 2, 3, 5]
    assert intro.nonzero().squeeze(1).tolist() == [0, 1, 4]


def test_dominated_anchors_ignores_non_response() -> None:
    waad_t = torch.tensor([0.0, 0.0, 0.0, 0.0])
    delta = torch.tensor([5.0, 0.0, 0.0, 0.0])
    r = mask(F, T, T, T)  # τ_Δ = median(0,0,0) = 0, anchor 0 is not a response token
    dom, intro = dominated_anchors(mask(T, T, F, F), waad_t, delta, r, k=3)
    # t1: window {0}∩R = ∅ → not dominated
    assert dom.tolist() == [F, F, F, F] and intro.tolist() == [F, F, F, F]


# ---- γ -------------------------------------------------------------------------------------------------

WAAD6 = torch.tensor([0.0, 1.0, 3.0, 2.0, 2.0, 6.0])  # Δ = [0, 2, 1, 0, 4, 0]
FAI6 = torch.tensor([9.0, 0.1, 0.5, 0.2, 0.5, 0.5])
R6 = mask(F, T, T, T, T, T)  # n = 5 → 2 tokens per set


def test_credit_scale_local() -> None:
    gamma = credit_scale(WAAD6, FAI6, R6, "local")  # T_loc = {4 (Δ 4), 1 (Δ 2)}
    assert gamma.tolist() == [1.0, 1.5, 1.0, 1.0, 1.5, 1.0]


def test_credit_scale_global() -> None:
    gamma = credit_scale(WAAD6, FAI6, R6, "global")  # FAI ties .5 at 2,4,5 → earliest {2, 4}
    assert gamma.tolist() == [1.0, 1.0, 1.5, 1.0, 1.5, 1.0]


def test_credit_scale_coupled() -> None:
    # τ_waad = 2, τ_Δ = 1. t2: WAAD 3 > 2 → not dominated. t4: WAAD 2, window {2,3} Δ (1, 0) → D, intro 2.
    # t2 ∈ T_glob∖D and ∈ I(D): 1 + .5 + α·.5 ; t4 ∈ D: 1 + (1−α)·.5
    gamma = credit_scale(WAAD6, FAI6, R6, "coupled", k=2)
    assert gamma.tolist() == [1.0, 1.0, 1.75, 1.0, 1.25, 1.0]
    gamma = credit_scale(WAAD6, FAI6, R6, "coupled", alpha_c=0.2, k=2)
    assert torch.allclose(gamma, torch.tensor([1.0, 1.0, 1.6, 1.0, 1.4, 1.0]))
    gamma = credit_scale(WAAD6, FAI6, R6, "coupled", k=1)  # window {3}: Δ 0 < 1 → no D: same as global
    assert gamma.tolist() == [1.0, 1.0, 1.5, 1.0, 1.5, 1.0]


def test_credit_scale_empty_response_and_bad_mode() -> None:
    none = mask(F, F, F, F, F, F)
    assert credit_scale(WAAD6, FAI6, none, "coupled").tolist() == [1.0] * 6
    with pytest.raises(ValueError, match="mode"):
        credit_scale(WAAD6, FAI6, R6, "both")


def test_scale_advantages_signed_and_positive_only() -> None:
    adv = torch.tensor([1.0, -2.0, 0.0, 3.0], requires_grad=True)
    gamma = torch.tensor([1.5, 1.5, 2.0, 1.0])
    out = scale_advantages(adv, gamma)
    assert out.tolist() == [1.5, -3.0, 0.0, 3.0] and not out.requires_grad
    assert scale_advantages(adv, gamma, positive_only=True).tolist() == [1.5, -2.0, 0.0, 3.0]


# ---- batch -------------------------------------------------------------------------------------------


def _stats(maps: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """span_sums [H, N], bands [H, N, width] of full maps [H, N, N]."""
    n = maps.shape[-1]
    dist = (torch.arange(n).unsqueeze(1) - torch.arange(n).unsqueeze(0)).clamp(min=0).to(maps.dtype)
    return (maps * dist).sum(-1), torch.stack([band_of(m, width) for m in maps])


def test_batch_credit_scale_matches_full_maps() -> None:
    t_len, width, heads = 8, 4, 4
    kw = dict(window=2, h_lo=1, h_hi=3, head_fraction=0.5, top_fraction=0.4, gamma_amp=1.5, alpha_c=0.5, k=2)
    seq_lens = torch.tensor([8, 6, 5])
    rmask = torch.zeros(3, t_len, dtype=torch.bool)
    rmask[0, 3:8] = True
    rmask[1, 2:6] = True  # sample 2: no response token
    span_sums = torch.zeros(3, heads, t_len, dtype=torch.float64)
    bands = torch.zeros(3, heads, t_len, width, dtype=torch.float64)
    refs = []
    for i, n in enumerate(seq_lens.tolist()):
        maps = torch.stack([random_causal(n, seed=10 * i + h) for h in range(heads)])
        sp, bd = _stats(maps, width)
        span_sums[i, :, :n], bands[i, :, :n] = sp, bd
        span_sums[i, :, n:], bands[i, :, n:] = 99.0, 0.7  # padding junk must not be read
        ref = torch.ones(t_len, dtype=torch.float64)
        r = rmask[i, :n]
        if r.any():
            loc, glob = split_heads(head_spans(sp, r), 0.5)
            w = waad(maps[loc].mean(0), 2)
            f = fai(maps[glob].mean(0), 1, 3, r)
            ref[:n] = credit_scale(w, f, r, "coupled", k=2)
        refs.append(ref)
    gamma = batch_credit_scale(span_sums, bands, rmask, seq_lens, mode="coupled", **kw)
    assert gamma.shape == (3, t_len)
    assert torch.allclose(gamma.double(), torch.stack(refs), atol=1e-6)
    assert gamma[2].tolist() == [1.0] * t_len
    assert gamma[1, 6:].tolist() == [1.0, 1.0]
    assert bool((gamma[0] > 1).any())


def test_batch_credit_scale_rejects_response_beyond_seq_len() -> None:
    rmask = torch.zeros(1, 4, dtype=torch.bool)
    rmask[0, 3] = True
    with pytest.raises(ValueError, match="seq_lens"):
        batch_credit_scale(
            torch.zeros(1, 2, 4), torch.zeros(1, 2, 4, 4), rmask, torch.tensor([3]), mode="local",
            window=2, h_lo=1, h_hi=2,
        )


# ---- vectorised batch path == the per-sample loop, bit for bit --------------------------------------
