"""Heartbeats and the end of a run: how every role knows when to exit, so a failed run never keeps GPUs.

Every role writes `heartbeats/<role>/<id>.json` every `timeouts.heartbeat_s` from a background thread (`Heartbeat`):
{role, id, seq, state, pid, time, metrics}. `seq` grows by one per write; `state` is "running", then "finished",
"failed" (with `error`) or "stopped" (stopped by a signal before the run was done, `asyncrl.roles.stop_signal`);
`metrics` are the role's own figures, which the trainer logs to MLflow under `<role>/<id>/<name>` so every metric
carries the role that produced it.

The roles that serve the trainer (generation, reward, environment) watch the run (`watch_run`) and exit by
themselves when:
- the run's `done` marker exists (the trainer finished, or the pipeline's finalize step ran): exit code 0;
- the trainer's heartbeat says "failed" or "stopped": exit code 1 at once (a resume deletes the crashed attempt's
  heartbeats before any role starts, see `asyncrl.run.resume`);
- the trainer's heartbeat has not appeared within `timeouts.rendezvous_s`, or its `seq` has not advanced for
  `timeouts.peer_s` (killed, OOM, node lost): exit code 1.

A role the embedded launcher started (it sets `ORPHAN_ENV`) also ends when the launcher is gone (`exit_when_orphaned`):
the kernel's SIGTERM (`PR_SET_PDEATHSIG`) starts the usual graceful stop, and a stop still running `ORPHAN_GRACE_S`
later (stuck retrying the S3 server that died with the launcher) is cut short: the role's process group (the role
and the engine processes it started) is killed.

Staleness is judged by `PeerWatch` on this process's monotonic clock from the sequence numbers it observed, never
by comparing the peer's wall clock with ours, so clock skew between pods cannot end a run or keep one alive.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import threading
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from asyncrl.roles.stop_signal import RoleStopped
from asyncrl.roles.system_metrics import SystemSampler
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

ORPHAN_ENV = "ASYNCRL_EXIT_WHEN_ORPHANED"
ORPHAN_GRACE_S = 15.0


def exit_when_orphaned(grace_s: float = ORPHAN_GRACE_S, poll_s: float = 1.0) -> threading.Thread | None:
    """With `ORPHAN_ENV` set (the embedded launcher sets it; it starts each role in a session of its own), watch the
    parent from a daemon thread: once it has changed (the launcher died), allow `grace_s` for the graceful stop its
    death triggered, then kill this process's group and exit. None (no watch) without the variable."""
    if not os.environ.get(ORPHAN_ENV):
        return None
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(poll_s)
        time.sleep(grace_s)
        log.error("the launcher (pid %d) is gone and the stop did not finish within %.0f s: exiting", parent, grace_s)
        logging.shutdown()
        if os.getpgid(0) == os.getpid():  # our own session's group: the role and what it started, never the caller's
            os.killpg(0, signal.SIGKILL)
        os._exit(1)

    thread = threading.Thread(target=watch, name="orphan-watch", daemon=True)
    thread.start()
    return thread

log = logging.getLogger(__name__)

TRAINER = ("training", "0")


class Heartbeat:
    """A daemon thread that writes this role's heartbeat document every `interval_s` seconds.

    `metrics` may be replaced at any time by the role (a new dict: the assignment is atomic); the thread writes
    the latest one. A failed S3 write is logged and retried at the next beat: peers tolerate `peer_s` of silence.
    """

    def __init__(self, store: S3Store, paths: RunPaths, role: str, role_id: str, interval_s: float) -> None:
        self.store, self.key = store, paths.heartbeat(role, role_id)
        self.role, self.role_id, self.interval_s = role, role_id, interval_s
        self.metrics: Mapping[str, float] = {}
        self.seq = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()  # one write at a time: the final state must be the last document
        self._thread = threading.Thread(target=self._loop, name=f"heartbeat-{role}-{role_id}", daemon=True)
        self._final = False
        self.system = SystemSampler()  # the role's CPU, memory, GPU: `system` of each beat

    def __enter__(self) -> Heartbeat:
        self.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if isinstance(exc, RoleStopped):  # the role's StopSignal.finish writes the last state, within its deadline
            self._stop.set()
            return
        if exc is None or isinstance(exc, SystemExit) and exc.code in (0, None):
            self.stop("finished")
        else:
            self.stop("failed", f"{type(exc).__name__}: {exc}")

    def start(self) -> None:
        self.beat()
        self._thread.start()

    def beat(self, state: str = "running", error: str = "") -> None:
        with self._lock:
            if self._final:
                return
            self.seq += 1
            doc: dict[str, Any] = {"role": self.role, "id": self.role_id, "seq": self.seq, "state": state,
                                   "pid": os.getpid(), "time": time.time(), "metrics": dict(self.metrics),
                                   "system": self.system.sample()}
            if error:
                doc["error"] = error[:2000]
            try:
                self.store.put_json(self.key, doc)
            except Exception as err:  # noqa: BLE001 - a missed beat is survivable, peers wait peer_s
                log.warning("heartbeat %s/%s: write failed (%s); retrying next beat", self.role, self.role_id, err)
                return
            self._final = state != "running"

    def stop(self, state: str = "finished", error: str = "") -> None:
        """Stop beating and write the final state ("finished", "failed" or "stopped")."""
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=self.interval_s + 5)
        self.beat(state, error)

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.beat()


