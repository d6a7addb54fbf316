"""How a role ends when it is told to stop: SIGTERM (Kubernetes stopping its pod: a run terminated from the Kubeflow
UI, an eviction, a node drain; torchrun forwarding it to the training ranks) or SIGINT.

`StopSignal` notes the first such signal and turns it into the role's own stop:
- a serving role (generation, reward) or the environment role, on its event loop (`on_loop`): the signal sets the
  role's stop event, the server stops taking requests and shuts its engine down, the writer's work is cancelled
  (a group object is written whole or not at all: an unwritten one is simply not there);
- the training ranks (`raise_in_main`): the signal raises `RoleStopped` in the main thread once (a second signal
  does not interrupt the clean-up), so the step under way is abandoned; a checkpoint is committed by its
  `COMMITTED` object, written last, so one cut short is never read, and every committed one stays.
Then `finish` (each role's `main`): when the run has no `done` marker yet, the stop is recorded once in the run's
`stopped.json` (`asyncrl.run.stop`), the heartbeat's last state is "stopped" (the trainer's tells the other roles
the run will not go on) and the role exits with 128 + the signal's number, as a process killed by it would, so
Kubernetes counts the pod as not succeeded (a retried generation pod is retried); after the `done` marker it is
the run's normal end: exit code 0. Every S3 call here is bounded by `STOP_S3_TIMEOUT_S`: the pod's grace period
(30 s by default) ends with SIGKILL.
"""

from __future__ import annotations

import asyncio
import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

from asyncrl.run.stop import record_stop
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT)
STOP_S3_TIMEOUT_S = 10.0  # the stop's record and the heartbeat's last state, within the pod's grace period


class RoleStopped(BaseException):  # noqa: N818 - it is not an error: the role was told to stop
    """Raised in a training rank's main thread by the first stop signal; a BaseException, as KeyboardInterrupt is,
    so that no `except Exception` on the way (a retry, a logged fault) swallows it."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


class StopSignal:
    """The first stop signal this process received (`signum`, None until then)."""

    def __init__(self) -> None:
        self.signum: int | None = None

    @property
    def name(self) -> str:
        return signal.Signals(self.signum).name if self.signum is not None else ""

    def note(self, signum: int) -> bool:
        """Record `signum`; True when it is the first stop signal."""
        if self.signum is not None:
            log.warning("%s again: already stopping", signal.Signals(signum).name)
            return False
        self.signum = signum
        log.warning("%s received: stopping", signal.Signals(signum).name)
        return True

    def on_loop(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        """On `loop` (in the main thread), a stop signal sets `stop`."""

        def handle(signum: int) -> None:
            self.note(signum)
            stop.set()

        for sig in STOP_SIGNALS:
            loop.add_signal_handler(sig, handle, sig)

    def raise_in_main(self) -> None:
        """The first stop signal raises `RoleStopped` in the main thread; later ones are only logged."""

        def handle(signum: int, frame: Any) -> None:
            if self.note(signum):
                raise RoleStopped(signum)

        for sig in STOP_SIGNALS:
            signal.signal(sig, handle)

    def finish(self, store: S3Store, paths: RunPaths, role: str, role_id: str,
               last_beat: Callable[[str, str], None] | None) -> int:
        """After the role stopped on a signal: record the stop unless the run is done, write the heartbeat's last
        state (`last_beat(state, error)`); the process's exit code (0 when the run was done)."""
        assert self.signum is not None, "finish: no stop signal was received"
        for sig in STOP_SIGNALS:  # a further signal (its handlers went with the event loop) must not cut this short
            signal.signal(sig, lambda signum, frame: self.note(signum))
        done = bounded(lambda: store.exists(paths.done()), f"{role}[{role_id}]: look for the done marker")
        if done:
            if last_beat is not None:
                bounded(lambda: last_beat("finished", ""), f"{role}[{role_id}]: last heartbeat")
            return 0
        bounded(lambda: record_stop(store, paths, role, role_id, self.name), f"{role}[{role_id}]: record the stop")
        if last_beat is not None:
            bounded(lambda: last_beat("stopped", f"stopped by {self.name}"), f"{role}[{role_id}]: last heartbeat")
        return 128 + self.signum


def bounded(fn: Callable[[], Any], what: str, timeout_s: float = STOP_S3_TIMEOUT_S) -> Any:
    """`fn()` in a daemon thread, waited for at most `timeout_s`; None (logged) when it failed or took longer."""
    out: list[Any] = []

    def call() -> None:
        try:
            out.append(fn())
        except Exception as err:  # noqa: BLE001 - a stopping role logs what it could not record and exits anyway
            log.warning("%s: %s", what, err)

    thread = threading.Thread(target=call, name="stop-record", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        log.warning("%s: no answer within %.0f s; exiting without it", what, timeout_s)
    return out[0] if out else None
