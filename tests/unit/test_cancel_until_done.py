"""asyncrl/roles/bounded_stop.py: `cancel_until_done` (a task that drops the first cancellation still ends, a plain
task ends at once, one that never ends is given up at the deadline), `run_bounded` and its `DaemonThreadPool`."""

from __future__ import annotations

import asyncio
import contextlib
import threading
import time

import pytest

from asyncrl.roles.bounded_stop import DaemonThreadPool, cancel_until_done, run_bounded


def test_a_task_that_swallows_one_cancellation_is_cancelled_again() -> None:
    swallowed = []

    async def stubborn() -> None:
        try:
            await asyncio.sleep(60)
        except asyncio.CancelledError:
            swallowed.append(True)  # the way wait_for on Python 3.11 can drop a cancel: carry on
            asyncio.current_task().uncancel()  # type: ignore[union-attr]
        await asyncio.sleep(60)

    async def main() -> tuple[bool, float]:
        task = asyncio.create_task(stubborn())
        await asyncio.sleep(0)
        t0 = asyncio.get_running_loop().time()
        await cancel_until_done(task, every_s=0.05)
        return task.cancelled(), asyncio.get_running_loop().time() - t0

    cancelled, took = asyncio.run(main())
    assert swallowed == [True] and cancelled and took < 5


def test_a_task_that_already_failed_is_left_as_it_is() -> None:
    async def fails() -> None:
        raise ValueError("boom")

    async def main() -> asyncio.Task[None]:
        task = asyncio.create_task(fails())
        await asyncio.sleep(0)
        await cancel_until_done(task)
        return task

    task = asyncio.run(main())
    assert isinstance(task.exception(), ValueError)


def test_a_task_that_never_ends_is_given_up_at_the_deadline() -> None:
    async def deaf(let_go: asyncio.Event) -> None:
        while not let_go.is_set():
            try:
                await let_go.wait()
            except asyncio.CancelledError:
                asyncio.current_task().uncancel()  # type: ignore[union-attr]

    async def main() -> tuple[bool, float]:
        let_go = asyncio.Event()
        task = asyncio.create_task(deaf(let_go))
        await asyncio.sleep(0)
        t0 = asyncio.get_running_loop().time()
        ended = await cancel_until_done(task, every_s=0.05, deadline_s=0.3)
        took = asyncio.get_running_loop().time() - t0
        let_go.set()
        await task
        return ended, took

    ended, took = asyncio.run(main())
    assert not ended and 0.25 < took < 3


def test_run_bounded_returns_without_the_tasks_and_threads_its_coroutine_left() -> None:
    release = threading.Event()

    async def never_ends() -> None:
        while True:
            with contextlib.suppress(asyncio.CancelledError):
                await asyncio.sleep(3600)

    async def main() -> int:
        deaf = asyncio.create_task(never_ends())
        asyncio.get_running_loop().run_in_executor(None, release.wait)  # a call that does not return
        await asyncio.sleep(0.05)
        assert not deaf.done()
        return 7

    t0 = time.monotonic()
    try:
        assert run_bounded(main(), teardown_s=0.3) == 7
        took = time.monotonic() - t0
        blocked = [t for t in threading.enumerate() if t.name.startswith("role-io")]
        assert took < 3 and blocked and all(t.daemon for t in blocked)
    finally:
        release.set()


def test_the_daemon_pool_runs_calls_and_refuses_new_ones_after_shutdown() -> None:
    pool = DaemonThreadPool(max_workers=2)
    assert [f.result(5) for f in [pool.submit(pow, 2, n) for n in range(5)]] == [1, 2, 4, 8, 16]
    failed = pool.submit(int, "x")
    assert isinstance(failed.exception(5), ValueError)
    pool.shutdown(wait=True)
    with pytest.raises(RuntimeError):
        pool.submit(pow, 2, 2)
