"""Bounded staleness on the trainer side (docs/algorithms.md §1), exact."""

from __future__ import annotations

import pytest

from asyncrl.training.staleness import split_stale, staleness_stats
from asyncrl.types import Group, Sample


def _group(gid: str, starts: list[int], versions: list[list[int]] | None = None) -> Group:
    versions = versions or [[s, s] for s in starts]
    samples = [
        Sample(gid, i, [1], [2] * len(v), [-0.1] * len(v), v, s) for i, (s, v) in enumerate(zip(starts, versions, strict=True))
    ]
    return Group(gid, 0, "t", samples)


def test_split_stale_bound_and_oldest_sample() -> None:
    # step 5, α = 1: keep start_version >= 4. Group "c" has a sample started under 3: dropped whole.
    groups = [_group("a", [5, 5]), _group("b", [4, 4]), _group("c", [4, 3]), _group("d", [2, 2])]
    kept, dropped = split_stale(groups, step=5, alpha=1)
    assert [g.group_id for g in kept] == ["a", "b"]
    assert [g.group_id for g in dropped] == ["c", "d"]


def test_split_stale_synchronous() -> None:
    # α = 0: only samples started under the current version k.
    kept, dropped = split_stale([_group("a", [3]), _group("b", [2])], step=3, alpha=0)
    assert [g.group_id for g in kept] == ["a"] and [g.group_id for g in dropped] == ["b"]
    with pytest.raises(ValueError, match="alpha"):
        split_stale([], step=0, alpha=-1)


def test_staleness_stats() -> None:
    # step 5; samples start at 5, 4, 3 → lags 0, 1, 2: mean 1, max 2.
    # tokens: [5, 5], [4, 5], [3, 3] → token lags 0,0,1,0,2,2: mean 5/6; stale tokens 3/6.
    # partial rollouts: only the sample with versions [4, 5] spans an update: 1/3.
    groups = [_group("a", [5, 4], [[5, 5], [4, 5]]), _group("b", [3], [[3, 3]])]
    stats = staleness_stats(groups, step=5)
    assert stats == {
        "staleness_mean": 1.0,
        "staleness_max": 2.0,
        "token_staleness_mean": 5 / 6,
        "stale_token_fraction": 0.5,
        "partial_rollout_fraction": 1 / 3,
    }
    assert staleness_stats([], step=3)["staleness_max"] == 0.0
