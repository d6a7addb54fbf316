"""AsyPPO masks and critic ownership: exact hand-computed cases (docs/algorithms.md §4)."""

from __future__ import annotations

import pytest
import torch

from asyncrl.training.asyppo import critic_owner, disagreement_masks

# Valid positions (flattened b·T + t): 1, 2, 3 (row 0) and 5, 6 (row 1) → n = 5.
MASK = torch.tensor([[0, 1, 1, 1], [0, 1, 1, 0]], dtype=torch.float32)


def _two_critics(sigma: list[list[float]]) -> torch.Tensor:
    """Values of 2 critics whose population std is `sigma`: critic 0 = 0, critic 1 = 2σ."""
    s = torch.tensor(sigma, dtype=torch.float32)
    return torch.stack([torch.zeros_like(s), 2 * s])


def test_masks_pick_lowest_and_highest_sigma() -> None:
    # σ at valid positions: p1 .5, p2 .125, p3 .375, p5 .25, p6 .4375. Invalid p0 = 9 (highest of all)
    # and p7 = .0625 (lowest of all) must never be picked.
    values = _two_critics([[4.5, 0.5, 0.125, 0.375], [4.5, 0.25, 0.4375, 0.0625]])
    assert torch.equal(values.std(dim=0, correction=0)[0], torch.tensor([4.5, 0.5, 0.125, 0.375]))
    adv, ent = disagreement_masks(values, MASK, k=0.4, h=0.4)  # ⌊0.4·5⌋ = 2 each
    assert adv.tolist() == [[0, 1, 0, 1], [0, 0, 1, 0]]  # lowest σ: p2 (.125), p5 (.25)
    assert ent.tolist() == [[0, 0, 1, 1], [0, 1, 0, 0]]  # highest σ: p1 (.5), p6 (.4375)
    adv, ent = disagreement_masks(values, MASK)  # defaults k = h = 0.2: ⌊1⌋ = 1 each
    assert adv.tolist() == [[0, 1, 0, 1], [0, 1, 1, 0]]
    assert ent.tolist() == [[0, 0, 1, 1], [0, 1, 1, 0]]
    assert adv.dtype == torch.float32 and adv.shape == MASK.shape
    adv, ent = disagreement_masks(values, MASK, k=0.3, h=0.39)  # ⌊1.5⌋ = 1, ⌊1.95⌋ = 1
    assert adv.sum().item() == 4 and ent.sum().item() == 4


def test_ties_are_broken_by_position_earlier_first() -> None:
    # All σ equal: both selections take the earliest valid positions p1, p2.
    values = torch.ones(3, 2, 4)
    adv, ent = disagreement_masks(values, MASK, k=0.4, h=0.4)
    assert adv.tolist() == [[0, 0, 0, 1], [0, 1, 1, 0]]
    assert ent.tolist() == [[0, 0, 0, 1], [0, 1, 1, 0]]
    # σ: p1 .25, p2 .5, p3 .25, p5 .25, p6 .5 (pads .25 / .5 as decoys).
    values = _two_critics([[0.5, 0.25, 0.5, 0.25], [0.25, 0.25, 0.5, 0.25]])
    adv, ent = disagreement_masks(values, MASK, k=0.4, h=0.2)
    assert adv.tolist() == [[0, 0, 1, 0], [0, 1, 1, 0]]  # lowest three tie: p1, p3 taken, p5 kept
    assert ent.tolist() == [[0, 1, 0, 1], [0, 1, 1, 0]]  # highest two tie: p2 taken, p6 kept
    _, ent = disagreement_masks(values, MASK, k=0.4, h=0.4)
    assert ent.tolist() == [[0, 1, 0, 1], [0, 1, 0, 0]]


