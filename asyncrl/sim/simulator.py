"""The discrete-event simulator: drives ONE real `RolloutScheduler` with a virtual clock, like the environment role.

The loop: offer prompts while `can_admit()`; a `Start` becomes a request on a `SimServer` (continuous batching,
advanced analytically); a completion → `request_finished` → (agentic: environment latency → `env_stepped`) →
reward latency → `sample_scored`; an `Abort` takes the request off its server (with `resubmit`, its partial
tokens come back through `request_finished(..., aborted=True)`); an `EmitGroup` queues the group for the trainer.
The trainer reads groups in order, drops those with start_version < k − α, trains W groups (cost model), syncs
the weights (servers paused; running requests continue afterwards), then calls `version_advanced`.

Failures (our choice, the scheduler API cannot route around a server): a dead server's requests fail at once
(`sample_failed`); a request the scheduler still sends there fails after `fail_timeout_s`, like a request
deadline, and meanwhile counts as work on that server so the scheduler's routing avoids it.

Events at one time run in insertion order; the run is deterministic for a seed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import Counter, deque
from dataclasses import dataclass

from asyncrl.rollout.decisions import Abort, Decision, DropGroup, DropSample, EmitGroup, Start
from asyncrl.rollout.scheduler import RolloutScheduler
from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import CostModel
from asyncrl.sim.report import SimResult, build_result
from asyncrl.sim.server import SimServer
from asyncrl.sim.workload import SamplePlan, Workload

__all__ = ["Simulator", "simulate"]

log = logging.getLogger(__name__)

Key = tuple[str, int]


@dataclass
class _Sample:
    plan: SamplePlan
    prompt_tokens: int
    tokens: int  # context so far (prompt + generated + observations)
    remaining: int  # tokens left in the current generation turn
    started_s: float
    turn: int = 0  # logical turn (a resubmit continues the same turn)
    generated: int = 0


@dataclass
class _Emitted:
    start_version: int
    tokens: int
    generated: int
    samples: int


class Simulator:
    """One simulated run (see the module docstring). `run()` returns a `SimResult`."""

    def __init__(self, config: SimConfig, cost: CostModel, workload: Workload) -> None:
        self.cfg, self.cost, self.wl = config, cost, workload
        self.sched = RolloutScheduler(config.scheduler_config(cost, workload.max_response_tokens))
        self.servers = [SimServer(i, cost) for i in range(config.num_servers(cost))]
        self.train_gpus = config.train_gpus(cost)
        self.now = 0.0
        self._events: list[tuple[float, int, tuple]] = []
        self._seq = itertools.count()
        self._samples: dict[Key, _Sample] = {}
        self._group_keys: dict[str, set[int]] = {}
        self._plans: dict[str, list[SamplePlan]] = {}
        self._per_group = config.group_size + config.extra_samples
        self._rid: dict[str, Key] = {}
        self._dead: dict[str, Key] = {}  # requests sent to a failed server, failing at their deadline
        self._next_prompt = 0
        self._queue: deque[_Emitted] = deque()
        self._batch: list[_Emitted] = []
        self._training = False
        self._train_started = 0.0
        self.k = 0
        self.trained = self.consumed = self.dropped_stale = 0
        self.step_ends: list[float] = []
        self.step_samples: list[tuple[int, int, int]] = []  # per step: samples, tokens, generated tokens
        self.train_busy_s = 0.0
        self.staleness: Counter[int] = Counter()
        self.latencies: list[float] = []
        self.failed_requests = 0
        self._events_done = 0
        self.window: dict[str, float] = {"t": 0.0, "gen_busy_s": 0.0, "train_busy_s": 0.0, "latencies": 0.0}

    # ---- event queue -------------------------------------------------------------------------------------------
    def _push(self, t: float, ev: tuple) -> None:
        heapq.heappush(self._events, (t, next(self._seq), ev))

    def _reschedule(self, s: SimServer) -> None:
        t = s.next_completion()
        if t < math.inf:
            self._push(t, ("srv", s.index, s.epoch))

    # ---- run ---------------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        for f in self.cfg.failures:
            self._push(f.at_s, ("fail", f.server))
        for sd in self.cfg.slowdowns:
            self._push(sd.at_s, ("slow", sd.server, sd.factor))
        self._admit()
        while len(self.step_ends) < self.cfg.steps:
            if not self._events:
                raise RuntimeError(f"simulation stalled at t={self.now:.3f}s after {len(self.step_ends)} steps: "
                                   f"no event left (scheduler {self.sched.counts()}, trainer queue {len(self._queue)})")
            t, _, ev = heapq.heappop(self._events)
            if t > self.cfg.max_sim_s:
                raise RuntimeError(f"simulation passed max_sim_s={self.cfg.max_sim_s} after {len(self.step_ends)} steps")
            self.now = t
            self._handle(ev)
            self._admit()
            self._events_done += 1
            if self.cfg.check_every and self._events_done % self.cfg.check_every == 0:
                self.sched.check_invariants()
        for s in self.servers:
            s.advance(self.now)
        self.sched.check_invariants()
        return build_result(self)

    def _handle(self, ev: tuple) -> None:
        kind = ev[0]
        if kind == "srv":
            s = self.servers[ev[1]]
            if ev[2] != s.epoch:
                return  # stale completion estimate
            done = s.complete(self.now)
            self._reschedule(s)
            for rid, new in done:
                self._finished(rid, new)
        elif kind == "env":
            self._env_done(ev[1], ev[2])
        elif kind == "score":
            key = ev[1]
            st = self._samples.get(key)
            if st is not None:
                self.latencies.append(self.now - st.started_s)
                self._apply(self.sched.sample_scored(key[0], key[1], st.plan.reward))
        elif kind == "train_done":
            self._train_done()
        elif kind == "sync_done":
            self._sync_done()
        elif kind == "timeout":
            key = self._dead.pop(ev[1], None)
            if key is not None:
                self.failed_requests += 1
                self._apply(self.sched.sample_failed(*key))
        elif kind == "fail":
            self._fail(ev[1])
        elif kind == "slow":
            s = self.servers[ev[1]]
            s.set_factor(self.now, ev[2])
            self._reschedule(s)

    def _admit(self) -> None:
        while self.sched.can_admit():
            p = self._next_prompt
            self._next_prompt += 1
            self._apply(self.sched.offer_prompt(p, self.wl.prompt_length(p)))

    # ---- decisions ---------------------------------------------------------------------------------------------
    def _apply(self, decisions: list[Decision]) -> None:
        todo = deque(decisions)
        while todo:
            d = todo.popleft()
            if isinstance(d, Start):
                self._start(d)
            elif isinstance(d, Abort):
                todo.extend(self._abort(d))
            elif isinstance(d, EmitGroup):
                self._emit(d)
            elif isinstance(d, DropGroup):
                self._plans.pop(d.group_id, None)
                for i in self._group_keys.pop(d.group_id, set()):
                    self._samples.pop((d.group_id, i), None)
            elif isinstance(d, DropSample):
                self._forget((d.group_id, d.sample_index))

    def _forget(self, key: Key) -> None:
        self._samples.pop(key, None)
        keys = self._group_keys.get(key[0])
        if keys is not None:
            keys.discard(key[1])

    def _start(self, d: Start) -> None:
        key = (d.group_id, d.sample_index)
        st = self._samples.get(key)
        if st is None:
            plans = self._plans.get(d.group_id)
            if plans is None or len(plans) <= d.sample_index:
                plans = self._plans[d.group_id] = self.wl.plans(d.prompt_index, self._per_group)
            plan = plans[d.sample_index]
            st = _Sample(plan, d.context_tokens, d.context_tokens, plan.response_tokens[0], self.now)
            self._samples[key] = st
            self._group_keys.setdefault(d.group_id, set()).add(d.sample_index)
        st.tokens = d.context_tokens
        rid = d.request_id
        server = self.servers[d.server]
        if server.failed:
            self._dead[rid] = key
            self._push(self.now + self.cfg.fail_timeout_s, ("timeout", rid))
            return
        self._rid[rid] = key
        server.submit(self.now, rid, d.context_tokens, max(1, st.remaining))
        self._reschedule(server)

    def _abort(self, d: Abort) -> list[Decision]:
        key = (d.group_id, d.sample_index)
        if self._dead.pop(d.request_id, None) is not None:
            generated = 0
        else:
            self._rid.pop(d.request_id, None)
            server = self.servers[d.server]
            generated = server.remove(self.now, d.request_id)
            self._reschedule(server)
        st = self._samples.get(key)
        if not d.resubmit:
            self._forget(key)
            return []
        if st is not None:
            st.remaining = max(1, st.remaining - generated)
            st.tokens += generated
            st.generated += generated
        return self.sched.request_finished(d.group_id, d.sample_index, generated, aborted=True)

    def _finished(self, rid: str, new_tokens: int) -> None:
        key = self._rid.pop(rid, None)
        st = self._samples.get(key) if key else None
        if key is None or st is None:
            return
        st.tokens += new_tokens
        st.generated += new_tokens
        st.remaining = 0
        self._apply(self.sched.request_finished(key[0], key[1], new_tokens))
        if self.wl.agentic:
            self._push(self.now + st.plan.env_latency_s[st.turn], ("env", key, st.turn))
        else:
            self._push(self.now + self.wl.reward_latency_s, ("score", key))

    def _env_done(self, key: Key, turn: int) -> None:
        st = self._samples.get(key)
        if st is None or st.turn != turn:
            return
        done = turn + 1 >= len(st.plan.response_tokens)
        obs = 0 if done else st.plan.observation_tokens[turn]
        st.turn += 1
        st.tokens += obs
        if not done:
            st.remaining = st.plan.response_tokens[st.turn]
        self._apply(self.sched.env_stepped(key[0], key[1], obs, done))
        if done:
            self._push(self.now + self.wl.reward_latency_s, ("score", key))

    def _emit(self, d: EmitGroup) -> None:
        tokens = generated = 0
        for i in d.sample_indices:
            st = self._samples.get((d.group_id, i))
            if st is not None:
                tokens += st.tokens
                generated += st.generated
        for i in self._group_keys.pop(d.group_id, set()):
            self._samples.pop((d.group_id, i), None)
        self._plans.pop(d.group_id, None)
        self._queue.append(_Emitted(d.start_version, tokens, generated, len(d.sample_indices)))
        self._feed()

    # ---- trainer -----------------------------------------------------------------------------------------------
    def _feed(self) -> None:
        if self._training:
            return
        w = self.cfg.prompts_per_step
        while self._queue and len(self._batch) < w:
            g = self._queue.popleft()
            self.consumed += 1
            if g.start_version < self.k - self.cfg.alpha:
                self.dropped_stale += 1
            else:
                self._batch.append(g)
        if len(self._batch) < w:
            return
        self._training = True
        dt = self.cost.train_time(sum(g.tokens for g in self._batch), self.train_gpus)
        self._train_started = self.now
        if self.cfg.mode == "sync":  # colocated: the generation GPUs train, then reload the weights
            self._pause_all(self.now + dt + self.cost.sync_time)
        self._push(self.now + dt, ("train_done",))

    def _pause_all(self, until: float) -> None:
        for s in self.servers:
            s.pause(self.now, until)
            self._reschedule(s)

    def _train_done(self) -> None:
        self.train_busy_s += self.now - self._train_started
        if self.cfg.mode == "async":
            self._pause_all(self.now + self.cost.sync_time)
        self._push(self.now + self.cost.sync_time, ("sync_done",))

    def _sync_done(self) -> None:
        for g in self._batch:
            self.staleness[self.k - g.start_version] += g.samples
        self.step_samples.append((sum(g.samples for g in self._batch), sum(g.tokens for g in self._batch),
                                  sum(g.generated for g in self._batch)))
        self._batch = []
        self.k += 1
        self.trained += self.cfg.prompts_per_step
        self.step_ends.append(self.now)
        if len(self.step_ends) == self.cfg.warmup_steps:
            self._snapshot()
        self._training = False
        self._apply(self.sched.version_advanced(self.k, self.trained, self.consumed))
        if self.cfg.check_every == 0:
            self.sched.check_invariants()
        self._feed()

    def _snapshot(self) -> None:
        for s in self.servers:
            s.advance(self.now)
        self.window = {"t": self.now, "gen_busy_s": sum(s.busy_s for s in self.servers),
                       "train_busy_s": self.train_busy_s, "latencies": float(len(self.latencies))}

    def _fail(self, index: int) -> None:
        s = self.servers[index]
        for rid in s.fail(self.now):
            key = self._rid.pop(rid, None)
            if key is not None:
                self.failed_requests += 1
                self._apply(self.sched.sample_failed(*key))


def simulate(config: SimConfig, cost: CostModel, workload: Workload) -> SimResult:
    """Run one simulation and return its report."""
    return Simulator(config, cost, workload).run()
