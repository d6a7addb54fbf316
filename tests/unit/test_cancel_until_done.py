"""`cancel_until_done`: a task that drops the first cancellation still ends, and a plain task ends at once."""

from __future__ import annotations

import asyncio

from asyncrl.roles.environment import cancel_until_done


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
