"""The rounds benchmark's arithmetic: each end-to-end run against the raw engines around it, exact numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from efficiency_rounds import round_ratios, summarise  # noqa: E402


def test_each_round_is_compared_with_the_raws_around_it() -> None:
    rounds = round_ratios([2000.0, 1600.0, 2400.0], [900.0, 1000.0])
    assert rounds[0] == {"raw_before": 2000.0, "e2e": 900.0, "raw_after": 1600.0, "raw_mean": 1800.0,
                         "e2e_vs_raw_before": 0.45, "e2e_vs_raw_mean": 0.5}
    assert rounds[1]["raw_mean"] == 2000.0
    assert rounds[1]["e2e_vs_raw_before"] == 0.625
    assert rounds[1]["e2e_vs_raw_mean"] == 0.5


def test_a_failed_part_gives_no_ratio_for_its_rounds() -> None:
    rounds = round_ratios([2000.0, None, 2000.0], [1000.0, None])
    assert rounds[0]["e2e_vs_raw_before"] == 0.5
    assert rounds[0]["raw_mean"] is None and rounds[0]["e2e_vs_raw_mean"] is None
    assert rounds[1]["e2e_vs_raw_before"] is None and rounds[1]["e2e_vs_raw_mean"] is None


def test_summary_counts_rounds_at_the_target() -> None:
    rounds = round_ratios([2000.0, 2000.0, 2000.0, 2000.0], [900.0, 1000.0, 1100.0])
    s = summarise(rounds)
    assert s["e2e_vs_raw_mean"] == {"median": 0.5, "min": 0.45, "max": 0.55, "rounds": 3, "at_or_above_target": 2}
    assert summarise(round_ratios([None, None], [None]))["e2e_vs_raw_mean"]["median"] is None


def test_raws_must_bracket_every_round() -> None:
    with pytest.raises(ValueError, match="raws: expected 3 figures"):
        round_ratios([1.0, 2.0], [1.0, 1.0])
