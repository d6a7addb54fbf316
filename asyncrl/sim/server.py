"""One simulated generation server: continuous batching advanced analytically between events.

Model: up to `max_seqs` requests run; the rest wait FIFO. A decode step gives every running request one token
and takes `f·(a + b·B + c·C)` seconds (B running requests, C their summed context tokens, f the slow-down
factor). Between two events B is constant and C grows by B per step, so advancing by x steps (x real, a fluid
approximation of whole steps) takes `f·(x·(a + b·B + c·C0) + c·B·x²/2)`; the inverse is a quadratic root. No
per-token loop: an event costs O(log B) plus the requests it touches.

A joining request first stalls the server for its prefill, the engine's own per-request work and the control-plane
CPU it shares the cores with (`prefill_per_token · context + request_s + cpu_s`); `charge` stalls it the same way
for a control-plane call's CPU (a reward call for the requests one completion returned); a weight-sync pause
stops decoding until `paused_until` (running requests then continue: partial rollout).

Invariants: `steps` never decreases; a running request has generated `steps − join_step` tokens (fluid) and
finishes when `steps` reaches its `finish_step`; `busy_s` counts time with at least one running request, not
paused.
"""

from __future__ import annotations

import heapq
import math
from dataclasses import dataclass

from asyncrl.sim.cost_model import CostModel

__all__ = ["SimServer"]

_EPS = 1e-6


@dataclass
class _Req:
    rid: str
    context: int  # tokens sent (prompt + earlier turns)
    new_tokens: int  # tokens this request will generate
    cpu_s: float = 0.0  # control-plane CPU spent on this server's time when it joins (shared cores)
    join_step: float = 0.0
    finish_step: float = 0.0


class SimServer:
    """A generation server of the simulator (see the module docstring)."""

    def __init__(self, index: int, cost: CostModel) -> None:
        self.index = index
        self.cost = cost
        self.t = 0.0  # time up to which the state is advanced
        self.steps = 0.0
        self.ctx = 0.0  # summed context of the running requests at `steps`
        self.running: dict[str, _Req] = {}
        self.waiting: dict[str, _Req] = {}  # FIFO by insertion order
        self._heap: list[tuple[float, str]] = []
        self.stall = 0.0  # prefill seconds still to spend before decoding
        self.paused_until = 0.0
        self.factor = 1.0
        self.failed = False
        self.busy_s = 0.0
        self.epoch = 0  # bumped on every change; completion events of older epochs are stale
        self.tokens_generated = 0.0

    # ---- time ---------------------------------------------------------------------------------------------------
    def _k(self) -> float:
        c = self.cost
        return c.decode_a + c.decode_b * len(self.running) + c.decode_c * self.ctx

    def _time_for(self, dx: float) -> float:
        return self.factor * (dx * self._k() + self.cost.decode_c * len(self.running) * dx * dx / 2)

    def _steps_in(self, dt: float) -> float:
        k, q = self._k(), self.cost.decode_c * len(self.running) / 2
        u = dt / self.factor
        if q <= 0:
            return u / k if k > 0 else math.inf
        return 2 * u / (k + math.sqrt(k * k + 4 * q * u))

    def advance(self, t: float) -> None:
        """Bring the state to time t (t ≥ self.t)."""
        if t <= self.t:
            return
        start = max(self.t, self.paused_until)
        if start < t and self.running:
            avail = t - start
            s = min(self.stall, avail)
            self.stall -= s
            self.busy_s += s
            avail -= s
            if avail > 0:
                dx = self._steps_in(avail)
                self.steps += dx
                self.ctx += len(self.running) * dx
                self.tokens_generated += len(self.running) * dx
                self.busy_s += avail
        self.t = t

    def next_completion(self) -> float:
        """The time of the next request completion (inf if none runs)."""
        top = self._top()
        if top is None:
            return math.inf
        start = max(self.t, self.paused_until)
        return start + self.stall + self._time_for(max(0.0, top.finish_step - self.steps))

    # ---- requests -----------------------------------------------------------------------------------------------
    def _top(self) -> _Req | None:
        while self._heap:
            finish, rid = self._heap[0]
            r = self.running.get(rid)
            if r is not None and r.finish_step == finish:
                return r
            heapq.heappop(self._heap)
        return None

    def _admit_waiting(self) -> None:
        while self.waiting and len(self.running) < self.cost.max_seqs:
            rid = next(iter(self.waiting))
            r = self.waiting.pop(rid)
            r.join_step, r.finish_step = self.steps, self.steps + r.new_tokens
            self.running[rid] = r
            self.ctx += r.context
            self.stall += self.factor * (self.cost.prefill_per_token * r.context + self.cost.request_s + r.cpu_s)
            heapq.heappush(self._heap, (r.finish_step, rid))

    def charge(self, t: float, cpu_s: float) -> None:
        """Spend `cpu_s` seconds of the shared cores (a control-plane call) on this server's time from t on; an idle
        server loses nothing (the cores were free)."""
        self.advance(t)
        if self.running:
            self.stall += self.factor * cpu_s
            self.epoch += 1

    def submit(self, t: float, rid: str, context: int, new_tokens: int, cpu_s: float = 0.0) -> None:
        self.advance(t)
        self.waiting[rid] = _Req(rid, context, new_tokens, cpu_s)
        self._admit_waiting()
        self.epoch += 1

    def remove(self, t: float, rid: str) -> int:
        """Abort a request: it leaves the server; returns the whole tokens it had generated."""
        self.advance(t)
        self.epoch += 1
        if self.waiting.pop(rid, None) is not None:
            return 0
        r = self.running.pop(rid, None)
        if r is None:
            return 0
        done = self.steps - r.join_step
        self.ctx -= r.context + done
        if not self.running:
            self.ctx, self.stall = 0.0, 0.0
        self._admit_waiting()
        return min(r.new_tokens, int(done + _EPS))

    def complete(self, t: float) -> list[tuple[str, int]]:
        """At its scheduled completion time: the requests that finished (rid, new tokens)."""
        self.advance(t)
        self.epoch += 1
        top = self._top()
        if top is not None and top.finish_step - self.steps < 1e-3:
            # the event was computed to land exactly on this finish step: snap off the rounding error
            self.ctx += len(self.running) * max(0.0, top.finish_step - self.steps)
            self.steps = max(self.steps, top.finish_step)
        out: list[tuple[str, int]] = []
        while (top := self._top()) is not None and top.finish_step <= self.steps + _EPS:
            heapq.heappop(self._heap)
            del self.running[top.rid]
            self.ctx -= top.context + top.new_tokens
            out.append((top.rid, top.new_tokens))
        if not self.running:
            self.ctx, self.stall = 0.0, 0.0
        self._admit_waiting()
        return out

    def pause(self, t: float, until: float) -> None:
        self.advance(t)
        self.paused_until = max(self.paused_until, until)
        self.epoch += 1

    def set_factor(self, t: float, factor: float) -> None:
        self.advance(t)
        self.factor = factor
        self.epoch += 1

    def fail(self, t: float) -> list[str]:
        """The server dies: every request on it is lost (returned); it takes no more work."""
        self.advance(t)
        self.epoch += 1
        self.failed = True
        lost = list(self.running) + list(self.waiting)
        self.running.clear()
        self.waiting.clear()
        self._heap.clear()
        self.ctx = 0.0
        return lost

    @property
    def load(self) -> int:
        return len(self.running) + len(self.waiting)