class PeerWatch:
    """Pure: is a peer alive, from the heartbeat sequence numbers observed at local monotonic times?

    Invariant: the peer is declared gone only if no heartbeat appeared within `first_s` of the watch's start, or
    its seq has not changed for more than `peer_s` since the last change this watch saw.
    """

    def __init__(self, first_s: float, peer_s: float, now: float) -> None:
        self.first_s, self.peer_s = first_s, peer_s
        self.started = now
        self.last_seq: int | None = None
        self.last_change = now

    def observe(self, seq: int | None, now: float) -> str | None:
        """Record one observation; returns None while alive, else why the peer is gone."""
        if seq is None:
            if self.last_seq is None and now - self.started > self.first_s:
                return f"no heartbeat within {self.first_s:.0f}s"
            if self.last_seq is not None and now - self.last_change > self.peer_s:
                return f"heartbeat gone for {now - self.last_change:.0f}s (limit {self.peer_s:.0f}s)"
            return None
        if seq != self.last_seq:
            self.last_seq, self.last_change = seq, now
            return None
        if now - self.last_change > self.peer_s:
            return f"heartbeat stuck at seq {seq} for {now - self.last_change:.0f}s (limit {self.peer_s:.0f}s)"
        return None


@dataclass(frozen=True)
class RunOver:
    """Why a watching role stops: `exit_code` 0 when the run is done, 1 when the trainer failed or is gone."""

    reason: str
    exit_code: int


def check_run(store: S3Store, paths: RunPaths, watch: PeerWatch, now: float) -> RunOver | None:
    """One look at the run: the done marker, then the trainer's heartbeat. None while the run goes on."""
    if store.exists(paths.done()):
        return RunOver("the run is done", 0)
    doc = store.get_json(paths.heartbeat(*TRAINER))
    seq = int(doc["seq"]) if isinstance(doc, dict) and isinstance(doc.get("seq"), int) else None
    if isinstance(doc, dict) and doc.get("state") == "failed":
        return RunOver(f"the trainer failed: {doc.get('error', 'no error recorded')}", 1)
    if isinstance(doc, dict) and doc.get("state") == "stopped":
        return RunOver(f"the trainer was {doc.get('error', 'stopped by a signal')} before the run was done", 1)
    if isinstance(doc, dict) and doc.get("state") == "finished":
        return RunOver("the trainer finished", 0)
    gone = watch.observe(seq, now)
    return RunOver(f"the trainer is gone: {gone}", 1) if gone else None


async def watch_run(store: S3Store, paths: RunPaths, poll_s: float, first_s: float, peer_s: float) -> RunOver:
    """Poll every `poll_s` until the run is over (see `check_run`); S3 errors count as a missed look."""
    watch = PeerWatch(first_s, peer_s, time.monotonic())
    while True:
        try:
            over = await asyncio.to_thread(check_run, store, paths, watch, time.monotonic())
        except Exception as err:  # noqa: BLE001 - S3 unreachable for a moment: the peer deadline still applies
            log.warning("run watch: %s", err)
            gone = watch.observe(watch.last_seq, time.monotonic())
            over = RunOver(f"the trainer is gone: {gone}", 1) if gone else None
        if over is not None:
            log.info("run over: %s", over.reason)
            return over
        await asyncio.sleep(poll_s)
