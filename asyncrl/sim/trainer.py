"""The simulated training role and the path of finished groups to it (events of `asyncrl.sim.simulator`).

Data path (when the cost model has one, `CostModel.has_data_path`; otherwise an emitted group reaches the trainer at
once): the environment writer puts the groups emitted together as one object, one PUT at a time (the groups emitted
during a PUT go in the next object, at most 64 per object); the trainer's prefetch thread polls with backoff
(`PollSchedule`), reads every object written by then (GET + decode, one after the other) into its buffer, and
stops polling while the buffer holds `prompts_per_step` groups.

One training step, as `asyncrl.roles.training` runs it: wait (take buffered groups until W fresh ones; a group with
start_version < k − α is dropped), train (`train_time` of the batch's tokens, padded per micro batch when the job
sets `micro_batch_size`; with CPU sharing the work runs `corun_train_factor` times slower while a server decodes),
sync (servers paused `sync_time`), then the bookkeeping outside the step's own timing: `publish_s` (after which the
writers see the version, `notice_time`), `log_s`, and `checkpoint_s` every `checkpoint_every` steps. In async mode a
step that writes no checkpoint publishes its version as the sync begins (`TrainingReport.publish_ahead`): the writers
see it `publish_s + s3_get_s` later (the servers' long poll answers as the push begins) and their requests wait at the
paused servers, as the real ones are held for their `min_version`, until the sync ends. (The real trainer does the
same at α = 0, `rollout.mode: sync`; the simulator's sync mode, generation and training colocated on the same GPUs,
keeps publishing after the sync, so it prices one version notice per step more than such a run pays.)
`steps` records per step (wait, train, sync) seconds as the trainer measures them (`time/wait_s`, ...).
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

from asyncrl.rollout.decisions import Decision
from asyncrl.rollout.scheduler import RolloutScheduler
from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import CostModel
from asyncrl.sim.overheads import PollSchedule, notice_time, object_seconds, padded_tokens


class SimClock(Protocol):
    """What the simulated trainer needs of the simulator that drives it (`asyncrl.sim.simulator.Simulator`)."""

    now: float
    cfg: SimConfig
    cost: CostModel
    sched: RolloutScheduler
    train_gpus: int

    def push(self, t: float, ev: tuple) -> None: ...
    def pause_all(self, until: float) -> None: ...
    def apply(self, decisions: list[Decision]) -> None: ...
    def step_ended(self) -> None: ...

__all__ = ["Emitted", "SimClock", "SimTrainer"]

MAX_GROUPS_PER_OBJECT = 64  # the environment role's MAX_GROUPS_PER_OBJECT


@dataclass
class Emitted:
    start_version: int
    tokens: int
    generated: int
    samples: int
    lengths: list[int] = field(default_factory=list)  # per sample: prompt + response tokens


class SimTrainer:
    """The trainer, its prefetch buffer and the group writer of one simulation (see the module docstring)."""

    def __init__(self, sim: SimClock) -> None:
        self.sim, self.cfg, self.cost = sim, sim.cfg, sim.cost
        self.queue: deque[Emitted] = deque()  # the prefetch buffer (groups read, not taken)
        self.batch: list[Emitted] = []
        self.phase = "collect"  # collect -> train -> sync -> book -> collect
        self._ahead = False  # the version of the sync under way was published as it began (`_publishes_ahead`)
        self.k = 0
        self.trained = self.consumed = self.dropped_stale = 0
        self.step_ends: list[float] = []
        self.step_samples: list[tuple[int, int, int]] = []  # per step: samples, tokens, generated tokens
        self.steps: list[tuple[float, float, float]] = []  # per step: wait, train, sync (the trainer's timing)
        self.busy_s = 0.0
        self.staleness: dict[int, int] = {}
        self._t0 = self._t1 = self._t2 = 0.0
        self._work = self._rate_t = 0.0
        self._factor = 1.0
        self._epoch = 0
        # data path
        self._pending: list[Emitted] = []
        self._write_due = self._writing = False
        self.objects: deque[tuple[float, list[Emitted]]] = deque()  # written, not yet read: (visible at, groups)
        self.objects_written = 0
        self._poll = PollSchedule(self.cost)
        self._poll_due = self._reading = False

    # ---- the writer and the prefetch thread ---------------------------------------------------------------------
    def emit(self, g: Emitted) -> None:
        if not self.cost.has_data_path:
            self.queue.append(g)
            self.feed()
            return
        self._pending.append(g)
        if not self._writing and not self._write_due:
            self._write_due = True
            self.sim.push(self.sim.now, ("write",))  # after this instant's other emits: one object for them all

    def _write(self) -> None:
        self._write_due = False
        batch, self._pending = self._pending[:MAX_GROUPS_PER_OBJECT], self._pending[MAX_GROUPS_PER_OBJECT:]
        self._writing = True
        dt = object_seconds(self.cost.group_put_s, self.cost.group_put_token_s, sum(g.tokens for g in batch))
        self.sim.push(self.sim.now + dt, ("written", batch))

    def _written(self, batch: list[Emitted]) -> None:
        self._writing = False
        self.objects.append((self.sim.now, batch))
        self.objects_written += 1
        if self._pending:
            self._write()
        if self.cost.poll_backoff_s <= 0:  # no polling: the object is read as soon as it is written
            self._schedule_poll(self.sim.now)

    def _schedule_poll(self, at: float | None) -> None:
        """Poll at `at`, or (None) at the backoff's next time after an empty poll now (none without polling)."""
        if self._poll_due or (at is None and self.cost.poll_backoff_s <= 0):
            return
        self._poll_due = True
        self.sim.push(self._poll.after_empty(self.sim.now) if at is None else at, ("poll",))

    def start_polling(self) -> None:
        if self.cost.has_data_path and self.cost.poll_backoff_s > 0:
            self._schedule_poll(self.sim.now)

    def _do_poll(self) -> None:
        self._poll_due = False
        if len(self.queue) >= self.cfg.scheduler.prompts_per_step:
            return  # the buffer is full: the thread waits for the trainer to take (`feed` polls again)
        ready = [o for o in self.objects if o[0] <= self.sim.now]
        if not ready:
            self._schedule_poll(None)
            return
        self._poll.reset()
        for _ in ready:
            self.objects.popleft()
        groups = [g for _, gs in ready for g in gs]
        dt = sum(object_seconds(self.cost.group_get_s, self.cost.group_get_token_s, sum(g.tokens for g in gs))
                 for _, gs in ready)
        self._reading = True
        self.sim.push(self.sim.now + dt, ("read", groups))

    def _read(self, groups: list[Emitted]) -> None:
        self._reading = False
        self.queue.extend(groups)
        # the poll that found objects ended on a miss: the next one comes after the backoff (at once without polling)
        self._schedule_poll(None if self.cost.poll_backoff_s > 0 else self.sim.now)
        self.feed()

    # ---- one step -----------------------------------------------------------------------------------------------
    def feed(self) -> None:
        """Collect: take buffered groups until W fresh ones are in hand, then train."""
        if self.phase != "collect":
            return
        w = self.cfg.scheduler.prompts_per_step
        took = False
        while self.queue and len(self.batch) < w:
            g = self.queue.popleft()
            took = True
            self.consumed += 1
            if g.start_version < self.k - self.cfg.alpha:
                self.dropped_stale += 1
            else:
                self.batch.append(g)
        if took and self.cost.has_data_path and not self._reading:
            self._schedule_poll(self.sim.now)
        if len(self.batch) < w:
            return
        self.phase, self._t1 = "train", self.sim.now
        lengths = [n for g in self.batch for n in g.lengths]
        self._work = self.cost.train_time(padded_tokens(lengths, self.cfg.micro_batch_size), self.sim.train_gpus)
        self._rate_t, self._factor = self.sim.now, 1.0
        if self.cfg.mode == "sync":  # colocated: the generation GPUs train, then reload the weights
            self.sim.pause_all(self.sim.now + self._work + self.cost.sync_time)
        self._schedule_train_done()

    def _schedule_train_done(self) -> None:
        self._epoch += 1
        self.sim.push(self.sim.now + self._work * self._factor, ("train_done", self._epoch))

    def cpu_changed(self, gen_busy: bool) -> None:
        """CPU sharing: the trainer's speed while a server decodes (after every event; nothing if unchanged)."""
        if self.phase != "train":
            return
        factor = self.cost.corun_train_factor if gen_busy else 1.0
        if factor == self._factor:
            return
        now = self.sim.now
        self._work = max(0.0, self._work - (now - self._rate_t) / self._factor)
        self._rate_t, self._factor = now, factor
        self._schedule_train_done()

    def _train_done(self, epoch: int) -> None:
        if epoch != self._epoch or self.phase != "train":
            return  # superseded by a change of speed
        self.phase, self._t2 = "sync", self.sim.now
        self.busy_s += self.sim.now - self._t1
        if self.cfg.mode == "async":
            self.sim.pause_all(self.sim.now + self.cost.sync_time)
        self._ahead = self._publishes_ahead()
        if self._ahead:
            seen = self.sim.now + self.cost.publish_s + self.cost.s3_get_s
            self.sim.push(seen, ("version", self.k + 1, self.trained + self.cfg.scheduler.prompts_per_step,
                                 self.consumed))
        self.sim.push(self.sim.now + self.cost.sync_time, ("sync_done",))

    def _publishes_ahead(self) -> bool:
        """Whether the version this sync pushes is published as the sync begins (async, no checkpoint, not the last)."""
        version, every = self.k + 1, self.cfg.checkpoint_every
        return self.cfg.mode == "async" and not (every > 0 and version % every == 0) and version != self.cfg.steps

    def _sync_done(self) -> None:
        now = self.sim.now
        for g in self.batch:
            self.staleness[self.k - g.start_version] = self.staleness.get(self.k - g.start_version, 0) + g.samples
        self.step_samples.append((sum(g.samples for g in self.batch), sum(g.tokens for g in self.batch),
                                  sum(g.generated for g in self.batch)))
        self.steps.append((self._t1 - self._t0, self._t2 - self._t1, now - self._t2))
        self.batch = []
        self.k += 1
        self.trained += self.cfg.scheduler.prompts_per_step
        self.step_ends.append(now)
        self.phase = "book"
        self.sim.step_ended()
        self.sim.push(now + self.cost.publish_s, ("published",))

    def _published(self) -> None:
        now, c = self.sim.now, self.cost
        if not self._ahead:
            self.sim.push(notice_time(now, c.version_poll_s, c.s3_get_s),
                          ("version", self.k, self.trained, self.consumed))
        every = self.cfg.checkpoint_every
        book = c.log_s + (c.checkpoint_s if every > 0 and self.k % every == 0 else 0.0)
        self.sim.push(now + book, ("ready",))

    def _ready(self) -> None:
        self.phase, self._t0 = "collect", self.sim.now
        self.feed()

    def handle(self, ev: tuple) -> bool:
        """Handle a trainer or data-path event; False if `ev` is not one."""
        kind = ev[0]
        if kind == "write":
            self._write()
        elif kind == "written":
            self._written(ev[1])
        elif kind == "poll":
            self._do_poll()
        elif kind == "read":
            self._read(ev[1])
        elif kind == "train_done":
            self._train_done(ev[1])
        elif kind == "sync_done":
            self._sync_done()
        elif kind == "published":
            self._published()
        elif kind == "version":
            self.sim.apply(self.sim.sched.version_advanced(ev[1], ev[2], ev[3]))
        elif kind == "ready":
            self._ready()
        else:
            return False
        return True
