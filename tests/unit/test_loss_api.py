"""The public loss API (`per_token_loss`, `aggregate`) against hand-computed per-token values and gradients."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.losses import aggregate, per_token_loss, policy_loss

LN = math.log


def _row(*xs: float) -> torch.Tensor:
    return torch.tensor([list(xs)], dtype=torch.float32)


def _loss_and_grad(variant: str, logp, prox, behav, adv, mask=None, rewards=None, **params):
    logp = logp.clone().requires_grad_(True)
    mask = torch.ones_like(logp) if mask is None else mask
    ell = per_token_loss(variant, logp, prox, behav, adv, mask, rewards, **params)
    ell.sum().backward()
    return ell.detach(), logp.grad


def test_ppo_per_token_values_and_gradients() -> None:
    # r = [1.5, 0.5, 1, 0.9], A = [1, -1, 2, 1], ε = 0.2:
    # ℓ = [-1.2 (clipped), 0.8 (clipped), -2, -0.9]; dℓ/dlogp = -r·A where unclipped = [0, 0, -2, -0.9].
    prox = _row(-1.0, -1.0, -1.0, -1.0)
    logp = prox + _row(LN(1.5), LN(0.5), 0.0, LN(0.9))
    ell, grad = _loss_and_grad("ppo", logp, prox, prox, _row(1.0, -1.0, 2.0, 1.0))
    assert torch.allclose(ell, _row(-1.2, 0.8, -2.0, -0.9), atol=1e-6)
    assert torch.allclose(grad, _row(0.0, 0.0, -2.0, -0.9), atol=1e-6)
    # asymmetric clip (clip_high 0.6): t0 is no longer clipped: ℓ = -1.5, grad -1.5
    ell, grad = _loss_and_grad("ppo", logp, prox, prox, _row(1.0, -1.0, 2.0, 1.0), clip_high=0.6)
    assert ell[0, 0].item() == pytest.approx(-1.5) and grad[0, 0].item() == pytest.approx(-1.5)
    # dual clip c = 3 on r = 5, A = -1: -min(-5, -1.2) = 5 → min(5, 3) = 3, no gradient
    p2 = _row(-2.0)
    ell, grad = _loss_and_grad("ppo", p2 + LN(5.0), p2, p2, _row(-1.0), dual_clip=3.0)
    assert ell.item() == pytest.approx(3.0) and grad.item() == 0.0


def test_decoupled_ppo_weight_is_a_stop_gradient() -> None:
    # r = [1.1, 1], w = exp(prox - behav) = [1.5, 4 → cap 2], A = [1, -1]:
    # ℓ = -w·min(r·A, clip(r)·A) = [-1.5·1.1, -2·(-1)] = [-1.65, 2]; dℓ/dlogp = -w·r·A = [-1.65, 2].
    prox = _row(-1.0, -2.0)
    logp = prox + _row(LN(1.1), 0.0)
    behav = prox - _row(LN(1.5), LN(4.0))
    ell, grad = _loss_and_grad("decoupled_ppo", logp, prox, behav, _row(1.0, -1.0))
    assert torch.allclose(ell, _row(-1.65, 2.0), atol=1e-6)
    assert torch.allclose(grad, _row(-1.65, 2.0), atol=1e-6)
    # w_max = 1.2 caps both weights
    ell, _ = _loss_and_grad("decoupled_ppo", logp, prox, behav, _row(1.0, -1.0), w_max=1.2)
    assert torch.allclose(ell, _row(-1.2 * 1.1, 1.2), atol=1e-6)
    # gradient never reaches behav or prox
    behav_g = behav.clone().requires_grad_(True)
    prox_g = prox.clone().requires_grad_(True)
    logp_g = logp.clone().requires_grad_(True)
    per_token_loss("decoupled_ppo", logp_g, prox_g, behav_g, _row(1.0, -1.0), torch.ones(1, 2)).sum().backward()
    assert behav_g.grad is None and prox_g.grad is None


def test_tis_cispo_topr_per_token() -> None:
    logp = _row(-0.5, -1.0)
    behav = logp - _row(LN(3.0), LN(0.5))  # ratio exp(logp - behav) = [3, 0.5]
    adv = _row(1.0, -2.0)
    # tis c = 2: w = [2, 0.5]; ℓ = -w·A·logp = [-2·1·-0.5, -0.5·-2·-1] = [1, -1]; grad = -w·A = [-2, 1]
    ell, grad = _loss_and_grad("tis", logp, logp, behav, adv)
    assert torch.allclose(ell, _row(1.0, -1.0)) and torch.allclose(grad, _row(-2.0, 1.0))
    # cispo ε = 0.1: w = [1.1, 0.9]; ℓ = [0.55, -1.8]; grad = [-1.1, 1.8]
    ell, grad = _loss_and_grad("cispo", logp, logp, behav, adv)
    assert torch.allclose(ell, _row(0.55, -1.8), atol=1e-6) and torch.allclose(grad, _row(-1.1, 1.8), atol=1e-6)
    # unified mask drops both (A > 0 with ratio 3 > 1.1; A < 0 with ratio 0.5 < 0.9)
    ell, grad = _loss_and_grad("cispo", logp, logp, behav, adv, unified_mask=True)
    assert torch.equal(ell, torch.zeros(1, 2)) and torch.equal(grad, torch.zeros(1, 2))
    # eps_high = 4: t0 weight 3 unclamped: ℓ0 = -3·1·-0.5 = 1.5
    ell, _ = _loss_and_grad("cispo", logp, logp, behav, adv, eps_high=4.0)
    assert ell[0, 0].item() == pytest.approx(1.5)
    # topr: t0 of a positive sample: ℓ = -A·logp = -0.5 (no weight); t1 of a negative sample:
    # -clamp(0.5, 0, 1)·A·logp = -0.5·-2·-1 = -1; neg_weight 2 doubles it.
    two = torch.tensor([[-0.5, -1.0], [-0.5, -1.0]])
    rewards = torch.tensor([[1.0, 1.0], [0.0, 0.0]])
    b2 = two - torch.tensor([[LN(3.0), LN(0.5)], [LN(3.0), LN(0.5)]])
    a2 = torch.tensor([[1.0, -2.0], [1.0, -2.0]])
    ell, grad = _loss_and_grad("topr", two, two, b2, a2, rewards=rewards, neg_weight=2.0)
    assert torch.allclose(ell, torch.tensor([[0.5, -2.0], [1.0, -2.0]]), atol=1e-6)
    # positive row: -A; negative row: -2·clamp(ratio, 0, 1)·A = [-2·1·1, -2·0.5·-2]
    assert torch.allclose(grad, torch.tensor([[-1.0, 2.0], [-2.0, 2.0]]), atol=1e-6)


def test_masked_positions_are_zero_and_inert() -> None:
    logp = _row(-1.0, float("nan"))
    behav = _row(-1.0, float("inf"))
    mask = _row(1.0, 0.0)
    for variant in ("ppo", "decoupled_ppo", "tis", "cispo", "topr"):
        ell, grad = _loss_and_grad(variant, logp, logp.clone(), behav, _row(1.0, 5.0), mask=mask,
                                   rewards=torch.ones(1, 2))
        assert ell[0, 1].item() == 0.0 and grad[0, 1].item() == 0.0, variant
        assert torch.isfinite(ell).all() and torch.isfinite(grad).all(), variant


def test_bad_arguments_name_the_problem() -> None:
    x = torch.zeros(1, 2)
    with pytest.raises(ValueError, match="clip_low: unknown parameter of loss 'tis'"):
        per_token_loss("tis", x, x, x, x, x, clip_low=0.1)
    with pytest.raises(ValueError, match="topr needs rewards"):
        per_token_loss("topr", x, x, x, x, x)
    with pytest.raises(ValueError, match="unknown loss 'reinforce'"):
        per_token_loss("reinforce", x, x, x, x, x)
    with pytest.raises(ValueError, match="behav_logp"):
        per_token_loss("tis", x, x, torch.zeros(1, 3), x, x)


def test_aggregate_of_per_token_loss_matches_policy_loss() -> None:
    torch.manual_seed(1)
    logp, prox, behav, adv = (torch.randn(3, 4) * 0.2 - 1 for _ in range(4))
    mask = torch.tensor([[1, 1, 0, 0], [1, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float32)
    for mode in ("seq-mean-token-mean", "token-mean"):
        cfg = TrainingConfig(loss="cispo", aggregation=mode, loss_params={"eps_high": 4.0})
        ell = per_token_loss("cispo", logp, prox, behav, adv, mask, eps_high=4.0)
        full, _ = policy_loss(cfg, logp, prox, behav, adv, mask, torch.ones(3))
        assert aggregate(ell, mask, mode).item() == pytest.approx(full.item(), abs=1e-6)


def test_entropy_filter_mask() -> None:
    # ppo, r = 1, A = 0; entropies [2, 4], ent_mask [1, 0], β = 0.5: loss = -0.5·(2 + 0)/2 = -0.5
    cfg = TrainingConfig(loss="ppo")
    x = _row(-1.0, -1.0)
    loss, m = policy_loss(cfg, x, x, x, torch.zeros(1, 2), torch.ones(1, 2), torch.ones(1), entropy=_row(2.0, 4.0),
                          ent_mask=_row(1.0, 0.0), ent_coef=0.5)
    assert loss.item() == pytest.approx(-0.5) and m["entropy"] == pytest.approx(3.0)
