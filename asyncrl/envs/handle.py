"""One environment instance behind a deadline: `EnvHandle` (the base of the inline, thread and worker-process
handles), the faults a call can end in (`EnvFault`), and the checks of what an environment returns.

A handle belongs to the executor that opened it (`asyncrl.envs.execution.EnvExecutor`); `HandleOwner` is what a
handle needs of it (its per-name semaphores, counters and deadlines), so the handles of `execution.py` and
`worker.py` build on this module and neither of them on the other's.
"""

from __future__ import annotations

import asyncio
import logging
import math
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

from asyncrl.envs.base import StepResult

log = logging.getLogger(__name__)
FAULT_KINDS = ("raised", "garbage", "timeout", "crashed")


class HandleOwner(Protocol):
    """What a handle needs of the executor that opened it."""

    stats: dict[str, int]
    step_timeout_s: float
    open_timeout_s: float
    max_reply_bytes: int
    _handles: set[Any]

    def _semaphore(self, name: str) -> asyncio.Semaphore: ...
    def _count_fault(self, f: EnvFault, name: str, op: str) -> None: ...


class EnvFault(RuntimeError):
    """An environment call failed; `kind` is one of FAULT_KINDS, `message` says why."""

    def __init__(self, kind: str, message: str) -> None:
        if kind not in FAULT_KINDS:
            raise ValueError(f"EnvFault kind: expected one of {FAULT_KINDS}, got {kind!r}")
        super().__init__(f"{kind}: {message}")
        self.kind, self.message = kind, message


def check_reset(out: Any) -> tuple[str, dict[str, Any]]:
    """`out` if it is an (observation: str, info: dict) pair, else EnvFault("garbage") naming what is wrong."""
    if not isinstance(out, tuple) or len(out) != 2:
        raise EnvFault("garbage", f"reset: expected an (observation, info) pair, got {type(out).__name__}")
    if not isinstance(out[0], str):
        raise EnvFault("garbage", f"reset: observation must be str, got {type(out[0]).__name__}")
    if not isinstance(out[1], dict):
        raise EnvFault("garbage", f"reset: info must be dict, got {type(out[1]).__name__}")
    return out[0], out[1]


def check_step(r: Any) -> StepResult:
    """`r` as a StepResult with float reward if it is well formed, else EnvFault("garbage") naming the field.

    observation str; reward a finite int or float (not bool); terminated/truncated bool; info dict.
    """
    if not isinstance(r, StepResult):
        raise EnvFault("garbage", f"step: expected a StepResult, got {type(r).__name__}")
    if not isinstance(r.observation, str):
        raise EnvFault("garbage", f"step: observation must be str, got {type(r.observation).__name__}")
    if isinstance(r.reward, bool) or not isinstance(r.reward, int | float) or not math.isfinite(r.reward):
        raise EnvFault("garbage", f"step: reward must be a finite number, got {r.reward!r}")
    for field in ("terminated", "truncated"):
        if not isinstance(getattr(r, field), bool):
            raise EnvFault("garbage", f"step: {field} must be bool, got {getattr(r, field)!r}")
    if not isinstance(r.info, dict):
        raise EnvFault("garbage", f"step: info must be dict, got {type(r.info).__name__}")
    return StepResult(r.observation, float(r.reward), r.terminated, r.truncated, r.info)


async def within_deadline(aw: Awaitable[Any], timeout_s: float, what: str) -> Any:
    """`await aw` with a deadline; a deadline miss is EnvFault("timeout"), the awaitable's own TimeoutError is not."""
    cm = asyncio.timeout(timeout_s)
    try:
        async with cm:
            return await aw
    except TimeoutError:
        if cm.expired():
            raise EnvFault("timeout", f"{what}: no answer within {timeout_s:g} s") from None
        raise


class EnvHandle:
    """One environment instance for one episode; see the module docstring for the fault contract."""

    def __init__(self, executor: HandleOwner, name: str) -> None:
        self._ex, self.name = executor, name
        self._busy = self._closed = False
        self._broken: EnvFault | None = None
        self.pid: int | None = None  # the worker process ("processes" mode)

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        """The first observation and info of the episode `seed`; raises EnvFault."""
        return await self._call("reset", seed, check_reset)  # type: ignore[no-any-return]

    async def step(self, action_text: str) -> StepResult:
        """The environment's answer to `action_text`; raises EnvFault."""
        return await self._call("step", action_text, check_step)  # type: ignore[no-any-return]

    async def _call(self, op: str, arg: Any, check: Callable[[Any], Any]) -> Any:
        if self._closed:
            raise RuntimeError(f"environment {self.name!r}: {op} on a closed handle")
        if self._broken is not None:
            raise EnvFault(self._broken.kind, f"{self.name}: handle unusable after: {self._broken.message}")
        if self._busy:
            raise RuntimeError(f"environment {self.name!r}: concurrent calls on one handle")
        self._busy = True
        try:
            async with self._ex._semaphore(self.name):
                self._ex.stats["calls"] += 1
                try:
                    return check(await self._invoke(op, arg, self._ex.step_timeout_s))
                except EnvFault as f:
                    if f.kind in ("timeout", "crashed"):
                        self._broken = f
                    self._ex._count_fault(f, self.name, op)
                    raise
                except asyncio.CancelledError:  # the environment's state is unknown now
                    self._broken = EnvFault("crashed", f"{self.name}.{op} was cancelled")
                    raise
                except Exception as e:
                    f = EnvFault("raised", f"{self.name}.{op}: {type(e).__name__}: {e}")
                    self._ex._count_fault(f, self.name, op)
                    raise f from e
        finally:
            self._busy = False

    async def _invoke(self, op: str, arg: Any, timeout_s: float) -> Any:
        raise NotImplementedError

    async def close(self) -> None:
        """Release the instance (its process is killed and reaped); idempotent, never raises."""
        if self._closed:
            return
        self._closed = True
        self._ex._handles.discard(self)
        try:
            await self._close()
        except Exception as e:
            log.warning("environment %s: close failed: %s: %s", self.name, type(e).__name__, e)

    async def _close(self) -> None:
        return None
