"""The rollout scheduler core: admission under α, queue routing, replication, redundancy, filtering, staleness.

Sans-IO: events go in (prompt offered, request finished, environment stepped or failed, sample scored, policy
version advanced), decisions come out (`Start`, `Abort`, `EmitGroup`, `DropGroup`, `DropSample`). Nothing here
sleeps, sends or reads a clock: the environment role drives it with asyncio and real servers, `asyncrl.sim` drives
the very same object with a virtual clock.

Terms (one writer; W = prompts_per_step of this writer, α = async ratio, n = group_size, r = extra_samples):
- A *group* is one admitted prompt; it starts n + r *samples* (prompt replication: each its own request, routed on
  its own). A sample is one trajectory: one request, or several (next turns after an environment step, or a
  continuation re-submitted after a weight update). The first n samples scored are kept; the others are aborted at
  their server (redundant rollout, per group).
- *Slots*: training step k takes W of this writer's groups, and may use a group only if its start_version ≥ k − α.
  So a group started under version v can be trained only in one of the (v + α + 1)·W slots of steps 0..v+α.
  `trained` (groups trained in completed steps) and `emitted_unconsumed` (written, not yet read by the trainer)
  occupy slots.

Admission (`can_admit`), docs/algorithms.md §1 plus redundancy (G = extra_groups):
- a slot through step version+α must still be free: trained + emitted_unconsumed < (version + α + 1)·W, so no
  sample is started that could not be trained on;
- at most (α + 1)·W + G groups live or written-and-unconsumed (admitted and not yet consumed), and at most
  (version + α + 1)·W + G counting the trained ones.
With α = 0 this is synchronous on-policy training: W + G groups start under version v, the first W to finish fill
step v, the rest are aborted, and nothing starts again until version v + 1 is published (servers idle while the
trainer trains). `mode="sync"` is exactly that (the config forces α = 0).

Aborts and drops:
- stale: when the version becomes v, a live group with start_version < v − α can never be trained: aborted;
- surpassed (redundant groups): a live group whose last usable step start_version + α has all its slots filled by
  trained and written groups is aborted;
- a failed sample (its request, environment step or score failed) is replaced by a new sample of the same group
  (the next free sample index) while the group has replacements left (`replace_failed` per group); a group whose
  remaining samples cannot reach n is aborted (and replaced by admission); with dynamic filtering a complete group
  whose kept rewards are all equal (no GRPO signal) is dropped and replaced (a *refill*).

Bounded dynamic sampling (docs/algorithms.md §7): the refills of a step are bounded by `max_refill`·W. A step here is
the step the next emitted group would fill: `(trained + emitted_unconsumed) // W` of this writer's slots, never
going back (a stale drop by the trainer frees a slot, the refill count stays with the later step). While that step
has had fewer than `max_refill`·W groups filtered, an all-equal group is dropped and replaced; past it, it is
emitted anyway (it trains with A = 0) and counted as `refill_exhausted_groups`.

Lost servers (`request_lost`, `server_returned`): a request whose server did not answer at all (connection refused
or reset, or no answer within the request deadline) marks that server down and is re-sent, with the sample's tokens
so far, to the least-loaded live server; no new request goes to a down server until it is reported back. With every
server down the re-sent samples are parked (still `running`, no request) and start on the first server back;
admission pauses meanwhile. A lost request loses only the tokens that server was decoding for it.

Invariants (checked by `check_invariants`, used by the tests and the simulator):
- groups:  admitted = live + emitted + filtered + aborted (stale + failed + surpassed);
- samples: started = running + awaiting + finished + failed + aborted + dropped, where `running` samples have a
  request on a server (or are parked, waiting for a live server), `awaiting` ones wait for a score or an
  environment step;
- server work equals the sum of the estimated work of the requests running on it; none is negative;
- refills: the groups filtered for the current refill step are at most `max_refill`·W; a group is counted
  refill-exhausted only with dynamic filtering on, and such groups are emitted (`refill_exhausted_groups` ≤ emitted).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass, field
from typing import Literal

from asyncrl.rollout.decisions import Abort, Decision, DropGroup, DropSample, EmitGroup, Start

__all__ = ["Abort", "Decision", "DropGroup", "DropSample", "EmitGroup", "RolloutScheduler", "SchedulerConfig",
           "SchedulerStats", "Start"]

Routing = Literal["least_tokens", "least_requests", "round_robin"]
PartialRollout = Literal["continue", "resubmit"]


# ---- state ------------------------------------------------------------------------------------------------------
@dataclass
class _Request:
    server: int
    turn: int
    work: float
    version: int  # policy version live when the request was sent
    resubmit: bool = False


@dataclass
class _Sample:
    context_tokens: int
    request: _Request | None = None  # running request, if any
    turn: int = 0
    state: Literal["running", "awaiting", "finished", "failed"] = "running"
    reward: float = 0.0


@dataclass
class _Group:
    group_id: str
    prompt_index: int
    start_version: int
    prompt_tokens: int = 0
    replacements: int = 0
    samples: dict[int, _Sample] = field(default_factory=dict)
    finish_order: list[int] = field(default_factory=list)


@dataclass
class SchedulerStats:
    admitted: int = 0
    emitted: int = 0
    filtered_groups: int = 0
    aborted_stale_groups: int = 0
    aborted_failed_groups: int = 0
    aborted_surpassed_groups: int = 0
    samples_started: int = 0
    requests_started: int = 0
    samples_finished: int = 0
    samples_failed: int = 0
    samples_aborted: int = 0
    samples_dropped: int = 0
    samples_replaced: int = 0
    resubmits: int = 0
    requests_lost: int = 0  # requests whose server never answered (re-sent elsewhere)
    servers_lost: int = 0  # times a server was marked down
    servers_returned: int = 0
    refill_exhausted_groups: int = 0  # all-equal groups emitted because their step's refills were used up

    @property
    def aborted_groups(self) -> int:
        return self.aborted_stale_groups + self.aborted_failed_groups + self.aborted_surpassed_groups


@dataclass(frozen=True)
class SchedulerConfig:
    """The scheduler's knobs; `prompts_per_step` is this writer's share W of the batch.

    The one source of each knob's default: the run config's `rollout` section (`asyncrl.config.schema.RolloutConfig`)
    and the simulator's job (`asyncrl.sim.config.SimConfig.scheduler`) take theirs from here.
    """

    async_ratio: int = 1
    prompts_per_step: int = 8
    group_size: int = 8
    num_servers: int = 1
    extra_samples: int = 0
    extra_groups: int = 0
    routing: Routing = "least_tokens"
    replicate: bool = True
    dynamic_filter: bool = False
    max_refill: int = 2  # dynamic filtering: at most max_refill * prompts_per_step groups filtered a step
    partial_rollout: PartialRollout = "continue"
    max_new_tokens: int = 8
    writer: str = "env0"
    replace_failed: int = 0
    incarnation: int = 0  # > 0 after a restart: the groups this writer had written before it; names new group ids

    def __post_init__(self) -> None:
        if self.async_ratio < 0:
            raise ValueError(f"async_ratio: expected >= 0, got {self.async_ratio}")
        for name in ("prompts_per_step", "group_size", "num_servers", "max_new_tokens"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name}: expected >= 1, got {getattr(self, name)}")
        for name in ("extra_samples", "extra_groups", "replace_failed", "incarnation", "max_refill"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name}: expected >= 0, got {getattr(self, name)}")


class RolloutScheduler:
    """The rollout policy of one environment writer (see the module docstring for the rules and invariants)."""

    def __init__(self, config: SchedulerConfig) -> None:
        self.cfg = config
        self.version = 0
        self.trained = 0  # this writer's groups trained in completed steps (published by the trainer)
        self.consumed = 0  # this writer's groups the trainer has read (trained or dropped as stale)
        self.stats = SchedulerStats()
        self._work = [0.0] * config.num_servers
        self._requests = [0] * config.num_servers
        # lazy min-heap of (work, requests, server) for least-loaded routing in O(log K): every change pushes the
        # server's new key; a popped key that no longer matches the server's current figures is discarded
        self._heap: list[tuple[float, int, int]] = [(0.0, 0, s) for s in range(config.num_servers)]
        self._rr = 0
        self._down: set[int] = set()  # servers marked lost: no request is routed to them
        self._parked: list[tuple[str, int]] = []  # (group, sample) waiting for a live server
        self._groups: dict[str, _Group] = {}
        self._mean_new_tokens = config.max_new_tokens / 2
        self._finished_requests = 0
        self._refill_step = 0  # the step the filtered groups are counted for (see the module docstring)
        self._refills = 0  # groups filtered for `_refill_step`

    # ---- queries ----------------------------------------------------------------------------------------------
    @property
    def emitted_unconsumed(self) -> int:
        return max(0, self.stats.emitted - self.consumed)

    @property
    def live_groups(self) -> int:
        return len(self._groups)

    def can_admit(self) -> bool:
        c, w = self.cfg, self.cfg.prompts_per_step
        horizon = (self.version + c.async_ratio + 1) * w
        in_window = self.live_groups + self.emitted_unconsumed
        return (len(self._down) < c.num_servers
                and self.trained + self.emitted_unconsumed < horizon
                and self.trained + in_window < horizon + c.extra_groups
                and in_window < (c.async_ratio + 1) * w + c.extra_groups)

    def min_trainable_version(self) -> int:
        """The oldest start_version the next training step (k = version) accepts."""
        return self.version - self.cfg.async_ratio

    @property
    def server_work(self) -> list[float]:
        return list(self._work)

    @property
    def server_requests(self) -> list[int]:
        return list(self._requests)

    @property
    def servers_down(self) -> list[int]:
        return sorted(self._down)

    def is_parked(self, group_id: str, sample_index: int) -> bool:
        """The sample waits for a live server (its request was lost while every server was down)."""
        group, sample = self._lookup(group_id, sample_index)
        return (sample is not None and sample.state == "running" and sample.request is None
                and (group_id, sample_index) in self._parked)

    @property
    def running_requests(self) -> int:
        return sum(self._requests)

    def counts(self) -> dict[str, int]:
        running = awaiting = 0
        for g in self._groups.values():
            for s in g.samples.values():
                if s.state == "running":
                    running += 1
                elif s.state == "awaiting":
                    awaiting += 1
        return {"live_groups": self.live_groups, "running_samples": running, "awaiting_samples": awaiting,
                "running_requests": self.running_requests, "emitted_unconsumed": self.emitted_unconsumed}

    def restore_emitted(self, groups: int) -> None:
        """A restarted writer: `groups` groups it emitted before (they are in S3, trained or waiting to be) count as
        admitted and emitted, so the α bound covers them. Call once, before the first admission."""
        if groups < 0 or self.stats.admitted or self._groups:
            raise ValueError(f"restore_emitted: expected a fresh scheduler and groups >= 0, got {groups}")
        self.stats.admitted = self.stats.emitted = groups

    def check_invariants(self) -> None:
        """Raise AssertionError if the bookkeeping does not add up (see the module docstring)."""
        s, c = self.stats, self.counts()
        assert s.admitted == c["live_groups"] + s.emitted + s.filtered_groups + s.aborted_groups, (s, c)
        finished_live = sum(1 for g in self._groups.values() for x in g.samples.values() if x.state == "finished")
        failed_live = sum(1 for g in self._groups.values() for x in g.samples.values() if x.state == "failed")
        assert s.samples_started == (c["running_samples"] + c["awaiting_samples"] + s.samples_finished
                                     + s.samples_failed + s.samples_aborted + s.samples_dropped), (s, c)
        assert finished_live <= s.samples_finished and failed_live <= s.samples_failed
        assert self._refills <= self.cfg.max_refill * self.cfg.prompts_per_step, (self._refills, self.cfg)
        assert s.refill_exhausted_groups <= s.emitted, s
        assert self.cfg.dynamic_filter or s.filtered_groups == s.refill_exhausted_groups == 0, s
        work = [0.0] * self.cfg.num_servers
        reqs = [0] * self.cfg.num_servers
        for g in self._groups.values():
            for x in g.samples.values():
                if x.request is not None:
                    work[x.request.server] += x.request.work
                    reqs[x.request.server] += 1
        assert reqs == self._requests, (reqs, self._requests)
        assert all(abs(a - b) < 1e-6 for a, b in zip(work, self._work, strict=True)), (work, self._work)

    # ---- events -----------------------------------------------------------------------------------------------
    def offer_prompt(self, prompt_index: int, prompt_tokens: int) -> list[Decision]:
        """A prompt is available: admit it (call only while `can_admit()`); one `Start` per sample."""
        if not self.can_admit():
            raise RuntimeError("admission closed: check can_admit() before offering a prompt")
        c = self.cfg
        name = f"{c.writer}-r{c.incarnation}" if c.incarnation else c.writer
        group = _Group(f"{name}-{self.stats.admitted:09d}", prompt_index, self.version, prompt_tokens)
        self._groups[group.group_id] = group
        self.stats.admitted += 1
        decisions: list[Decision] = []
        one_server = None if c.replicate else self._pick_server(prompt_tokens)
        for i in range(c.group_size + c.extra_samples):
            sample = _Sample(context_tokens=prompt_tokens)
            group.samples[i] = sample
            self.stats.samples_started += 1
            decisions += self._route(group, i, sample, one_server)
        return decisions

    def request_finished(self, group_id: str, sample_index: int, new_tokens: int,
                         aborted: bool = False) -> list[Decision]:
        """A server answered a request with `new_tokens` tokens (`aborted`: it was cut short).

        The sample then awaits its score or environment step; a request we aborted for a resubmit continues as a
        new request with the partial tokens appended; an abort we did not ask for fails the sample.
        Results for requests that are no longer running (their group is gone) are ignored.
        """
        ended = self._end_request(group_id, sample_index)
        if ended is None:
            return []
        group, sample, req = ended
        sample.context_tokens += new_tokens
        if aborted and req.resubmit:
            self.stats.resubmits += 1
            return self._route(group, sample_index, sample)
        if aborted:
            return self._fail(group, sample_index, sample)
        self._finished_requests += 1
        self._mean_new_tokens += (new_tokens - self._mean_new_tokens) / min(self._finished_requests, 256)
        sample.state = "awaiting"
        return []

    def env_stepped(self, group_id: str, sample_index: int, observation_tokens: int, done: bool) -> list[Decision]:
        """The environment answered an action. Not done: the next turn starts (`Start` with turn + 1) on the
        least-loaded server; done: the sample awaits its score."""
        group, sample = self._lookup(group_id, sample_index)
        if group is None or sample is None or sample.state != "awaiting":
            return []
        sample.context_tokens += observation_tokens
        if done:
            return []
        return self._route(group, sample_index, sample)

    def sample_failed(self, group_id: str, sample_index: int) -> list[Decision]:
        """A request, an environment step or a score failed: the sample fails; if the group can no longer
        reach n finished samples, it is aborted (and replaced by admission)."""
        group, sample = self._lookup(group_id, sample_index)
        if group is None or sample is None or sample.state in ("finished", "failed"):
            return []
        if sample.request is not None:
            self._release(sample.request)
            sample.request = None
        return self._fail(group, sample_index, sample)

    env_failed = sample_failed

    def request_lost(self, group_id: str, sample_index: int) -> list[Decision]:
        """The running request of this sample got no answer from its server (connection refused or reset, or no
        answer by its deadline): that server is marked down and the request re-sent, with the sample's tokens so
        far, to the least-loaded live server (parked while none is). Ignored when the sample is no longer running
        (its group closed, or it was already re-sent)."""
        ended = self._end_request(group_id, sample_index)
        if ended is None:
            return []
        group, sample, req = ended
        self.stats.requests_lost += 1
        if req.server not in self._down:
            self._down.add(req.server)
            self.stats.servers_lost += 1
        return self._route(group, sample_index, sample)

    def server_returned(self, server: int) -> list[Decision]:
        """A lost server answers again (restarted, or resumed): route to it again and start the parked samples."""
        if not 0 <= server < self.cfg.num_servers:
            raise ValueError(f"server: expected 0..{self.cfg.num_servers - 1}, got {server}")
        if server not in self._down:
            return []
        self._down.discard(server)
        self.stats.servers_returned += 1
        self._load_changed(server)
        parked, self._parked = self._parked, []
        decisions: list[Decision] = []
        for group_id, index in parked:
            group, sample = self._lookup(group_id, index)
            if group is not None and sample is not None and sample.state == "running" and sample.request is None:
                decisions += self._route(group, index, sample)
        return decisions

    def sample_scored(self, group_id: str, sample_index: int, reward: float) -> list[Decision]:
        """A sample's reward is known: it is finished. The group completes with its first n finished samples;
        its other samples are aborted (running) or dropped (awaiting)."""
        group, sample = self._lookup(group_id, sample_index)
        if group is None or sample is None or sample.state != "awaiting":
            return []
        sample.state, sample.reward = "finished", reward
        self.stats.samples_finished += 1
        group.finish_order.append(sample_index)
        if len(group.finish_order) < self.cfg.group_size:
            return []
        kept = tuple(sorted(group.finish_order))
        decisions = self._close(group, "redundant: group complete")
        rewards = {group.samples[i].reward for i in kept}
        if self.cfg.dynamic_filter and len(rewards) == 1:
            if self._refill_allowed():
                self._refills += 1
                self.stats.filtered_groups += 1
                decisions.append(DropGroup(group.group_id, f"filtered: all {len(kept)} rewards are {rewards.pop()}"))
                return decisions
            self.stats.refill_exhausted_groups += 1
        self.stats.emitted += 1
        decisions.append(EmitGroup(group.group_id, group.prompt_index, group.start_version, kept))
        return decisions + self._abort_surpassed()

    def version_advanced(self, version: int, trained: int, consumed: int) -> list[Decision]:
        """The trainer published `version`, having trained `trained` and read `consumed` of this writer's groups.

        The trainer publishes between steps, so `consumed − trained` is what it dropped as stale; a group it has
        read and is still training counts as unconsumed until the next publication.

        Aborts live groups that became stale or surpassed; with `partial_rollout="resubmit"`, every request sent
        under an older version is aborted to be re-sent with its partial tokens.
        """
        if version < self.version or consumed < self.consumed or trained < self.trained:
            raise ValueError(f"version/trained/consumed must not go back: had ({self.version}, {self.trained}, "
                             f"{self.consumed}), got ({version}, {trained}, {consumed})")
        if trained > consumed:
            raise ValueError(f"trained ({trained}) cannot exceed consumed ({consumed})")
        self.version, self.trained, self.consumed = version, trained, consumed
        floor = self.min_trainable_version()
        decisions: list[Decision] = []
        stale = []
        for g in self._groups.values():  # admission order: start_version never decreases
            if g.start_version >= floor:
                break
            stale.append(g)
        for group in stale:
            self.stats.aborted_stale_groups += 1
            decisions += self._close(group, f"stale: start_version {group.start_version} < {floor}")
            decisions.append(DropGroup(group.group_id, "stale"))
        decisions += self._abort_surpassed()
        if self.cfg.partial_rollout == "resubmit":
            for group in self._groups.values():
                for i, s in sorted(group.samples.items()):
                    req = s.request
                    if req is not None and req.version < version and not req.resubmit:
                        req.resubmit = True
                        decisions.append(Abort(group.group_id, i, req.server, f"{group.group_id}-{i}-{req.turn}",
                                               f"resubmit under version {version}", resubmit=True))
        return decisions

    # ---- internals --------------------------------------------------------------------------------------------
    def _refill_allowed(self) -> bool:
        """Whether an all-equal group may still be filtered (and replaced) for the step the next emitted group
        would fill: fewer than max_refill·W filtered for it so far (module docstring)."""
        w = self.cfg.prompts_per_step
        step = (self.trained + self.emitted_unconsumed) // w
        if step > self._refill_step:
            self._refill_step, self._refills = step, 0
        return self._refills < self.cfg.max_refill * w

    def _lookup(self, group_id: str, sample_index: int) -> tuple[_Group | None, _Sample | None]:
        """The live group and its sample; (group or None, None) when either is gone."""
        group = self._groups.get(group_id)
        return group, (group.samples.get(sample_index) if group else None)

    def _running(self, group_id: str, sample_index: int) -> tuple[_Group | None, _Sample | None]:
        group, sample = self._lookup(group_id, sample_index)
        if sample is None or sample.request is None:
            return None, None
        return group, sample

    def _end_request(self, group_id: str, sample_index: int) -> tuple[_Group, _Sample, _Request] | None:
        """Take the running request off its sample and its server; None when the sample has none."""
        group, sample = self._running(group_id, sample_index)
        if group is None or sample is None or sample.request is None:
            return None
        req, sample.request = sample.request, None
        self._release(req)
        return group, sample, req

    def _estimate(self, context_tokens: int) -> float:
        """Outstanding work of a request: its context plus the expected new tokens (running mean)."""
        return context_tokens + self._mean_new_tokens

    def _pick_server(self, context_tokens: int) -> int | None:
        """round_robin: the next live server; least_requests: fewest running requests; least_tokens: least estimated
        work (then fewest requests). Ties go to the lowest index. Down servers are skipped; None when all are."""
        k, down = self.cfg.num_servers, self._down
        if len(down) == k:
            return None
        if self.cfg.routing == "round_robin":
            while True:
                self._rr = (self._rr + 1) % k
                if (self._rr - 1) % k not in down:
                    return (self._rr - 1) % k
        if self.cfg.routing == "least_requests":
            return min((s for s in range(k) if s not in down), key=lambda s: (self._requests[s], s))
        heap = self._heap
        while True:
            work, reqs, server = heap[0]
            if work == self._work[server] and reqs == self._requests[server] and server not in down:
                return server
            heapq.heappop(heap)  # stale, or a down server (its key is pushed again when it returns)

    def _route(self, group: _Group, index: int, sample: _Sample, server: int | None = None) -> list[Decision]:
        """Start the sample's next request on `server` (default: the routing's pick), or park it while no server
        is live. A parked sample is `running` without a request."""
        if server is None or server in self._down:
            server = self._pick_server(sample.context_tokens)
        if server is None:
            sample.state = "running"
            self._parked.append((group.group_id, index))
            return []
        return [self._start(group, index, sample, server)]

    def _load_changed(self, server: int) -> None:
        if self.cfg.routing != "least_tokens":
            return
        heapq.heappush(self._heap, (self._work[server], self._requests[server], server))
        if len(self._heap) > 8 * self.cfg.num_servers + 1024:  # compact the stale keys
            self._heap = [(self._work[i], self._requests[i], i) for i in range(self.cfg.num_servers)]
            heapq.heapify(self._heap)

    def _start(self, group: _Group, index: int, sample: _Sample, server: int) -> Start:
        turn = sample.turn
        sample.turn += 1
        req = _Request(server, turn, self._estimate(sample.context_tokens), self.version)
        sample.request, sample.state = req, "running"
        self._work[server] += req.work
        self._requests[server] += 1
        self._load_changed(server)
        self.stats.requests_started += 1
        return Start(group.group_id, group.prompt_index, index, server, group.start_version, turn,
                     sample.context_tokens)

    def _release(self, req: _Request) -> None:
        self._work[req.server] -= req.work
        self._requests[req.server] -= 1
        if self._requests[req.server] == 0:
            self._work[req.server] = 0.0  # no float drift on an idle server
        self._load_changed(req.server)

    def _fail(self, group: _Group, index: int, sample: _Sample) -> list[Decision]:
        sample.state = "failed"
        self.stats.samples_failed += 1
        if group.replacements < self.cfg.replace_failed:
            group.replacements += 1
            self.stats.samples_replaced += 1
            self.stats.samples_started += 1
            new_index = max(group.samples) + 1
            fresh = _Sample(context_tokens=group.prompt_tokens)
            group.samples[new_index] = fresh
            return self._route(group, new_index, fresh)
        alive = sum(1 for s in group.samples.values() if s.state != "failed")
        if alive >= self.cfg.group_size:
            return []
        self.stats.aborted_failed_groups += 1
        return self._close(group, "failed: too few samples left") + [DropGroup(group.group_id, "failed")]

    def _close(self, group: _Group, reason: str) -> list[Decision]:
        """Remove a group: abort its running requests, drop its awaiting samples."""
        decisions: list[Decision] = []
        for i, s in sorted(group.samples.items()):
            if s.request is not None:
                self._release(s.request)
                decisions.append(Abort(group.group_id, i, s.request.server, f"{group.group_id}-{i}-{s.request.turn}",
                                       reason))
                s.request = None
                self.stats.samples_aborted += 1
            elif s.state == "running":  # parked: no server holds it, nothing to abort there
                self.stats.samples_aborted += 1
            elif s.state == "awaiting":
                decisions.append(DropSample(group.group_id, i, reason))
                self.stats.samples_dropped += 1
        del self._groups[group.group_id]
        return decisions

    def _abort_surpassed(self) -> list[Decision]:
        """Abort live groups whose usable slots (through step start_version + α) are all taken.

        Live groups are kept in admission order and start_version never decreases with admission, so the scan
        stops at the first group that is not surpassed (O(1) when none is).
        """
        c = self.cfg
        occupied = self.trained + self.emitted_unconsumed
        surpassed: list[_Group] = []
        for g in self._groups.values():
            if occupied < (g.start_version + c.async_ratio + 1) * c.prompts_per_step:
                break
            surpassed.append(g)
        decisions: list[Decision] = []
        for group in surpassed:
            self.stats.aborted_surpassed_groups += 1
            decisions += self._close(group, "redundant: its training steps are full")
            decisions.append(DropGroup(group.group_id, "surpassed"))
        return decisions
