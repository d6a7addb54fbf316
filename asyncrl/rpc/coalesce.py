"""Coalescing many one-item calls into few batch calls, each caller still awaiting its own item's answer.

A role that decides per sample (the rollout scheduler starts, aborts and scores one sample at a time) would make one
HTTP call per sample; with thousands of samples in flight the per-call cost (connection-pool bookkeeping, headers,
request parsing, one handler task each) dominates. `Coalescer.submit(item)` queues the item and returns a future;
everything submitted before the event loop next runs the flush (the same loop iteration: all the tasks a batch of
decisions woke) leaves as one `send(items, futures)` call, split into chunks of at most `max_items` items and
`max_bytes` estimated bytes (the servers' body limit).

Invariants:
- every submitted future is resolved exactly once: by `send` (a result or an exception per item), or, when `send`
  raises or returns leaving some unresolved, with that exception or `Unanswered` (in the call task's done callback,
  so also when the call was cancelled before it ever ran: `close()` right after a flush);
- a future cancelled by its caller (its deadline passed) is skipped by `send` (`settle` ignores done futures);
- items keep their submission order within a chunk; chunks go out concurrently.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Generic, TypeVar

log = logging.getLogger(__name__)

T = TypeVar("T")
R = TypeVar("R")


class Unanswered(RuntimeError):
    """A batch call ended without an answer for this item."""


def settle(fut: asyncio.Future, result: object = None, error: BaseException | None = None) -> None:
    """Resolve `fut` unless it is already done (cancelled by its caller, or answered)."""
    if fut.done():
        return
    if error is not None:
        fut.set_exception(error)
    else:
        fut.set_result(result)


class Coalescer(Generic[T, R]):
    """Queue items, send them in batches (see the module docstring). `size(item)`: its estimated encoded bytes."""

    def __init__(self, send: Callable[[list[T], list[asyncio.Future[R]]], Awaitable[None]], *, max_items: int,
                 max_bytes: int, size: Callable[[T], int] = lambda _: 0, name: str = "batch") -> None:
        if max_items < 1 or max_bytes < 1:
            raise ValueError(f"{name}: expected max_items >= 1 and max_bytes >= 1, got {max_items}, {max_bytes}")
        self._send, self.max_items, self.max_bytes, self._size, self.name = send, max_items, max_bytes, size, name
        self._queue: list[tuple[T, asyncio.Future[R]]] = []
        self._scheduled = False
        self._tasks: set[asyncio.Task[None]] = set()
        self.calls = 0  # batch calls made, over the coalescer's life
        self.items = 0  # items sent

    def submit(self, item: T) -> asyncio.Future[R]:
        """Queue `item`; its answer comes in the returned future."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[R] = loop.create_future()
        self._queue.append((item, fut))
        if not self._scheduled:
            self._scheduled = True
            loop.call_soon(self._flush)
        return fut

    def _chunks(self, queued: list[tuple[T, asyncio.Future[R]]]) -> list[list[tuple[T, asyncio.Future[R]]]]:
        chunks: list[list[tuple[T, asyncio.Future[R]]]] = []
        current: list[tuple[T, asyncio.Future[R]]] = []
        size = 0
        for entry in queued:
            n = self._size(entry[0])
            if current and (len(current) >= self.max_items or size + n > self.max_bytes):
                chunks.append(current)
                current, size = [], 0
            current.append(entry)
            size += n
        if current:
            chunks.append(current)
        return chunks

    def _flush(self) -> None:
        self._scheduled = False
        queued = [(item, fut) for item, fut in self._queue if not fut.done()]
        self._queue = []
        try:
            chunks = self._chunks(queued)
        except Exception as e:  # a size estimate that raised: no queued caller may hang
            for _, fut in queued:
                settle(fut, error=e)
            return
        for chunk in chunks:
            task = asyncio.get_running_loop().create_task(self._run(chunk))
            self._tasks.add(task)
            task.add_done_callback(functools.partial(self._ended, [fut for _, fut in chunk]))

    def _ended(self, futs: list[asyncio.Future[R]], task: asyncio.Task[None]) -> None:
        """A batch call's task is done: every item `send` left unsettled gets the call's exception, or `Unanswered`
        (also when the call was cancelled, even before it ever ran: `close()` right after a flush)."""
        self._tasks.discard(task)
        if task.cancelled():
            error: BaseException = Unanswered(f"{self.name}: the batch call was cancelled")
        else:
            error = task.exception() or Unanswered(f"{self.name}: no answer for this item in the batch call")
        for fut in futs:
            settle(fut, error=error)

    async def _run(self, chunk: list[tuple[T, asyncio.Future[R]]]) -> None:
        """One batch call; what it leaves unsettled, or its exception, is settled by `_ended`."""
        self.calls += 1
        self.items += len(chunk)
        await self._send([item for item, _ in chunk], [fut for _, fut in chunk])

    async def close(self) -> None:
        """Cancel the batch calls in flight (their unanswered items get `Unanswered`)."""
        for task in list(self._tasks):
            task.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
