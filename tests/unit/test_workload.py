"""Workload shaping and rollout rates: decode budgets, the loss mask past the first EOS, server rates."""

import math
import statistics

import pytest

from asyncrl.rollout.workload import decode_budget, loss_mask_to_first_eos, server_rates


def test_decode_budget_is_deterministic_clipped_and_long_tailed():
    assert decode_budget(7, 16, 1.0, 64) == decode_budget(7, 16, 1.0, 64)
    assert decode_budget(3, 16, 0.0, 64) == 16
    draws = [decode_budget(s, 16, 1.0, 1000) for s in range(4000)]
    assert all(1 <= d <= 1000 for d in draws)
    assert 14 <= statistics.median(draws) <= 18  # median of a lognormal is exp(mu)
    assert statistics.mean(draws) > 1.4 * statistics.median(draws)  # mean = median * exp(sigma^2 / 2) ≈ 1.65×
    assert max(decode_budget(s, 16, 3.0, 64) for s in range(200)) == 64
    with pytest.raises(ValueError, match="median"):
        decode_budget(0, 0, 1.0, 10)
    assert math.isclose(math.exp(0.5), 1.6487, rel_tol=1e-4)


def test_loss_mask_to_first_eos():
    assert loss_mask_to_first_eos([5, 6, 2, 7, 2], eos_id=2) == [1, 1, 1, 0, 0]
    assert loss_mask_to_first_eos([5, 6], eos_id=2) == [1, 1]
    assert loss_mask_to_first_eos([], eos_id=2) == []


def test_server_rates_between_two_health_snapshots():
    before = [{"uptime_s": 10.0, "busy_s": 4.0, "tokens_generated": 100}, {"uptime_s": 5.0, "busy_s": 1.0,
                                                                          "tokens_generated": 50}, {}]
    after = [{"uptime_s": 20.0, "busy_s": 9.0, "tokens_generated": 300}, {"uptime_s": 1.0, "busy_s": 0.5,
                                                                         "tokens_generated": 3}, {"uptime_s": 1}]
    assert server_rates(before, after) == [{"busy_fraction": 0.5, "tokens_per_s": 20.0}, {}, {}]
