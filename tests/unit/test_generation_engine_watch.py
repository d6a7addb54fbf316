"""The generation role stops, as failed, once its engine is dead (found by the container rehearsal: a vLLM engine
core that died at its first request left the server up and 'healthy', answering every request with HTTP 500)."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace

from asyncrl.roles.generation import stop_when_engine_dies
from asyncrl.roles.liveness import RunOver


def test_a_dead_engine_stops_the_role_with_a_failure() -> None:
    async def scenario() -> tuple[list[RunOver], bool, float]:
        engine = SimpleNamespace(dead=False)
        stop, over = asyncio.Event(), []
        watch = asyncio.create_task(stop_when_engine_dies([engine], stop, over, every_s=0.01))
        await asyncio.sleep(0.05)
        alive_stop = stop.is_set()
        engine.dead = True
        t0 = asyncio.get_running_loop().time()
        await asyncio.wait_for(watch, 2.0)
        return over, alive_stop, asyncio.get_running_loop().time() - t0

    over, stopped_while_alive, took = asyncio.run(scenario())
    assert stopped_while_alive is False
    assert over == [RunOver("the vLLM engine died", 1)]
    assert took < 1.0


def test_the_watch_ends_with_the_role_and_waits_for_the_engine_to_start() -> None:
    async def scenario() -> list[RunOver]:
        engines: list[SimpleNamespace] = []  # the engine has not started yet
        stop, over = asyncio.Event(), []
        watch = asyncio.create_task(stop_when_engine_dies(engines, stop, over, every_s=0.01))
        await asyncio.sleep(0.05)
        stop.set()  # a normal stop
        await asyncio.wait_for(watch, 2.0)
        return over

    assert asyncio.run(scenario()) == []
