"""Rows of zero advantage left out of the trainer's computation (`asyncrl.training.zero_advantage`): which rows, when,
and that each built-in loss it relies on is exactly zero, gradient included, at A = 0."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.loss_params import loss_params_class
from asyncrl.config.schema import TrainingConfig
from asyncrl.training.loss_registry import LossInputs, token_loss_of
from asyncrl.training.zero_advantage import ADVANTAGE_LINEAR_LOSSES, rows_with_signal, skips_zero_advantage


def test_rows_with_signal_keeps_rows_with_a_nonzero_trained_advantage_in_order() -> None:
    adv = torch.tensor([[0.0, 0.0, 0.5], [0.0, 0.0, 0.0], [0.0, -1.0, 0.0], [0.0, 2.0, 0.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0], [0.0, 1.0, 1.0], [0.0, 1.0, 0.0], [0.0, 0.0, 1.0]])
    # row 3's advantage sits on an untrained column: no gradient, left out
    assert rows_with_signal(adv, mask) == [0, 2]


def test_rows_with_signal_keeps_one_row_when_none_has_signal() -> None:
    assert rows_with_signal(torch.zeros(3, 4), torch.ones(3, 4)) == [0]


@pytest.mark.parametrize(("changes", "expected"), [
    ({}, True),
    ({"skip_zero_advantage": False}, False),
    ({"kl_coef": 0.1}, False),
    ({"loss": "ppo"}, True),
    ({"loss": "cispo"}, True),
])
def test_skips_only_when_no_term_reads_a_zero_advantage_row(changes: dict, expected: bool) -> None:
    assert skips_zero_advantage(TrainingConfig(**changes), ent_coef=0.0) is expected


def test_an_entropy_bonus_turns_skipping_off() -> None:
    assert not skips_zero_advantage(TrainingConfig(), ent_coef=0.01)


@pytest.mark.parametrize("name", sorted(ADVANTAGE_LINEAR_LOSSES))
def test_builtin_loss_is_zero_with_zero_gradient_at_zero_advantage(name: str) -> None:
    torch.manual_seed(0)
    logp = (-torch.rand(2, 5) * 3).requires_grad_()
    behav = logp.detach() + 0.3 * torch.randn(2, 5)  # off-policy, so importance weights and clipping are live
    inputs = LossInputs(logp=logp, prox=logp.detach() - 0.2, behav=behav, adv=torch.zeros(2, 5),
                        positive=torch.tensor([[True] * 5, [False] * 5]), mask=torch.ones(2, 5, dtype=torch.bool))
    loss = token_loss_of(loss_params_class(name)(), inputs).loss
    assert torch.equal(loss, torch.zeros_like(loss))
    loss.sum().backward()
    assert torch.equal(logp.grad, torch.zeros_like(logp))
