"""GRPO and GAE advantages against hand-computed numbers (docs/algorithms.md §2)."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.training.advantages import gae, group_advantages, grpo_advantages
from asyncrl.types import Group, Sample


def test_grpo_binary_rewards() -> None:
    # mean 0.5; deviations ±0.5; unbiased var = 4·0.25/3 = 1/3, std = 0.577350...
    a = grpo_advantages(torch.tensor([1.0, 0.0, 0.0, 1.0]))
    expected = 0.5 / (math.sqrt(1 / 3) + 1e-6)
    assert torch.allclose(a, torch.tensor([expected, -expected, -expected, expected]), atol=1e-7)


def test_grpo_unequal_rewards_and_dr_grpo() -> None:
    # mean 5; deviations -3, -1, 4; unbiased var = (9 + 1 + 16) / 2 = 13
    r = torch.tensor([2.0, 4.0, 9.0])
    s = math.sqrt(13) + 1e-6
    assert torch.allclose(grpo_advantages(r), torch.tensor([-3 / s, -1 / s, 4 / s]), atol=1e-7)
    assert torch.equal(grpo_advantages(r, norm_std=False), torch.tensor([-3.0, -1.0, 4.0]))


def test_grpo_degenerate_groups() -> None:
    assert torch.equal(grpo_advantages(torch.tensor([1.0])), torch.tensor([0.0]))
    assert torch.equal(grpo_advantages(torch.tensor([0.7, 0.7, 0.7])), torch.zeros(3))  # 0 / (0 + 1e-6)
    with pytest.raises(ValueError, match="rewards"):
        grpo_advantages(torch.zeros(2, 2))


def test_group_advantages_per_group() -> None:
    def group(gid: str, rewards: list[float]) -> Group:
        samples = [Sample(gid, i, [1], [2], [-0.1], [0], 0, reward=r) for i, r in enumerate(rewards)]
        return Group(gid, 0, "t", samples)

    out = group_advantages([group("a", [1.0, 0.0]), group("b", [3.0])], norm_std=False)
    assert [t.tolist() for t in out] == [[0.5, -0.5], [0.0]]


def test_gae_single_row() -> None:
    # γ = 1, λ = 0.5, V = [0.5, 0.6, 0.7], reward 1 after the last token (V after it = 0):
    # δ2 = 1 - 0.7 = 0.3, δ1 = 0.7 - 0.6 = 0.1, δ0 = 0.6 - 0.5 = 0.1
    # A2 = 0.3, A1 = 0.1 + 0.5·0.3 = 0.25, A0 = 0.1 + 0.5·0.25 = 0.225; R = A + V
    adv, ret = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7]), gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([0.225, 0.25, 0.3]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([0.725, 0.85, 1.0]), atol=1e-6)


def test_gae_discounted() -> None:
    # γ = 0.9, λ = 0.5 (γλ = 0.45): δ2 = 0.3, δ1 = 0.9·0.7 - 0.6 = 0.03, δ0 = 0.9·0.6 - 0.5 = 0.04
    # A2 = 0.3, A1 = 0.03 + 0.45·0.3 = 0.165, A0 = 0.04 + 0.45·0.165 = 0.11425
    adv, _ = gae(torch.tensor([0.0, 0.0, 1.0]), torch.tensor([0.5, 0.6, 0.7]), gamma=0.9, lam=0.5)
    assert torch.allclose(adv, torch.tensor([0.11425, 0.165, 0.3]), atol=1e-6)


def test_gae_batched_with_padding() -> None:
    # Row 1 has 2 valid tokens; the pad value 9 must not leak: δ1 = 1 - 0.4 = 0.6, δ0 = 0.4 - 0.2 = 0.2,
    # A1 = 0.6, A0 = 0.2 + 0.5·0.6 = 0.5, R = [0.7, 1.0, 0].
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.0, 1.0, 0.0]])
    values = torch.tensor([[0.5, 0.6, 0.7], [0.2, 0.4, 9.0]])
    mask = torch.tensor([[1.0, 1.0, 1.0], [1.0, 1.0, 0.0]])
    adv, ret = gae(rewards, values, mask, gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.225, 0.25, 0.3], [0.5, 0.6, 0.0]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.725, 0.85, 1.0], [0.7, 1.0, 0.0]]), atol=1e-6)
    with pytest.raises(ValueError, match="values"):
        gae(rewards, values[:, :2])


def test_grpo_flat_batch_with_interleaved_groups() -> None:
    from asyncrl.training.advantages import grpo

    # group "a" = rows 0, 2 (rewards 1, 0), group "b" = rows 1, 3, 4 (2, 4, 9), group "c" = row 5 alone
    rewards = torch.tensor([1.0, 2.0, 0.0, 4.0, 9.0, 3.0])
    a = grpo(rewards, ["a", "b", "a", "b", "b", "c"])
    sa, sb = math.sqrt(0.5) + 1e-6, math.sqrt(13) + 1e-6
    assert torch.allclose(a, torch.tensor([0.5 / sa, -3 / sb, -0.5 / sa, -1 / sb, 4 / sb, 0.0]), atol=1e-6)
    dr = grpo(rewards, torch.tensor([0, 1, 0, 1, 1, 2]), norm_std=False)
    assert torch.allclose(dr, torch.tensor([0.5, -3.0, -0.5, -1.0, 4.0, 0.0]))
    with pytest.raises(ValueError, match="group_ids"):
        grpo(rewards, [0, 1])


def test_outcome_token_rewards_on_last_valid_token() -> None:
    from asyncrl.training.advantages import outcome_token_rewards

    mask = torch.tensor([[0.0, 1.0, 1.0, 0.0], [0.0, 0.0, 0.0, 0.0], [1.0, 0.0, 1.0, 1.0]])
    out = outcome_token_rewards(torch.tensor([1.0, 5.0, -2.0]), mask)
    assert torch.equal(out, torch.tensor([[0.0, 0.0, 1.0, 0.0], [0.0] * 4, [0.0, 0.0, 0.0, -2.0]]))


def test_gae_skips_masked_positions_inside_a_row() -> None:
    # Valid tokens at 0, 2, 3 (position 1 is an environment observation, V = 9 and reward 7 there are ignored).
    # γ = 1, λ = 0.5, V = [0.5, -, 0.6, 0.7], reward 1 after the last token: as the contiguous case,
    # A = [0.225, 0, 0.25, 0.3], R = [0.725, 0, 0.85, 1.0].
    adv, ret = gae(torch.tensor([[0.0, 7.0, 0.0, 1.0]]), torch.tensor([[0.5, 9.0, 0.6, 0.7]]),
                   torch.tensor([[1.0, 0.0, 1.0, 1.0]]), gamma=1.0, lam=0.5)
    assert torch.allclose(adv, torch.tensor([[0.225, 0.0, 0.25, 0.3]]), atol=1e-6)
    assert torch.allclose(ret, torch.tensor([[0.725, 0.0, 0.85, 1.0]]), atol=1e-6)
    nan_v = torch.tensor([[0.5, float("nan"), 0.6, 0.7]])
    _, ret = gae(torch.tensor([[0.0, 0.0, 0.0, 1.0]]), nan_v, torch.tensor([[1.0, 0.0, 1.0, 1.0]]), gamma=1.0, lam=0.5)
    assert torch.isfinite(ret).all()
