"""Policy losses against hand-computed numbers on 2-3 tokens (docs/algorithms.md §3)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.losses import aggregate, kl_k3, merge_metrics, policy_loss

LN = math.log


def _t(*xs: float) -> torch.Tensor:
    return torch.tensor([list(xs)], dtype=torch.float32)


def _run(cfg: TrainingConfig, logp, prox, behav, adv, mask=None, rewards=None, **kw):
    logp = logp.clone().requires_grad_(True)
    mask = torch.ones_like(logp) if mask is None else mask
    rewards = torch.ones(logp.shape[0]) if rewards is None else rewards
    loss, metrics = policy_loss(cfg, logp, prox, behav, adv, mask, rewards, **kw)
    loss.backward()
    return loss.item(), metrics, logp.grad


def test_ppo_clip_and_gradient() -> None:
    # r = [1.5, 0.5, 1], A = [1, -1, 2], ε = 0.2:
    # t0: -min(1.5·1, 1.2·1) = -1.2 (clipped, no grad); t1: -min(-0.5, 0.8·-1) = 0.8 (clipped, no grad);
    # t2: -2 (dℓ/dlogp = -r·A = -2). token-mean = (-1.2 + 0.8 - 2) / 3 = -0.8; grad = [0, 0, -2/3].
    prox = _t(-1.0, -1.0, -1.0)
    logp = prox + _t(LN(1.5), LN(0.5), 0.0)
    loss, m, grad = _run(TrainingConfig(loss="ppo"), logp, prox, prox, _t(1.0, -1.0, 2.0))
    assert loss == pytest.approx(-0.8, abs=1e-6)
    assert torch.allclose(grad, _t(0.0, 0.0, -2 / 3), atol=1e-6)
    assert m["clip_fraction"] == pytest.approx(2 / 3)
    # approx_kl = mean(r - 1 - ln r) = (0.5 - ln 1.5 + -0.5 - ln 0.5 + 0) / 3
    assert m["approx_kl"] == pytest.approx((0.5 - LN(1.5) - 0.5 - LN(0.5)) / 3, abs=1e-6)


def test_ppo_dual_clip() -> None:
    # r = 5, A = -1: -min(-5, 1.2·-1) = 5; dual clip c = 3 caps it at -c·A = 3 (no grad).
    # r = 1, A = -1: ℓ = 1 < 3 untouched. token-mean = (3 + 1) / 2 = 2.
    prox = _t(-2.0, -2.0)
    logp = prox + _t(LN(5.0), 0.0)
    loss, m, grad = _run(TrainingConfig(loss="ppo", loss_params={"dual_clip": 3.0}), logp, prox, prox, _t(-1.0, -1.0))
    assert loss == pytest.approx(2.0, abs=1e-6)
    assert torch.allclose(grad, _t(0.0, 0.5), atol=1e-6)  # t1: dℓ/dlogp = -r·A / 2 = 0.5
    assert m["clip_fraction"] == pytest.approx(0.5)


def test_decoupled_ppo_cap_and_mask() -> None:
    # r = 1 (logp = prox); w = exp(prox - behav) = [3, 0.5, 1]; A = [1, 1, -2]; ppo part = -A = [-1, -1, 2].
    # cap w_max = 2: ℓ = [-2·1, -0.5·1, 1·2] = [-2, -0.5, 2]; token-mean = -0.5/3.
    prox = _t(-1.0, -1.0, -1.0)
    behav = prox - _t(LN(3.0), LN(0.5), 0.0)
    adv = _t(1.0, 1.0, -2.0)
    loss, m, grad = _run(TrainingConfig(loss="decoupled_ppo", loss_params={"w_max": 2.0}), prox, prox, behav, adv)
    assert loss == pytest.approx(-0.5 / 3, abs=1e-6)
    assert torch.allclose(grad, _t(-2 / 3, -0.5 / 3, 2 / 3), atol=1e-6)  # -sg(w)·r·A / 3
    assert m["capped_fraction"] == pytest.approx(1 / 3)
    assert m["iw_mean"] == pytest.approx(1.5, abs=1e-6) and m["iw_max"] == pytest.approx(3.0, abs=1e-5)
    assert m["behav_prox_abs_diff"] == pytest.approx((LN(3.0) + LN(2.0)) / 3, abs=1e-6)
    # mask [0.6, 2.5]: w = 3 and w = 0.5 are dropped; ℓ = [0, 0, 2]; the denominator stays 3.
    cfg = TrainingConfig(loss="decoupled_ppo", loss_params={"w_mask": (0.6, 2.5)})
    loss, m, _ = _run(cfg, prox, prox, behav, adv)
    assert loss == pytest.approx(2 / 3, abs=1e-6)
    assert m["masked_fraction"] == pytest.approx(2 / 3) and m["capped_fraction"] == 0.0


def test_tis() -> None:
    # ratio exp(logp - behav) = [3, 0.5, 1] → clamp(0, 2) = [2, 0.5, 1]; A = 1; logp = [-0.5, -1, -2]
    # ℓ = -w·A·logp = [1, 0.5, 2]; token-mean = 3.5/3; grad = -w·A/3 = [-2/3, -1/6, -1/3].
    logp = _t(-0.5, -1.0, -2.0)
    behav = logp - _t(LN(3.0), LN(0.5), 0.0)
    loss, m, grad = _run(TrainingConfig(loss="tis", loss_params={"tis_cap": 2.0}), logp, logp, behav, _t(1.0, 1.0, 1.0))
    assert loss == pytest.approx(3.5 / 3, abs=1e-6)
    assert torch.allclose(grad, _t(-2 / 3, -1 / 6, -1 / 3), atol=1e-6)
    assert m["capped_fraction"] == pytest.approx(1 / 3)


def test_cispo_and_unified_mask() -> None:
    # ε = 0.1: ratio [3, 0.5, 1.05] → clamp [1.1, 0.9, 1.05]; A = [1, -1, 1]; logp = [-1, -2, -0.5]
    # ℓ = -w·A·logp = [1.1, -1.8, 0.525]; token-mean = -0.175/3.
    logp = _t(-1.0, -2.0, -0.5)
    behav = logp - _t(LN(3.0), LN(0.5), LN(1.05))
    adv = _t(1.0, -1.0, 1.0)
    loss, m, _ = _run(TrainingConfig(loss="cispo"), logp, logp, behav, adv)
    assert loss == pytest.approx(-0.175 / 3, abs=1e-6)
    assert m["clip_fraction"] == pytest.approx(2 / 3)
    # unified mask drops t0 (A > 0, ratio > 1.1) and t1 (A < 0, ratio < 0.9): loss = 0.525 / 3
    loss, m, grad = _run(TrainingConfig(loss="cispo", loss_params={"unified_mask": True}), logp, logp, behav, adv)
    assert loss == pytest.approx(0.525 / 3, abs=1e-6)
    assert torch.allclose(grad, _t(0.0, 0.0, -1.05 / 3), atol=1e-6)
    assert m["masked_fraction"] == pytest.approx(2 / 3)


def test_topr_positive_and_negative() -> None:
    # Sample 0 (reward 1): ℓ = -A·logp = [1, 0.5] (A = 1, logp = [-1, -0.5]), no ratio.
    # Sample 1 (reward 0): A = -1, logp = [-2, -1], ratio [3, 0.5] → clamp(0, 1) = [1, 0.5];
    # ℓ = -c·A·logp = [-2, -0.5]. seq-mean-token-mean = (0.75 + -1.25) / 2 = -0.25.
    logp = torch.tensor([[-1.0, -0.5], [-2.0, -1.0]])
    behav = logp - torch.tensor([[LN(3.0), LN(3.0)], [LN(3.0), LN(0.5)]])
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0]])
    loss, m, grad = _run(TrainingConfig(loss="topr"), logp, logp, behav, adv, rewards=torch.tensor([1.0, 0.0]))
    assert loss == pytest.approx(-0.25, abs=1e-6)
    # grad = -coef·A / (2 samples · 2 tokens) = [[-1/4, -1/4], [1/4, 0.5/4]]
    assert torch.allclose(grad, torch.tensor([[-0.25, -0.25], [0.25, 0.125]]), atol=1e-6)
    assert m["capped_fraction"] == pytest.approx(0.25)  # only sample 1 token 0 (ratio 3 > 1)
    # weights: w⁺ = 2 doubles the positive part: (1.5 - 1.25) / 2 = 0.125
    loss, _, _ = _run(TrainingConfig(loss="topr", loss_params={"pos_weight": 2.0}), logp, logp, behav, adv, rewards=torch.tensor([1.0, 0.0]))
    assert loss == pytest.approx(0.125, abs=1e-6)


def test_aggregation_modes_on_unequal_lengths() -> None:
    # Sample 0: 3 tokens of 1; sample 1: one token of 4. seq-mean: (1 + 4) / 2; token-mean: 7 / 4.
    values = torch.tensor([[1.0, 1.0, 1.0], [4.0, 100.0, 100.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 0.0, 0.0]])
    assert aggregate(values, mask, "seq-mean-token-mean").item() == pytest.approx(2.5)
    assert aggregate(values, mask, "token-mean").item() == pytest.approx(1.75)
    # An empty sample does not count in the default seq-mean denominator.
    assert aggregate(values, torch.tensor([[1.0, 1.0, 1.0], [0.0, 0.0, 0.0]]), "seq-mean-token-mean").item() == 1.0
    with pytest.raises(ValueError, match="aggregation"):
        aggregate(values, mask, "sum")


def test_masked_tokens_contribute_nothing() -> None:
    # Garbage (inf, nan) at masked positions must not change the loss nor reach the gradient.
    cfg = TrainingConfig(loss="decoupled_ppo")
    logp = torch.tensor([[-1.0, -1.0, float("inf")]])
    behav = torch.tensor([[-1.0, -1.0, float("nan")]])
    adv = torch.tensor([[1.0, -1.0, 1e9]])
    mask = torch.tensor([[1.0, 1.0, 0.0]])
    loss, m, grad = _run(cfg, logp, logp.clone(), behav, adv, mask=mask)
    # r = w = 1: ℓ = [-1, 1] → mean 0; grad = -A / 2 = [-0.5, 0.5, 0]
    assert loss == pytest.approx(0.0, abs=1e-7)
    assert torch.equal(grad, torch.tensor([[-0.5, 0.5, 0.0]]))
    assert m["tokens"] == 2.0


def test_kl_and_entropy_terms() -> None:
    # k3 with logp = ln 0.5, ref = ln 0.25: d = ln 0.5 → 0.5 - ln 0.5 - 1 = 0.193147...
    assert kl_k3(torch.tensor(LN(0.5)), torch.tensor(LN(0.25))).item() == pytest.approx(0.5 + LN(2.0) - 1, abs=1e-6)
    # ppo on one token with r = 1, A = 1: ℓ = -1; + 0.1·0.193147 - 0.01·2 (entropy 2)
    cfg = TrainingConfig(loss="ppo", kl_coef=0.1, ent_coef=0.01)
    logp = _t(LN(0.5))
    loss, m, _ = _run(cfg, logp, logp, logp, _t(1.0), ref_logp=_t(LN(0.25)), entropy=_t(2.0))
    assert loss == pytest.approx(-1.0 + 0.1 * (0.5 + LN(2.0) - 1) - 0.02, abs=1e-6)
    assert m["entropy"] == pytest.approx(2.0) and m["kl_ref"] == pytest.approx(0.5 + LN(2.0) - 1, abs=1e-6)
    with pytest.raises(ValueError, match="ref_logp"):
        _run(cfg, logp, logp, logp, _t(1.0))


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_micro_batches_sum_to_the_batch_loss(aggregation: str) -> None:
    torch.manual_seed(0)
    cfg = TrainingConfig(loss="decoupled_ppo", aggregation=aggregation)
    logp, prox, behav, adv = (torch.randn(4, 5) * 0.3 - 1 for _ in range(4))
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    full, fm = policy_loss(cfg, logp, prox, behav, adv, mask, rewards)
    parts = [
        policy_loss(cfg, logp[s], prox[s], behav[s], adv[s], mask[s], rewards[s], num_samples=4, num_tokens=11)
        for s in (slice(0, 1), slice(1, 4))
    ]
    assert sum(p[0] for p in parts).item() == pytest.approx(full.item(), abs=1e-6)
    merged = merge_metrics([p[1] for p in parts])
    for key in ("loss", "iw_mean", "iw_max", "approx_kl", "tokens", "behav_prox_abs_diff"):
        assert merged[key] == pytest.approx(fm[key], abs=1e-6), key


def test_shape_errors_name_the_field() -> None:
    x = torch.zeros(1, 3)
    with pytest.raises(ValueError, match="behav"):
        policy_loss(TrainingConfig(), x, x, torch.zeros(1, 2), x, x, torch.zeros(1))
