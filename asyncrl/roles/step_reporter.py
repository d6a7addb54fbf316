"""The trainer's reporting, off the step's critical path: MLflow logging and the other roles' figures.

A training step hands its own metrics to `StepReporter.submit` and goes on. A background thread then reads the
other roles' figures (`read_external`: their heartbeats and the environment writers' rollout stats, S3 reads) and
logs the steps' metrics (`log`: MLflow). So a step makes no MLflow call and no S3 read for reporting; what it
publishes in `versions/latest.json` carries the figures the thread read last (`external()`).

A read gives `Figures`: `job`, the figures of the job's own MLflow run (the writers' rollout counters, summed), and
`children`, each role instance's own figures for its child run (`asyncrl.tracking.child_runs`: `generation-0` →
its throughput, busy share, requests, system metrics, ...). The log function gets one batch per run: ("", the
steps) for the job's run, then (child key, [its figures at the step they went with]) for each child that has some.

The thread logs the steps queued since its last call together, in one call (one MLflow `log_batch` per run holds
up to 1,000 values), at most once every `log_every_s` unless a flush, a close or a `fresh` step asks for it sooner:
one database commit for several steps, not one per step. The roles' figures change only when the roles rewrite them
(every few seconds), so they are logged once per read, at the newest step of the call that read them, not copied
onto every step.

Invariants:
- steps are logged in the order submitted, each once, with the wall-clock time of its submission and its own
  metrics; the figures of a read go with exactly one step (the newest of that call: its step and timestamp, in the
  job's run and in every child run), and steps get figures in increasing order: a step never gets them twice, and
  a step at or below the last one that got them (the trainer's last counters logged again at the final step, an
  evaluation point at its older version) gets none and causes no read;
- a failure to read the figures or to log is logged as a warning and counted (`failures`: one per failed read,
  one per failed call), never raised into training (the figures of the failed read stay as they were); the steps
  of a failed call are not retried here: retrying, and keeping what MLflow does not take, is the log function's
  (the trainer's is `asyncrl.tracking.spooling_log.SpoolingLog.log_runs`, which raises only when MLflow refused
  some steps or the spool could not be written);
- `flush(timeout_s)` returns True once every step submitted before it is logged (or its call failed), False when
  its deadline passed first; `close()` flushes (bounded) and stops the thread; both are idempotent;
- `external()` is a copy of the last read's `published` figures ({} before the first read);
- the figures are read for the first call, for a call holding a `fresh` step (the last one), and otherwise at
  most once every `read_every_s`.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

log = logging.getLogger(__name__)

StepMetrics = tuple[dict[str, float], int, int]  # (metrics, step, timestamp in ms)
RunSteps = tuple[str, list[StepMetrics]]  # (run: "" for the job's run, else a child run's key; its steps)
LogFn = Callable[[list[RunSteps]], None]
JOB = ""


@dataclass(frozen=True)
class Figures:
    """One read of the other roles' figures: `job` for the job's run, `children` per child run key, `published`
    for `versions/latest.json` (`external()`; default: `job`)."""

    job: dict[str, float] = field(default_factory=dict)
    children: dict[str, dict[str, float]] = field(default_factory=dict)
    published: dict[str, float] | None = None


class StepReporter:
    def __init__(self, read_external: Callable[[], Figures], log_fn: LogFn | None,
                 read_every_s: float = 0.0, log_every_s: float = 0.0,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._read_external = read_external
        self._log = log_fn
        self.read_every_s = float(read_every_s)
        self.log_every_s = float(log_every_s)
        self._clock = clock
        self._last_read: float | None = None
        self._figures_step: int | None = None  # the step the last read's figures went with
        self._last_log: float | None = None
        self.reads = 0
        self.calls = 0
        self._cond = threading.Condition()
        self._queue: deque[tuple[dict[str, float], int, int, bool]] = deque()
        self._pending = 0  # submitted, not yet logged
        self._hurry = 0  # flushes waiting: log what is queued without waiting for `log_every_s`
        self._external: dict[str, float] = {}
        self._closing = False
        self.failures = 0
        self.logged = 0
        self._thread = threading.Thread(target=self._run, name="step-reporter", daemon=True)
        self._thread.start()

    def submit(self, metrics: dict[str, float], step: int, fresh: bool = False) -> None:
        with self._cond:
            if self._closing:
                raise RuntimeError("StepReporter.submit: closed")
            self._queue.append((dict(metrics), int(step), int(time.time() * 1000), fresh))
            self._pending += 1
            self._cond.notify_all()

    def external(self) -> dict[str, float]:
        with self._cond:
            return dict(self._external)

    def flush(self, timeout_s: float) -> bool:
        with self._cond:
            self._hurry += 1
            self._cond.notify_all()
            try:
                done = self._cond.wait_for(lambda: self._pending == 0, timeout_s)
            finally:
                self._hurry -= 1
        if not done:
            log.warning("step reporter: %d step(s) not logged after %.0f s", self._pending, timeout_s)
        return done

    def close(self, timeout_s: float = 30.0) -> None:
        if self._thread.is_alive():
            self.flush(timeout_s)
        with self._cond:
            self._closing = True
            self._cond.notify_all()
        self._thread.join(timeout=5.0)

    def _due(self) -> bool:
        """(Under the lock.) Whether what is queued is to be logged now."""
        if not self._queue:
            return False
        if self._hurry or self._closing or self._last_log is None or any(e[3] for e in self._queue):
            return True
        return self._clock() - self._last_log >= self.log_every_s

    def _take(self) -> list[tuple[dict[str, float], int, int, bool]] | None:
        """Wait until a call is due; the queued steps, or None once closing with nothing queued."""
        with self._cond:
            while not self._due():
                if self._closing and not self._queue:
                    return None
                wait = None
                if self._queue and self._last_log is not None:
                    wait = max(0.0, self.log_every_s - (self._clock() - self._last_log))
                self._cond.wait(wait)
            batch = list(self._queue)
            self._queue.clear()
            return batch

    def _run(self) -> None:
        while (batch := self._take()) is not None:
            now = self._clock()
            fresh = any(e[3] for e in batch)
            entries: list[StepMetrics] = [(metrics, step, ts) for metrics, step, ts, _ in batch]
            # the figures go with the newest step of the call, and only to a step newer than the last that got
            # some: a step logged again (the trainer's last counters) or an older one (an evaluation point) gets none
            newest = max(range(len(entries)), key=lambda i: (entries[i][1], i))
            due = fresh or self._last_read is None or now - self._last_read >= self.read_every_s
            children: list[RunSteps] = []
            if due and (self._figures_step is None or entries[newest][1] > self._figures_step):
                self._last_read = now
                try:
                    self.reads += 1
                    figures = self._read_external()
                    with self._cond:
                        self._external = dict(figures.job if figures.published is None else figures.published)
                    metrics, step, ts = entries[newest]
                    entries[newest] = ({**metrics, **figures.job}, step, ts)
                    children = [(key, [(dict(m), step, ts)]) for key, m in sorted(figures.children.items()) if m]
                    self._figures_step = step
                except Exception as e:  # the figures stay as last read
                    self.failures += 1
                    log.warning("step reporter: reading the roles' figures failed: %s", e)
            try:
                if self._log is not None:
                    self.calls += 1
                    self._log([(JOB, entries), *children])
                self.logged += len(entries)
            except Exception as e:
                self.failures += 1
                log.warning("step reporter: logging steps %d..%d failed: %s", entries[0][1], entries[-1][1], e)
            finally:
                self._last_log = self._clock()
                with self._cond:
                    self._pending -= len(entries)
                    self._cond.notify_all()
