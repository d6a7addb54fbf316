"""The trainer's reporting, off the step's critical path: MLflow logging and the other roles' figures.

A training step hands its own metrics to `StepReporter.submit` and goes on. A background thread then reads the
other roles' figures (`read_external`: their heartbeats and the environment writers' rollout stats, S3 reads) and
logs the step's metrics merged with those figures (`log`: MLflow). So a step makes no MLflow call and no S3 read
for reporting; what it publishes in `versions/latest.json` carries the figures the thread read last (`external()`).

Invariants:
- steps are logged in the order submitted, each once, with the wall-clock time of its submission;
- a failure to read the figures or to log is logged as a warning and counted (`failures`), never raised into
  training (the figures of the failed read stay as they were);
- `flush(timeout_s)` returns True once every step submitted before it is logged, False when its deadline passed
  first; `close()` flushes (bounded) and stops the thread; both are idempotent;
- `external()` is a copy of the figures as last read ({} before the first read);
- the figures are read for the first step logged, for a step submitted with `fresh=True` (the last one), and
  otherwise at most once every `read_every_s` (the roles rewrite them only every few seconds: reading them for every
  step re-reads the same objects, six S3 requests a step).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable

log = logging.getLogger(__name__)

LogFn = Callable[[dict[str, float], int, int], None]  # (metrics, step, timestamp in ms)


class StepReporter:
    def __init__(self, read_external: Callable[[], dict[str, float]], log_fn: LogFn | None,
                 read_every_s: float = 0.0, clock: Callable[[], float] = time.monotonic) -> None:
        self._read_external = read_external
        self._log = log_fn
        self.read_every_s = float(read_every_s)
        self._clock = clock
        self._last_read: float | None = None
        self.reads = 0
        self._cond = threading.Condition()
        self._queue: deque[tuple[dict[str, float], int, int, bool]] = deque()
        self._pending = 0  # submitted, not yet logged
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
            done = self._cond.wait_for(lambda: self._pending == 0, timeout_s)
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

    def _run(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._queue or self._closing)
                if not self._queue:
                    return
                metrics, step, ts, fresh = self._queue.popleft()
            now = self._clock()
            if fresh or self._last_read is None or now - self._last_read >= self.read_every_s:
                self._last_read = now
                try:
                    self.reads += 1
                    fresh = self._read_external()
                    with self._cond:
                        self._external = dict(fresh)
                except Exception as e:  # the figures stay as last read
                    self.failures += 1
                    log.warning("step reporter: reading the roles' figures failed: %s", e)
            try:
                if self._log is not None:
                    self._log({**metrics, **self.external()}, step, ts)
                self.logged += 1
            except Exception as e:
                self.failures += 1
                log.warning("step reporter: logging step %d failed: %s", step, e)
            finally:
                with self._cond:
                    self._pending -= 1
                    self._cond.notify_all()
