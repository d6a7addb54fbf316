"""pass@k of the held-out evaluation (asyncrl/evaluation/single_turn.py): a problem passes when any of its k
samples is correct (reward >= 1)."""

from __future__ import annotations

import pytest

from asyncrl.evaluation.single_turn import pass_at_k
from asyncrl.roles.periodic_eval import point_metrics


def test_a_problem_passes_when_any_of_its_samples_is_correct():
    rewards = [0.0, 0.0, 1.0, 0.0,  # problem 0: its third sample
               0.0, 0.5, 0.0, 0.0,  # problem 1: partial reward is not correct
               1.0, 1.0, 1.0, 1.0]  # problem 2
    assert pass_at_k(rewards, 4) == pytest.approx(2 / 3)
    assert pass_at_k([0.0, 1.0], 1) == 0.5  # k = 1: the sampled accuracy


@pytest.mark.parametrize("rewards,k", [([], 4), ([1.0, 0.0, 0.0], 2), ([1.0], 0)])
def test_rewards_that_are_not_k_per_problem_are_refused(rewards, k):
    with pytest.raises(ValueError, match="pass_at_k: expected k >= 1 and a positive multiple of k rewards"):
        pass_at_k(rewards, k)


def test_pass_at_k_is_logged_with_its_k():
    m = point_metrics({"accuracy": 0.5, "correct": 1, "n": 2, "versions": [0], "pass_at_k": 0.75, "k": 4,
                       "pass_k_n": 64}, 1.0, 1)
    assert (m["eval/pass_at_k"], m["eval/k"], m["eval/pass_k_n"]) == (0.75, 4.0, 64.0)
