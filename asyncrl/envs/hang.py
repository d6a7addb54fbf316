"""Hang detection: which trajectories have made no progress for too long.

`ProgressWatch` is pure bookkeeping over an injected clock: the driver `touch`es a key (a trajectory) on every sign
of progress (a token batch, an environment step) with a short description of what it is waiting for next, `forget`s
it when the trajectory ends, and polls `stalled()` from time to time to log the stuck ones.

Invariants:
- a key is stalled when `now - last touch > report_after_s`;
- each stall is reported once: a key reported by `stalled()` is not reported again until it is touched again and
  then stays idle past the threshold again;
- `stalled()` lists the longest idle first (ties by key insertion order).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Hashable


class ProgressWatch:
    """Last-progress times of live keys; see the module docstring."""

    def __init__(self, report_after_s: float, clock: Callable[[], float] = time.monotonic) -> None:
        if not report_after_s > 0:
            raise ValueError(f"report_after_s: expected > 0, got {report_after_s}")
        self.report_after_s = report_after_s
        self.clock = clock
        self._last: dict[Hashable, tuple[float, str]] = {}
        self._reported: set[Hashable] = set()

    def touch(self, key: Hashable, what: str) -> None:
        """`key` made progress now; `what` says what it waits for next (shown if it stalls)."""
        self._last.pop(key, None)  # re-insert: insertion order then follows the touch order
        self._last[key] = (self.clock(), what)
        self._reported.discard(key)

    def forget(self, key: Hashable) -> None:
        """`key` ended; it is no longer watched (a no-op for an unknown key)."""
        self._last.pop(key, None)
        self._reported.discard(key)

    def __len__(self) -> int:
        return len(self._last)

    def stalled(self, now: float | None = None) -> list[tuple[Hashable, float, str]]:
        """(key, seconds idle, what) of keys newly idle for more than report_after_s, longest idle first."""
        t = self.clock() if now is None else now
        out: list[tuple[Hashable, float, str]] = []
        for key, (last, what) in self._last.items():
            idle = t - last
            if idle > self.report_after_s and key not in self._reported:
                self._reported.add(key)
                out.append((key, idle, what))
        out.sort(key=lambda x: -x[1])  # stable: ties keep insertion (touch) order
        return out
