"""A stopping role's waits, each with a deadline: the pod's grace period (30 s by default) ends with SIGKILL.

- `cancel_all` / `cancel_until_done`: cancel tasks and wait for them to end, cancelling them again every
  `CANCEL_EVERY_S` while they run, for at most a deadline. An await may drop a cancellation (Python 3.11's
  `asyncio.wait_for` does when its inner future completes at that moment; a generation request does when its answer
  arrives with the stop) and go on to wait for something long: a reward role that is stopping too.
- `run_bounded`: `asyncio.run` whose teardown is bounded as well. `asyncio.run` cancels the tasks left once and
  waits for them however long, then joins the threads of `asyncio.to_thread` calls still running; here the tasks
  are cancelled until they end or `TEARDOWN_S` passed, and those threads (`DaemonThreadPool`) are left to finish
  by themselves (an S3 call has its own deadline; an object is written whole or not at all).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import queue
import threading
from collections.abc import Callable, Coroutine, Iterable
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
CANCEL_EVERY_S = 1.0  # how often a task that is still running after its cancellation is cancelled again
TEARDOWN_S = 3.0  # what `run_bounded` gives the tasks its coroutine left, and the async generators, to end


async def cancel_all(tasks: Iterable[asyncio.Task[Any]], every_s: float = CANCEL_EVERY_S,
                     deadline_s: float | None = None) -> set[asyncio.Task[Any]]:
    """Cancel `tasks` until each has ended or `deadline_s` passed (None: until they end); those still running.
    The errors of the ones that ended are retrieved, not raised: an error while stopping is not the caller's."""
    loop = asyncio.get_running_loop()
    given = set(tasks)
    end = None if deadline_s is None else loop.time() + deadline_s
    pending = {t for t in given if not t.done()}
    while pending:
        wait_s = every_s if end is None else min(every_s, end - loop.time())
        if wait_s <= 0:
            break
        for t in pending:
            t.cancel()
        _, pending = await asyncio.wait(pending, timeout=wait_s)
    for t in given - pending:
        if not t.cancelled():
            t.exception()
    return pending


async def cancel_until_done(task: asyncio.Task[Any], every_s: float = CANCEL_EVERY_S,
                            deadline_s: float | None = None) -> bool:
    """`cancel_all` for one task: True when it ended."""
    return not await cancel_all([task], every_s, deadline_s)


class DaemonThreadPool(ThreadPoolExecutor):
    """A default executor for an event loop whose threads never hold the interpreter's exit: ThreadPoolExecutor's
    are joined then, so one blocked in a call would keep a stopped role alive. A ThreadPoolExecutor only because
    `loop.set_default_executor` takes nothing else; none of its machinery is used."""

    def __init__(self, max_workers: int | None = None, name: str = "role-io") -> None:
        super().__init__(max_workers=1)
        self._size = max_workers or min(32, (os.cpu_count() or 1) + 4)  # ThreadPoolExecutor's default
        self._name = name
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[..., Any], tuple[Any, ...],
                                            dict[str, Any]] | None] = queue.SimpleQueue()
        self._workers: list[threading.Thread] = []
        self._idle = threading.Semaphore(0)
        self._guard = threading.Lock()
        self._closed = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        with self._guard:
            if self._closed:
                raise RuntimeError("cannot schedule new futures after shutdown")
            future: Future[T] = Future()
            self._jobs.put((future, fn, args, kwargs))
            if not self._idle.acquire(blocking=False) and len(self._workers) < self._size:
                worker = threading.Thread(target=self._work, name=f"{self._name}-{len(self._workers)}", daemon=True)
                self._workers.append(worker)
                worker.start()
        return future

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            future, fn, args, kwargs = job
            if future.set_running_or_notify_cancel():
                try:
                    future.set_result(fn(*args, **kwargs))
                except BaseException as err:  # noqa: BLE001 - the caller's to see, as in ThreadPoolExecutor
                    future.set_exception(err)
            self._idle.release()
        self._jobs.put(None)  # the end, passed on to the next worker

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._guard:
            self._closed = True
        if cancel_futures:
            with contextlib.suppress(queue.Empty):
                while (job := self._jobs.get_nowait()) is not None:
                    job[0].cancel()
        self._jobs.put(None)
        if wait:
            for worker in self._workers:
                worker.join()


async def _end_the_rest(teardown_s: float) -> set[asyncio.Task[Any]]:
    """Cancel the loop's other tasks, those they start on the way too, until none runs or `teardown_s` passed;
    then close the async generators within what is left. The tasks still running."""
    loop, me = asyncio.get_running_loop(), asyncio.current_task()
    end = loop.time() + teardown_s
    while (others := asyncio.all_tasks() - {me}) and end - loop.time() > 0:
        await cancel_all(others, deadline_s=end - loop.time())
    with contextlib.suppress(TimeoutError):
        async with asyncio.timeout(max(0.1, end - loop.time())):
            await loop.shutdown_asyncgens()
    return asyncio.all_tasks() - {me}


def run_bounded(main: Coroutine[Any, Any, T], teardown_s: float = TEARDOWN_S) -> T:
    """Run `main` on a new event loop, as `asyncio.run` does, with a teardown of at most about `teardown_s`."""
    loop = asyncio.new_event_loop()
    loop.set_default_executor(DaemonThreadPool())
    asyncio.set_event_loop(loop)
    try:
        return loop.run_until_complete(main)
    finally:
        try:
            left = loop.run_until_complete(_end_the_rest(teardown_s))
            if left:
                log.warning("%d tasks still running %.0f s after the stop; exiting without them: %s", len(left),
                            teardown_s, sorted(t.get_name() for t in left))
        finally:
            asyncio.set_event_loop(None)
            loop.close()  # the executor's threads still in a call are daemons: they end with the process
