"""The engine-trainer gap and the behaviour clip metric (docs/algorithms.md §7) with exact numbers, in `policy_loss`'s
metrics, and exact over micro batches through `merge_metrics`."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.behaviour_gap import behaviour_gap, clip_bounds
from asyncrl.training.losses import merge_metrics, policy_loss

LN = math.log


def _t(*rows: list[float]) -> torch.Tensor:
    return torch.tensor([list(r) for r in rows], dtype=torch.float32)


def test_gap_and_clip_fraction_by_hand() -> None:
    # w = exp(prox - behav) = [1.5, 0.5, 1.1, 1] on the trained tokens; the masked 4th column holds junk (w = e^9)
    prox = _t([-1.0, -1.0, -1.0, 0.0], [-2.0, 0.0, 0.0, 0.0])
    behav = prox - _t([LN(1.5), LN(0.5), LN(1.1), -9.0], [0.0, 0.0, 0.0, 0.0])
    mask = _t([1, 1, 1, 0], [1, 0, 0, 0])
    m = behaviour_gap(prox, behav, mask, 0.2, 0.2)
    assert m["behav_clip_fraction"] == pytest.approx(2 / 4)  # 1.5 > 1.2 and 0.5 < 0.8; 1.1 and 1 inside
    assert m["gap_abs"] == pytest.approx((LN(1.5) + LN(2.0) + LN(1.1)) / 4, abs=1e-6)
    k3 = (0.5 - LN(1.5)) + (-0.5 - LN(0.5)) + (0.1 - LN(1.1))
    assert m["gap_k3"] == pytest.approx(k3 / 4, abs=1e-6)
    # wider bounds: clip_high 0.6 keeps 1.5 inside, clip_low 0.05 puts nothing else out but 0.5
    assert behaviour_gap(prox, behav, mask, 0.05, 0.6)["behav_clip_fraction"] == pytest.approx(1 / 4)
    assert behaviour_gap(prox, behav, torch.zeros_like(mask), 0.2, 0.2) == {
        "behav_clip_fraction": 0.0, "gap_abs": 0.0, "gap_k3": 0.0}
    with pytest.raises(ValueError, match=r"behaviour_gap: mask expected shape \(2, 4\)"):
        behaviour_gap(prox, behav, mask[:, :3], 0.2, 0.2)


def test_the_bounds_are_the_losses_clip_parameters_else_point_two() -> None:
    assert clip_bounds(TrainingConfig(loss="ppo", loss_params={"clip_low": 0.1, "clip_high": 0.28}).loss_params) == (
        0.1, 0.28)
    assert clip_bounds(TrainingConfig(loss="decoupled_ppo").loss_params) == (0.2, 0.2)
    assert clip_bounds(TrainingConfig(loss="cispo", loss_params={"eps_high": 4.0}).loss_params) == (0.2, 0.2)
    assert clip_bounds(TrainingConfig(loss="tis").loss_params) == (0.2, 0.2)


def test_policy_loss_reports_them_while_clip_fraction_stays_zero() -> None:
    """One optimizer step per batch: logp = prox, so r = 1 and clip_fraction is 0; the behaviour metrics are not."""
    prox = _t([-1.0, -1.0, -1.0])
    behav = prox - _t([LN(1.5), LN(0.5), 0.0])
    cfg = TrainingConfig(loss="ppo", loss_params={"clip_low": 0.2, "clip_high": 0.6})
    _, m = policy_loss(cfg, prox.clone(), prox, behav, _t([1.0, -1.0, 1.0]), torch.ones(1, 3), torch.ones(1))
    assert m["clip_fraction"] == 0.0
    assert m["behav_clip_fraction"] == pytest.approx(1 / 3)  # w = [1.5, 0.5, 1] against [0.8, 1.6]: 0.5 is out
    assert m["gap_abs"] == pytest.approx((LN(1.5) + LN(2.0)) / 3, abs=1e-6)
    assert m["gap_abs"] == pytest.approx(m["behav_prox_abs_diff"], abs=1e-7)
    assert m["gap_k3"] == pytest.approx(((0.5 - LN(1.5)) + (-0.5 - LN(0.5))) / 3, abs=1e-6)


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_merged_micro_batches_give_the_whole_batch_figures(aggregation: str) -> None:
    torch.manual_seed(3)
    cfg = TrainingConfig(loss="decoupled_ppo", aggregation=aggregation)
    logp = torch.randn(4, 5) * 0.3 - 1
    behav = logp + torch.randn(4, 5) * 0.3
    adv = torch.randn(4, 5)
    mask = torch.tensor([[1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 0, 0, 0, 0], [1, 1, 0, 0, 0]], dtype=torch.float32)
    rewards = torch.tensor([1.0, 0.0, 1.0, 0.0])
    _, whole = policy_loss(cfg, logp, logp, behav, adv, mask, rewards)
    parts = [policy_loss(cfg, logp[s], logp[s], behav[s], adv[s], mask[s], rewards[s], num_samples=4,
                         num_tokens=11)[1] for s in (slice(0, 1), slice(1, 3), slice(3, 4))]
    merged = merge_metrics(parts)
    assert 0.0 < whole["behav_clip_fraction"] < 1.0 and whole["gap_k3"] > 0.0
    for key in ("behav_clip_fraction", "gap_abs", "gap_k3"):
        assert merged[key] == pytest.approx(whole[key], abs=1e-6), key
