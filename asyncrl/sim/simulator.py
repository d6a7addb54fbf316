"""The discrete-event simulator: drives ONE real `RolloutScheduler` with a virtual clock, like the environment role.

The loop: offer prompts while `can_admit()`; a `Start` passes the environment writer's CPU and its server's front
end (`FifoStage`s, `env_s` and `frontend_s` per request; on shared cores, `shared_cpu`, that CPU is spent on the
server's time instead, with `env_token_s` and `frontend_token_s` per token it will decode: `CostModel.request_cpu`;
on a control plane with its own cores the per-token work overlaps the decode and only `step_budget` reports it) and
becomes a request on a `SimServer` (continuous batching, advanced analytically); a completion reaches the
environment `http_call_s` later (on shared cores its reward call's `score_call_cpu_s` is spent on the server's time)
→ `request_finished` → (agentic: environment latency → `env_stepped`) → reward (`score_latency` plus the workload's
reward latency) →
`sample_scored`; an `Abort` takes the request off its server (with `resubmit`, its partial tokens come back through
`request_finished(..., aborted=True)`); an `EmitGroup` goes to the trainer (`asyncrl.sim.trainer`: through S3 when
the cost model has a data path, then the trainer's steps, weight syncs and bookkeeping, and `version_advanced` when
the writer sees the published version).

Failures take the production path: a server that dies loses its requests; each is reported with
`RolloutScheduler.request_lost` (the connection broke), which marks the server down and re-sends the sample, with its
tokens so far, to a live server (parked while none is); a request the scheduler still sends there is lost at once
(connection refused). A failed server may come back (`Failure.back_at_s`): `server_returned` routes to it again.
Slow-downs scale a server's step time. CPU sharing (`corun_*_factor` > 1): training runs slower while a server
decodes, and servers decode slower while the trainer trains (checked after every event).

Events at one time run in insertion order; the run is deterministic for a seed.
"""

from __future__ import annotations

import heapq
import itertools
import logging
import math
from collections import deque
from dataclasses import dataclass

