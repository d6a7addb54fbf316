"""Running environment calls safely: off the event loop, with a deadline, a concurrency limit and fault isolation.

`EnvExecutor.open(name, params)` creates one environment instance for one episode and returns an `EnvHandle`;
`handle.reset(seed)` / `handle.step(action)` run it where the executor says:
- "inline": awaited on the caller's event loop (for natively async environments; a blocking one blocks the loop
  and its deadline cannot fire until it yields);
- "threads": a small pool of threads, each running its own event loop forever; an instance is created on, and
  pinned to, one loop thread (round robin). A call that misses its deadline retires its thread (no new work goes
  there; it is a daemon and ends when its stuck call returns) and a fresh thread takes its place, so one hung
  environment never blocks other episodes. Instances pinned to a retired thread move to a live one on their next
  call (so environments must not hold loop-bound resources across calls in this mode);
- "processes": one worker process per instance (`asyncrl.envs.worker`, JSON lines, never pickle), in its own
  process group; a deadline miss, an over-long reply or a dead worker kills the group (SIGKILL) and reaps it.
`name == "remote"` is `RemoteEnvironment(**params)` (url, env, params, timeout_s): natively async, it always runs
inline whatever the executor says. The handle base, `EnvFault` and the result checks live in `handle.py`, the worker
processes' handle in `worker.py`; both build on `handle.py`, and this module on both.

Invariants:
- every reset/step first waits on a semaphore per environment name (`max_concurrent_steps`); the deadline
  `step_timeout_s` starts after the semaphore is acquired;
- a call either returns a validated result or raises `EnvFault` with kind "raised" (the environment raised),
  "garbage" (a malformed result), "timeout" (deadline) or "crashed" (its worker died or was retired under it);
  after a "timeout" or "crashed" the handle only raises (close it and open a new one);
- `open` raises ValueError for an unknown environment or bad parameters (a config error, not a fault), and
  EnvFault when the constructor fails otherwise ("raised") or misses `open_timeout_s` ("timeout": a worker process
  needs an interpreter start first);
- a call cancelled by the caller leaves the handle unusable ("crashed"; its worker process is killed);
- calls on one handle are sequential (a concurrent call is a RuntimeError); the executor is used from one event loop;
- after `aclose()` no worker process is left (killed and reaped) and every thread has been told to stop (threads
  are daemons; one stuck in a non-injected blocking call ends when that call returns).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import threading
from collections.abc import Awaitable, Callable
from typing import Any, Literal, Protocol

from asyncrl.envs.base import make
from asyncrl.envs.handle import FAULT_KINDS, EnvFault, EnvHandle, within_deadline
from asyncrl.envs.injection import EnvInjectionConfig, InjectedEnvironment
from asyncrl.envs.worker import open_process

log = logging.getLogger(__name__)
Executor = Literal["inline", "threads", "processes"]
MAX_REPLY_BYTES = 1 << 20
_CLOSE_TIMEOUT_S = 5.0


class _LoopThread:
    """A daemon thread running its own event loop until stopped."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self.retired = False
        self.thread = threading.Thread(target=self._run, name=name, daemon=True)
        self.thread.start()

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            pending = asyncio.all_tasks(self.loop)
            for task in pending:
                task.cancel()
            with contextlib.suppress(Exception):
                self.loop.run_until_complete(asyncio.gather(*pending, return_exceptions=True))
            self.loop.close()

    async def run(self, fn: Callable[[], Awaitable[Any]]) -> Any:
        """The result of the coroutine `fn()` run on this thread's loop (cancellation is forwarded to it)."""
        cf = asyncio.run_coroutine_threadsafe(_as_coro(fn), self.loop)
        fut = asyncio.wrap_future(cf)
        try:
            return await fut
        except asyncio.CancelledError:
            task = asyncio.current_task()
            if fut.cancelled() and task is not None and task.cancelling() == 0:
                raise EnvFault("crashed", "its worker thread stopped under the call") from None
            raise

    def stop(self) -> None:
        self.retired = True
        with contextlib.suppress(RuntimeError):  # the loop is already closed
            self.loop.call_soon_threadsafe(self.loop.stop)


async def _as_coro(fn: Callable[[], Awaitable[Any]]) -> Any:
    return await fn()


async def _close_env(env: Any) -> None:
    closer = getattr(env, "aclose", None)
    if closer is not None:
        await asyncio.wait_for(closer(), _CLOSE_TIMEOUT_S)


class _InlineHandle(EnvHandle):
    def __init__(self, executor: EnvExecutor, name: str, env: Any) -> None:
        super().__init__(executor, name)
        self.env = env

    async def _invoke(self, op: str, arg: Any, timeout_s: float) -> Any:
        call = self.env.reset(arg) if op == "reset" else self.env.step(arg)
        return await within_deadline(call, timeout_s, f"{self.name}.{op}")

    async def _close(self) -> None:
        await _close_env(self.env)


class _ThreadHandle(EnvHandle):
    def __init__(self, executor: EnvExecutor, name: str, env: Any, thread: _LoopThread) -> None:
        super().__init__(executor, name)
        self.env, self.thread = env, thread

    async def _invoke(self, op: str, arg: Any, timeout_s: float) -> Any:
        if self.thread.retired:
            self.thread = self._ex._pick_thread()
        thread = self.thread

        def fn() -> Awaitable[Any]:
            return self.env.reset(arg) if op == "reset" else self.env.step(arg)

        try:
            return await within_deadline(thread.run(fn), timeout_s, f"{self.name}.{op}")
        except EnvFault as f:
            if f.kind == "timeout":
                self._ex._retire(thread)
            raise

    async def _close(self) -> None:
        if not self.thread.retired and self._broken is None:
            await within_deadline(self.thread.run(lambda: _close_env(self.env)), _CLOSE_TIMEOUT_S, f"{self.name}: close")


