"""`ActivityCounters` (the cumulative /health counters of the generation engine) with a hand-driven clock."""

from __future__ import annotations

import pytest

from asyncrl.generation.engine import ActivityCounters


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_overlapping_requests_count_busy_time_once() -> None:
    clock = Clock()
    c = ActivityCounters(clock)
    clock.t = 101.0
    c.begin()  # busy from 101
    clock.t = 102.0
    c.begin()
    clock.t = 103.0
    c.end(finished=True)
    assert c.snapshot()["busy_s"] == 2.0  # the open interval counts up to now
    clock.t = 104.5
    c.end(finished=False)  # idle from 104.5: 3.5 s busy
    clock.t = 110.0
    c.begin()
    clock.t = 111.0
    c.tokens_generated += 7
    assert c.snapshot() == {"uptime_s": 11.0, "busy_s": 4.5, "tokens_generated": 7, "requests_finished": 1,
                            "requests_aborted": 1, "updates": 0}
    clock.t = 112.0
    c.end(finished=True)
    c.updates += 1
    clock.t = 120.0
    assert c.snapshot() == {"uptime_s": 20.0, "busy_s": 5.5, "tokens_generated": 7, "requests_finished": 2,
                            "requests_aborted": 1, "updates": 1}


def test_end_without_begin_is_an_error() -> None:
    c = ActivityCounters(Clock())
    with pytest.raises(RuntimeError, match="without a matching begin"):
        c.end(finished=True)
