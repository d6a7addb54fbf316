"""Metric logging that an MLflow outage cannot stop: retried with a deadline, spooled to S3, replayed in order.

`SpoolingLog(send, spool, deadline_s)` is a log function (the trainer's `StepReporter` calls `log_runs` from its
thread, the run's end calls it for the summary). `send(run, steps)` logs steps to one MLflow run: `run` is "" for the
job's run or the key of one of its child runs (`asyncrl.tracking.child_runs.ChildRuns.send`). One call, for one run
or several (each run's steps in one batch), all within `deadline_s` (plus one request's timeout,
`asyncrl.tracking.mlflow_calls`):
1. while the spool may hold entries, it is replayed first, oldest first, each entry to the run it names; each entry
   is deleted only after MLflow accepted it. When MLflow still fails, the replay stops there and the new steps go
   straight to the spool (behind the entries already there: MLflow never gets a newer point before an older one);
2. the batches are sent in order, each retried with backoff and jitter on transient failures;
3. once one still fails, it and the batches after it are appended to the spool (each entry naming its run) and
   the call returns normally: the run goes on.
A refusal (MLflow rejected the request itself: a bad value, a deleted run) is not spooled, since it would block
every later entry; the other batches of the call are still sent, then the first refusal is raised, and the caller
counts and logs it. An entry that MLflow refuses on replay, or that does not decode, is moved to
`tracking/rejected/`.

Exactly once, as far as MLflow allows: a spooled step keeps its timestamp, so a replay writes the very points the
failed call meant to write, and MLflow's SQL store keeps one row per (key, step, timestamp, value): a replay of a
batch that did reach MLflow before its answer was lost (or whose delete from S3 failed) adds nothing.

Counters (`counters()`, logged by the trainer with each step): `tracking/spooled_total` (steps written to the
spool, in every run: a child run's figures at a step count as one), `tracking/replayed_total` (spooled steps MLflow
took later), `tracking/failures_total` (failed MLflow attempts). `replay_run_spool` replays a run's spool from its `tracking.json` (finalize, `asyncrl tracking replay`).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.mlflow_calls import retry_until, transient
from asyncrl.tracking.spool import MetricSpool, SpoolEntryError, StepMetrics, metrics_entry

log = logging.getLogger(__name__)

SendFn = Callable[[str, Sequence[StepMetrics]], None]  # (run: "" for the job's, else a child run's key; its steps)
RunSteps = tuple[str, Sequence[StepMetrics]]


class SpoolingLog:
    def __init__(self, send: SendFn, spool: MetricSpool, deadline_s: float,
                 clock: Callable[[], float] = time.monotonic, sleep: Callable[[float], None] = time.sleep) -> None:
        if deadline_s <= 0:
            raise ValueError(f"deadline_s: expected a positive number of seconds, got {deadline_s}")
        self.send, self.spool, self.deadline_s = send, spool, float(deadline_s)
        self._clock, self._sleep = clock, sleep
        self._lock = threading.Lock()
        self.spooled_total = 0
        self.replayed_total = 0
        self.failures_total = 0
        self._maybe_spooled = True  # until a replay found the spool empty (a crashed attempt may have left entries)

    @property
    def behind(self) -> bool:
        """True while the spool may hold entries (MLflow failed since the last replay that emptied it)."""
        return self._maybe_spooled

    def counters(self) -> dict[str, float]:
        return {"tracking/spooled_total": float(self.spooled_total),
                "tracking/replayed_total": float(self.replayed_total),
                "tracking/failures_total": float(self.failures_total)}

    def _failed(self, _: BaseException) -> None:
        self.failures_total += 1

    def _retry(self, run: str, steps: Sequence[StepMetrics], deadline: float, what: str) -> None:
        retry_until(lambda: self.send(run, steps), deadline, what, clock=self._clock, sleep=self._sleep,
                    on_failure=self._failed)

    def __call__(self, steps: Sequence[StepMetrics], run: str = "") -> None:
        """Log `steps` to run `run` ("": the job's; see the module docstring)."""
        self.log_runs([(run, steps)])

    def log_runs(self, batches: Sequence[RunSteps]) -> None:
        """Log each (run, steps) batch (see the module docstring); raises only for a refusal or when the spool cannot
        be written."""
        batches = [(run, steps) for run, steps in batches if steps]
        if not batches:
            return
        refused: Exception | None = None
        with self._lock:
            deadline = self._clock() + self.deadline_s
            if not self._replay(deadline):
                for run, steps in batches:
                    self._to_spool(run, steps, "older steps are still spooled: MLflow is unavailable")
                return
            for i, (run, steps) in enumerate(batches):
                try:
                    self._retry(run, steps, deadline, f"MLflow: logging steps {steps[0][1]}..{steps[-1][1]}"
                                                      f"{f' of {run}' if run else ''}")
                except Exception as err:
                    if not transient(err):
                        refused = refused or err
                        continue
                    for later_run, later_steps in batches[i:]:  # MLflow is down: no other deadline waited for
                        self._to_spool(later_run, later_steps, f"{type(err).__name__}: {err}")
                    break
        if refused is not None:
            raise refused

    def replay(self, deadline_s: float | None = None) -> bool:
        """Replay the spool, oldest first, within `deadline_s` (default: the log's own); True when it is empty."""
        with self._lock:
            self._maybe_spooled = True
            return self._replay(self._clock() + (self.deadline_s if deadline_s is None else deadline_s))

    def _to_spool(self, run: str, steps: Sequence[StepMetrics], error: str) -> None:
        key = self.spool.append(metrics_entry(steps, error, run))
        self._maybe_spooled = True
        self.spooled_total += len(steps)
        log.warning("MLflow did not take steps %d..%d%s within %.0f s: kept in S3 (%s), logged once MLflow is back (%s)",
                    steps[0][1], steps[-1][1], f" of {run}" if run else "", self.deadline_s, key,
                    error.splitlines()[0][:300])

    def _replay(self, deadline: float) -> bool:
        if not self._maybe_spooled:
            return True
        keys = self.spool.keys()
        for i, key in enumerate(keys):
            try:
                entry = self.spool.read_entry(key)
            except SpoolEntryError as err:
                log.error("tracking spool: %s; moved to %s", err, self.spool.reject(key))
                continue
            if entry is None:  # replayed by someone else meanwhile
                continue
            run, steps = entry
            try:
                self._retry(run, steps, deadline, f"MLflow: replaying {key}")
            except Exception as err:
                if transient(err):
                    log.warning("tracking spool: MLflow still unavailable; %d entr%s kept in S3 (%s)",
                                len(keys) - i, "y" if len(keys) - i == 1 else "ies", str(err).splitlines()[0][:200])
                    return False
                log.error("tracking spool: MLflow refused %s (%s); moved to %s", key, err, self.spool.reject(key))
                continue
            self.spool.delete(key)  # only now: MLflow has it
            self.replayed_total += len(steps)
            log.info("tracking spool: replayed %s (steps %d..%d)", key, steps[0][1] if steps else -1,
                     steps[-1][1] if steps else -1)
        self._maybe_spooled = False
        return True


def replay_run_spool(store: S3Store, paths: RunPaths, tracking: dict[str, Any] | None,
                     deadline_s: float) -> dict[str, Any]:
    """Replay run `paths`' spool into the MLflow run its `tracking.json` (`tracking`) names and its child runs (made
    if needed), within `deadline_s`; {"replayed": steps, "left": entries still spooled, "failures": failed attempts}.
    Without tracking: nothing to replay into ({"left": entries})."""
    spool = MetricSpool(store, paths)
    if not isinstance(tracking, dict) or not tracking.get("mlflow_run_id"):
        return {"replayed": 0, "left": len(spool.keys()), "failures": 0}
    from asyncrl.tracking.child_runs import ChildRuns
    from asyncrl.tracking.mlflow_tracker import Tracker

    tracker = Tracker.for_run(str(tracking["tracking_uri"]), str(tracking["mlflow_run_id"]))
    replaying = SpoolingLog(ChildRuns(tracker, store, paths).send, spool, deadline_s)
    replaying.replay()
    left = len(spool.keys())
    if left:
        log.warning("tracking spool of %s: %d entr%s left in S3 under %s (MLflow unavailable); replay later with "
                    "`asyncrl tracking replay --run-url ...`", paths.run_id, left, "y" if left == 1 else "ies",
                    spool.prefix)
    return {"replayed": replaying.replayed_total, "left": left, "failures": replaying.failures_total}