from asyncrl.rollout.decisions import Abort, Decision, DropGroup, DropSample, EmitGroup, Start
from asyncrl.rollout.scheduler import RolloutScheduler
from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import CostModel
from asyncrl.sim.overheads import FifoStage, score_latency
from asyncrl.sim.report import SimResult, build_result
from asyncrl.sim.server import SimServer
from asyncrl.sim.trainer import Emitted, SimTrainer
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
        self._per_group = config.scheduler.group_size + config.scheduler.extra_samples
        self._rid: dict[str, Key] = {}  # requests on a server
        self._queued: dict[str, Key] = {}  # requests still in the control plane's queues
        self._answering: dict[str, Key] = {}  # finished requests whose answer is on its way to the environment
        self._next_prompt = 0
        self.env_stage = FifoStage()
        self.frontends = [FifoStage() for _ in self.servers]
        self._slow = [1.0] * len(self.servers)
        self._corun = cost.corun_train_factor > 1 or cost.corun_decode_factor > 1
        self.trainer = SimTrainer(self)
        self.latencies: list[float] = []
        self.failed_requests = 0  # requests lost at a failed server (re-sent elsewhere)
        self._events_done = 0
        self.window: dict[str, float] = {"t": 0.0, "gen_busy_s": 0.0, "train_busy_s": 0.0, "latencies": 0.0}

    # ---- event queue -------------------------------------------------------------------------------------------
    def push(self, t: float, ev: tuple) -> None:
        heapq.heappush(self._events, (t, next(self._seq), ev))

    def _reschedule(self, s: SimServer) -> None:
        t = s.next_completion()
        if t < math.inf:
            self.push(t, ("srv", s.index, s.epoch))

    # ---- run ---------------------------------------------------------------------------------------------------
    def run(self) -> SimResult:
        for f in self.cfg.failures:
            self.push(f.at_s, ("fail", f.server))
            if f.back_at_s is not None:
                self.push(f.back_at_s, ("back", f.server))
        for sd in self.cfg.slowdowns:
            self.push(sd.at_s, ("slow", sd.server, sd.factor))
        self.trainer.start_polling()
        self._admit()
        while len(self.trainer.step_ends) < self.cfg.steps:
            if not self._events:
                raise RuntimeError(f"simulation stalled at t={self.now:.3f}s after {len(self.trainer.step_ends)} "
                                   f"steps: no event left (scheduler {self.sched.counts()}, trainer buffer "
                                   f"{len(self.trainer.queue)})")
            t, _, ev = heapq.heappop(self._events)
            if t > self.cfg.max_sim_s:
                raise RuntimeError(f"simulation passed max_sim_s={self.cfg.max_sim_s} after "
                                   f"{len(self.trainer.step_ends)} steps")
            self.now = t
            self._handle(ev)
            self._admit()
            if self._corun:
                self._cpu_share()
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
            if done and not self.wl.agentic and self.cost.shared_cpu * self.cost.score_call_cpu_s > 0:
                s.charge(self.now, self.cost.shared_cpu * self.cost.score_call_cpu_s)  # their one reward call
            self._reschedule(s)
            for rid, new in done:
                self._finished(rid, new, len(done))
        elif kind == "submit":
            self._submit(ev[1], ev[2])
        elif kind == "answer":
            self._answered(ev[1], ev[2], ev[3])
        elif kind == "env":
            self._env_done(ev[1], ev[2])
        elif kind == "score":
            key = ev[1]
            st = self._samples.get(key)
            if st is not None:
                self.latencies.append(self.now - st.started_s)
                self.apply(self.sched.sample_scored(key[0], key[1], st.plan.reward))
        elif kind == "lost":
            self.failed_requests += 1
            self.apply(self.sched.request_lost(*ev[1]))
        elif kind == "fail":
            self._fail(ev[1])
        elif kind == "back":
            self.servers[ev[1]].failed = False
            self.apply(self.sched.server_returned(ev[1]))
        elif kind == "slow":
            self._slow[ev[1]] = ev[2]
            self._set_factor(ev[1])
        elif not self.trainer.handle(ev):
            raise ValueError(f"unknown simulator event {ev!r}")

    def _admit(self) -> None:
        while self.sched.can_admit():
            p = self._next_prompt
            self._next_prompt += 1
            self.apply(self.sched.offer_prompt(p, self.wl.prompt_length(p)))

    # ---- CPU sharing and server speed --------------------------------------------------------------------------
    def _set_factor(self, i: int) -> None:
        corun = self.cost.corun_decode_factor if self._corun and self.trainer.phase == "train" else 1.0
        s = self.servers[i]
        if s.factor != self._slow[i] * corun:
            s.set_factor(self.now, self._slow[i] * corun)
            self._reschedule(s)

    def _cpu_share(self) -> None:
        self.trainer.cpu_changed(any(s.running and not s.failed and s.paused_until <= self.now for s in self.servers))
        for i in range(len(self.servers)):
            self._set_factor(i)

    def pause_all(self, until: float) -> None:
        for s in self.servers:
            s.pause(self.now, until)
            self._reschedule(s)

    # ---- decisions ---------------------------------------------------------------------------------------------
    def apply(self, decisions: list[Decision]) -> None:
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
        c = self.cost
        self._queued[d.request_id] = key
        queued = 1.0 - c.shared_cpu
        # the control plane's queues first: a request's own work (its per-token work overlaps its decode there)
        if queued > 0 and (c.env_s > 0 or c.frontend_s > 0):
            t = self.env_stage.enter(self.now, queued * c.env_s)
            t = self.frontends[d.server].enter(t, queued * c.frontend_s)
            self.push(t, ("submit", d.request_id, d.server))
            return
        self._submit(d.request_id, d.server)

    def _submit(self, rid: str, index: int) -> None:
        key = self._queued.pop(rid, None)
        st = self._samples.get(key) if key else None
        if key is None or st is None:
            return  # aborted while queued
        server = self.servers[index]
        if server.failed:  # connection refused: the scheduler marks the server down and re-sends the sample
            self.push(self.now, ("lost", key))
            return
        self._rid[rid] = key
        tokens = max(1, st.remaining)
        server.submit(self.now, rid, st.tokens, tokens, self.cost.shared_cpu * sum(self.cost.request_cpu(tokens)))
        self._reschedule(server)

    def _abort(self, d: Abort) -> list[Decision]:
        key = (d.group_id, d.sample_index)
        rid = d.request_id
        if rid in self._answering:  # already finished: the answer is on its way and will count as finished
            if d.resubmit:
                return []
            del self._answering[rid]
            self._forget(key)
            return []
        generated = 0
        if self._queued.pop(rid, None) is None:
            self._rid.pop(rid, None)
            server = self.servers[d.server]
            generated = server.remove(self.now, rid)
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

    def _finished(self, rid: str, new_tokens: int, together: int) -> None:
        key = self._rid.pop(rid, None)
        if key is None or key not in self._samples:
            return
        if self.cost.http_call_s > 0:
            self._answering[rid] = key
            self.push(self.now + self.cost.http_call_s, ("answer", rid, new_tokens, together))
            return
        self._answering[rid] = key
        self._answered(rid, new_tokens, together)

    def _answered(self, rid: str, new_tokens: int, together: int) -> None:
        key = self._answering.pop(rid, None)
        st = self._samples.get(key) if key else None
        if key is None or st is None:
            return
        st.tokens += new_tokens
        st.generated += new_tokens
        st.remaining = 0
        self.apply(self.sched.request_finished(key[0], key[1], new_tokens))
        if self.wl.agentic:
            self.push(self.now + st.plan.env_latency_s[st.turn], ("env", key, st.turn))
        else:
            self._score(key, together)

    def _score(self, key: Key, together: int) -> None:
        latency = self.wl.reward_latency_s + score_latency(self.cost, together)
        self.push(self.now + latency, ("score", key))

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
        self.apply(self.sched.env_stepped(key[0], key[1], obs, done))
        if done:
            self._score(key, 1)

    def _emit(self, d: EmitGroup) -> None:
        lengths, generated = [], 0
        for i in d.sample_indices:
            st = self._samples.get((d.group_id, i))
            if st is not None:
                lengths.append(st.tokens)
                generated += st.generated
        for i in self._group_keys.pop(d.group_id, set()):
            self._samples.pop((d.group_id, i), None)
        self._plans.pop(d.group_id, None)
        self.trainer.emit(Emitted(d.start_version, sum(lengths), generated, len(d.sample_indices), lengths))

    # ---- trainer hooks -----------------------------------------------------------------------------------------
    def step_ended(self) -> None:
        if len(self.trainer.step_ends) == self.cfg.warmup_steps:
            for s in self.servers:
                s.advance(self.now)
            self.window = {"t": self.now, "gen_busy_s": sum(s.busy_s for s in self.servers),
                           "train_busy_s": self.trainer.busy_s, "latencies": float(len(self.latencies)),
                           "objects": float(self.trainer.objects_written)}
        if self.cfg.check_every == 0:
            self.sched.check_invariants()

    def _fail(self, index: int) -> None:
        for rid in self.servers[index].fail(self.now):
            key = self._rid.pop(rid, None)
            if key is not None:
                self.failed_requests += 1
                self.apply(self.sched.request_lost(*key))


def simulate(config: SimConfig, cost: CostModel, workload: Workload) -> SimResult:
    """Run one simulation and return its report."""
    return Simulator(config, cost, workload).run()