def test_zero_and_full_fractions_and_padding() -> None:
    values = torch.randn(2, 2, 4, generator=torch.Generator().manual_seed(0))
    adv, ent = disagreement_masks(values, MASK, k=0.0, h=0.0)
    assert torch.equal(adv, MASK) and torch.equal(ent, MASK)
    adv, ent = disagreement_masks(values, MASK, k=1.0, h=1.0)
    assert adv.abs().sum().item() == 0 and ent.abs().sum().item() == 0
    # NaN on a padding position is ignored; float64 values give float64 masks.
    values64 = values.double()
    values64[:, 1, 3] = float("nan")
    adv, _ = disagreement_masks(values64, MASK, k=0.2)
    assert adv.dtype == torch.float64 and adv[1, 3].item() == 0 and adv.sum().item() == 4
    # An all-padding batch selects nothing.
    adv, ent = disagreement_masks(values, torch.zeros(2, 4), k=0.5, h=0.5)
    assert adv.abs().sum().item() == 0 and ent.abs().sum().item() == 0


def test_mask_errors_name_the_argument() -> None:
    values = torch.zeros(2, 2, 4)
    with pytest.raises(ValueError, match="at least 2 critics"):
        disagreement_masks(torch.zeros(1, 2, 4), MASK)
    with pytest.raises(ValueError, match=r"values: expected a 3-D"):
        disagreement_masks(torch.zeros(2, 4), MASK)
    with pytest.raises(ValueError, match=r"values: expected a floating"):
        disagreement_masks(torch.zeros(2, 2, 4, dtype=torch.long), MASK)
    with pytest.raises(ValueError, match=r"mask: expected shape \(2, 4\)"):
        disagreement_masks(values, torch.ones(2, 5))
    with pytest.raises(ValueError, match="mask: expected only 0 and 1"):
        disagreement_masks(values, MASK * 0.5)
    with pytest.raises(ValueError, match="k: expected a fraction"):
        disagreement_masks(values, MASK, k=1.5)
    with pytest.raises(ValueError, match="h: expected a fraction"):
        disagreement_masks(values, MASK, h=-0.1)
    bad = values.clone()
    bad[0, 0, 1] = float("inf")
    with pytest.raises(ValueError, match="values: expected finite"):
        disagreement_masks(bad, MASK)


def test_critic_owner_blocks() -> None:
    assert critic_owner(torch.arange(8), 8, 2).tolist() == [0, 0, 0, 0, 1, 1, 1, 1]
    assert critic_owner(torch.arange(5), 5, 2).tolist() == [0, 0, 0, 1, 1]
    assert critic_owner(torch.arange(3), 3, 3).tolist() == [0, 1, 2]
    assert critic_owner(torch.arange(4), 4, 1).tolist() == [0, 0, 0, 0]
    # Per-sample group sizes: a group of 3 then a group of 2, M = 2.
    out = critic_owner(torch.tensor([0, 1, 2, 0, 1]), torch.tensor([3, 3, 3, 2, 2]), 2)
    assert out.tolist() == [0, 0, 1, 0, 1] and out.dtype == torch.long
    for g, m in ((8, 2), (5, 2), (7, 3), (3, 3)):  # each critic gets ⌊G/M⌋ or ⌈G/M⌉
        counts = torch.bincount(critic_owner(torch.arange(g), g, m), minlength=m)
        assert counts.min().item() == g // m and counts.max().item() == -(-g // m)


def test_critic_owner_errors() -> None:
    with pytest.raises(ValueError, match="num_critics"):
        critic_owner(torch.arange(4), 4, 0)
    with pytest.raises(ValueError, match="index_in_group: expected 0 <= index"):
        critic_owner(torch.tensor([0, 4]), 4, 2)
    with pytest.raises(ValueError, match="index_in_group: expected an integer"):
        critic_owner(torch.tensor([0.0, 1.0]), 4, 2)
    with pytest.raises(ValueError, match="group_size: expected >= 1"):
        critic_owner(torch.tensor([0]), 0, 2)
    with pytest.raises(ValueError, match="group_size: expected a scalar or shape"):
        critic_owner(torch.tensor([0, 1]), torch.tensor([2, 2, 2]), 2)