class ExecutorSettings(Protocol):
    """The fields of the config's `env` section an executor is made from (`asyncrl.config.schema.EnvConfig`)."""

    executor: Executor
    max_concurrent_steps: int
    step_timeout_s: float


class EnvExecutor:
    """Creates environment instances and runs their calls; see the module docstring."""

    def __init__(self, executor: Executor, max_concurrent_steps: int, step_timeout_s: float,
                 threads: int | None = None, open_timeout_s: float | None = None,
                 max_reply_bytes: int = MAX_REPLY_BYTES) -> None:
        if executor not in ("inline", "threads", "processes"):
            raise ValueError(f"executor: expected inline, threads or processes, got {executor!r}")
        if max_concurrent_steps < 1:
            raise ValueError(f"max_concurrent_steps: expected >= 1, got {max_concurrent_steps}")
        if not step_timeout_s > 0:
            raise ValueError(f"step_timeout_s: expected > 0, got {step_timeout_s}")
        self.executor, self.max_concurrent_steps, self.step_timeout_s = executor, max_concurrent_steps, step_timeout_s
        self.threads = threads if threads is not None else min(max_concurrent_steps, 64)
        if self.threads < 1:
            raise ValueError(f"threads: expected >= 1, got {self.threads}")
        # a worker process needs an interpreter start and imports before its first answer
        self.open_timeout_s = open_timeout_s if open_timeout_s is not None else max(step_timeout_s, 30.0)
        self.max_reply_bytes = max_reply_bytes
        self.stats: dict[str, int] = {k: 0 for k in (
            "opened", "calls", *(f"faults_{k}" for k in FAULT_KINDS), "processes_started", "processes_killed",
            "threads_started", "threads_retired")}
        self._semaphores: dict[str, asyncio.Semaphore] = {}
        self._pool: list[_LoopThread] = []
        self._retired: list[_LoopThread] = []
        self._rr = 0
        self._release = threading.Event()  # ends injected blocking hangs at shutdown
        self._handles: set[EnvHandle] = set()
        self._closed = False

    @classmethod
    def from_config(cls, cfg: ExecutorSettings) -> EnvExecutor:
        """The executor an `EnvConfig` asks for (executor, max_concurrent_steps, step_timeout_s)."""
        return cls(cfg.executor, cfg.max_concurrent_steps, cfg.step_timeout_s)

    def _semaphore(self, name: str) -> asyncio.Semaphore:
        if name not in self._semaphores:
            self._semaphores[name] = asyncio.Semaphore(self.max_concurrent_steps)
        return self._semaphores[name]

    def _count_fault(self, f: EnvFault, name: str, op: str) -> None:
        self.stats[f"faults_{f.kind}"] += 1
        log.info("environment %s.%s fault: %s", name, op, f)

    def _pick_thread(self) -> _LoopThread:
        while len(self._pool) < self.threads:
            self._pool.append(_LoopThread(f"asyncrl-env-{self.stats['threads_started']}"))
            self.stats["threads_started"] += 1
        thread = self._pool[self._rr % len(self._pool)]
        self._rr += 1
        return thread

    def _retire(self, thread: _LoopThread) -> None:
        if thread.retired:
            return
        thread.stop()
        self._pool.remove(thread)
        self._retired.append(thread)
        self.stats["threads_retired"] += 1
        log.warning("environment thread %s missed a deadline: retired, a fresh one replaces it", thread.thread.name)

    async def open(self, name: str, params: dict[str, Any], injection: EnvInjectionConfig | None = None,
                   injection_key: int = 0) -> EnvHandle:
        """A new instance of environment `name` with `params`, with `injection` (per-episode key) if given."""
        if self._closed:
            raise RuntimeError("EnvExecutor.open after aclose")
        mode = "inline" if name == "remote" else self.executor
        try:
            handle = await self._open(mode, name, params, injection, injection_key)
        except (ValueError, EnvFault):
            raise
        except Exception as e:  # the constructor failed: a fault like any other, not a config error
            raise EnvFault("raised", f"{name}: open: {type(e).__name__}: {e}") from e
        self._handles.add(handle)
        self.stats["opened"] += 1
        return handle

    async def _open(self, mode: str, name: str, params: dict[str, Any], injection: EnvInjectionConfig | None,
                    injection_key: int) -> EnvHandle:
        if mode == "processes":
            return await open_process(self, name, params, injection, injection_key)

        def build() -> Any:
            if name == "remote":
                from asyncrl.envs.remote import RemoteEnvironment
                env: Any = RemoteEnvironment(**params)
            else:
                env = make(name, **params)
            if injection is not None:
                env = InjectedEnvironment(env, injection, injection_key, blocking_hang=mode == "threads",
                                          release=self._release)
            return env

        if mode == "inline":
            return _InlineHandle(self, name, build())
        thread = self._pick_thread()

        async def build_async() -> Any:
            return build()

        try:
            env = await within_deadline(thread.run(build_async), self.open_timeout_s, f"{name}: open")
        except EnvFault as f:
            if f.kind == "timeout":
                self._retire(thread)
            raise
        return _ThreadHandle(self, name, env, thread)

    async def aclose(self) -> None:
        """Close every open handle, kill every worker process, stop every thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._release.set()
        await asyncio.gather(*(h.close() for h in list(self._handles)))
        threads = self._pool + self._retired
        for thread in threads:
            thread.stop()
        for thread in threads:
            await asyncio.to_thread(thread.thread.join, 1.0)
            if thread.thread.is_alive():
                log.warning("environment thread %s is stuck in a call; left to end on its own (daemon)",
                            thread.thread.name)
        self._pool, self._retired = [], []
