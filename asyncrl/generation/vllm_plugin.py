"""asyncrl's vLLM general plugin (entry point `vllm.general_plugins`): loaded by vLLM in every one of its processes
(the server, the engine core, each worker) before they exchange work.

What it owns: how long vLLM's processes busy-wait for each other. vLLM passes each engine step from the engine core
to its workers, and each result back, through a shared-memory ring (`shm_broadcast.MessageQueue`). A reader that
read within the last second spins on the ring with `sched_yield()` instead of sleeping on the writer's notification
(vLLM's `SpinCondition`, one second by default). With cores to spare that saves microseconds per step; on a machine
whose cores the trainer and the control plane share with the engine (a laptop, a CPU test, a small pod), the spinning
takes a whole core between steps and during every forward pass, measured here as a worker at 0.76 of a core for
0.25 of a core of decoding.

`ASYNCRL_VLLM_POLL_S` (set by `GenerationEngine.start` from `generation.ring_poll_s`, inherited by vLLM's child
processes): while a reader is in its busy window it sleeps this long between looks at the ring instead of yielding
the core. Unset: vLLM's own behaviour. The window, and what follows it (sleeping on the writer's notification), are
vLLM's: only the spin inside the window changes. A sleep of 0.5 ms costs at most that per engine step (a decode step
of the default job takes ~25 ms) and frees the core for the processes that share it. (Ending the window at once, so
that every reader sleeps on the notification, is not safe: vLLM's writer drops a notification while the reader's
previous one is unread, and a reader then sleeps until its poll times out; seen as weight updates of 5 and 10 s.)
"""

from __future__ import annotations

import logging
import os
import time

log = logging.getLogger(__name__)

POLL_ENV = "ASYNCRL_VLLM_POLL_S"
MAX_POLL_S = 0.01


def poll_s_from_env() -> float | None:
    """The sleep asked for in the environment; None when unset; ValueError naming the variable when out of range."""
    raw = os.environ.get(POLL_ENV, "").strip()
    if not raw:
        return None
    try:
        value = float(raw)
    except ValueError:
        raise ValueError(f"{POLL_ENV}: expected seconds in [0, {MAX_POLL_S}], got {raw!r}") from None
    if not 0 <= value <= MAX_POLL_S:
        raise ValueError(f"{POLL_ENV}: expected seconds in [0, {MAX_POLL_S}], got {raw!r}")
    return value


def register() -> None:
    """vLLM calls this in each of its processes (possibly more than once): sleep instead of yielding while busy."""
    poll_s = poll_s_from_env()
    if poll_s is None:
        return
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    if getattr(cls, "_asyncrl_poll_s", None) == poll_s:
        return
    original = getattr(cls, "_asyncrl_original_wait", cls.wait)

    def wait(self: shm_broadcast.SpinCondition, timeout_ms: int | None = None) -> None:
        if time.monotonic() <= self.last_read + self.busy_loop_s:
            time.sleep(poll_s)  # vLLM: sched_yield(), which keeps the core busy while others wait for it
            return
        original(self, timeout_ms)

    cls._asyncrl_original_wait = original
    cls._asyncrl_poll_s = poll_s
    cls.wait = wait
    log.debug("vLLM shared-memory readers sleep %.4f s between looks at the ring while busy", poll_s)
