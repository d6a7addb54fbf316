"""The generation engine's /health figures: `ActivityCounters` with a hand-driven clock, and running / waiting / load
read from vLLM's output processor; and the weights-version long poll's waiters."""

from __future__ import annotations

import asyncio
import time
from types import SimpleNamespace

import pytest

from asyncrl.generation.engine import (
    ActivityCounters,
    EngineSettings,
    GenerationEngine,
    _InFlight,
    _sampled_logprobs,
)


class Clock:
    def __init__(self, t: float = 100.0) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_overlapping_requests_count_busy_time_once() -> None:
    clock = Clock()
    c = ActivityCounters(clock)
    clock.t = 101.0
    c.begin()  # busy from 101
    clock.t = 102.0
    c.begin()
    clock.t = 103.0
    c.end(finished=True)
    assert c.snapshot()["busy_s"] == 2.0  # the open interval counts up to now
    clock.t = 104.5
    c.end(finished=False)  # idle from 104.5: 3.5 s busy
    clock.t = 110.0
    c.begin()
    clock.t = 111.0
    c.tokens_generated += 7
    assert c.snapshot() == {"uptime_s": 11.0, "busy_s": 4.5, "tokens_generated": 7, "requests_finished": 1,
                            "requests_aborted": 1, "updates": 0}
    clock.t = 112.0
    c.end(finished=True)
    c.updates += 1
    clock.t = 120.0
    assert c.snapshot() == {"uptime_s": 20.0, "busy_s": 5.5, "tokens_generated": 7, "requests_finished": 2,
                            "requests_aborted": 1, "updates": 1}


def test_end_without_begin_is_an_error() -> None:
    c = ActivityCounters(Clock())
    with pytest.raises(RuntimeError, match="without a matching begin"):
        c.end(finished=True)


# ---- health() figures from vLLM's output processor (requests are sent FINAL_ONLY) ------------------------------
def _engine(states: dict[str, int] | None, inflight: dict[str, int]) -> GenerationEngine:
    """An engine whose `llm` is only what `health()` reads: `states` maps request id → tokens so far (None: a vLLM
    without an output processor); `inflight` maps request id → max_tokens."""
    llm = SimpleNamespace(errored=False)
    if states is not None:
        llm.output_processor = SimpleNamespace(request_states={
            f"{rid}-internal": SimpleNamespace(external_req_id=rid, detokenizer=SimpleNamespace(
                num_output_tokens=lambda n=n: n)) for rid, n in states.items()})
    engine = GenerationEngine(llm, EngineSettings(model="unused"))
    engine._inflight = {rid: _InFlight(max_tokens=m) for rid, m in inflight.items()}
    return engine


def test_health_counts_running_waiting_and_load_from_the_output_processor() -> None:
    h = _engine({"a": 3, "b": 0}, {"a": 10, "b": 6, "c": 4}).health()
    assert (h["running"], h["waiting"], h["load"]) == (1, 2, 7 + 6 + 4)


def test_health_without_progress_counts_every_request_as_waiting() -> None:
    h = _engine(None, {"a": 10, "b": 6}).health()
    assert (h["running"], h["waiting"], h["load"]) == (0, 2, 16)


def test_sampled_logprobs_are_checked_against_the_tokens() -> None:
    flat = SimpleNamespace(token_ids=[5, 9], logprobs=[-0.5, -1.25])
    assert _sampled_logprobs(flat, [5, 9]) == [-0.5, -1.25]
    assert _sampled_logprobs(None, []) == []
    with pytest.raises(RuntimeError, match="one per sampled token"):
        _sampled_logprobs(flat, [5, 9, 2])


def test_version_long_poll_answers_when_an_update_begins_ends_on_its_deadline_and_when_the_server_stops() -> None:
    """`wait_version`: at once when the version is already above `after`; the current version at its deadline; as
    soon as an update to a newer version begins (`updating_to`), and again once it completed (`version`); and at
    once for every waiter (and any later one) once `release_waiters` runs, so that a stopping server does not sit
    out uvicorn's graceful-shutdown timeout on the long polls."""

    def at(version: int, updating_to: int | None = None) -> dict[str, int]:
        return {"version": version, "updating_to": version if updating_to is None else updating_to}

    async def scenario() -> None:
        engine = GenerationEngine(None, EngineSettings(model="unused"))
        engine.version = 2
        assert await engine.wait_version(1, 60) == at(2)
        t0 = time.monotonic()
        assert await engine.wait_version(2, 0.05) == at(2)
        assert time.monotonic() - t0 < 30  # ended by its deadline, not by anything else
        waiter = asyncio.create_task(engine.wait_version(2, 60))
        await asyncio.sleep(0.01)
        assert not waiter.done()
        async with engine._version_changed:  # what update_weights does when the push of version 3 begins
            engine.updating_to = 3
            engine._version_changed.notify_all()
        assert await asyncio.wait_for(waiter, 5) == at(2, 3)
        waiter = asyncio.create_task(engine.wait_version(3, 60))
        await asyncio.sleep(0.01)
        assert not waiter.done()  # the update under way is not news to a caller that knows of it
        async with engine._version_changed:  # ... and once generation resumed with version 4
            engine.version = engine.updating_to = 4
            engine._version_changed.notify_all()
        assert await asyncio.wait_for(waiter, 5) == at(4)
        waiters = [asyncio.create_task(engine.wait_version(4, 60)) for _ in range(3)]
        await asyncio.sleep(0.01)
        assert not any(w.done() for w in waiters)
        await engine.release_waiters()
        assert await asyncio.wait_for(asyncio.gather(*waiters), 5) == [at(4)] * 3
        assert await asyncio.wait_for(engine.wait_version(4, 60), 5) == at(4)  # a later one answers at once

    asyncio.run(scenario())


# ---- requests held for their min_version ------------------------------------------------------------------------
class OneTokenLLM:
    """What `generate` and `abort` call on vLLM's AsyncLLM: every request ends at once with one token."""

    errored = False

    def __init__(self) -> None:
        self.started: list[str] = []
        self.aborted: list[object] = []

    async def generate(self, prompt: object, params: object, request_id: str):  # type: ignore[no-untyped-def]
        self.started.append(request_id)
        yield SimpleNamespace(outputs=[SimpleNamespace(
            finish_reason="length", token_ids=[7], logprobs=SimpleNamespace(token_ids=[7], logprobs=[-0.5]),
            weight_versions=None)])

    async def abort(self, request_ids: object) -> None:
        self.aborted.append(request_ids)


def test_a_request_is_held_until_its_min_version_and_an_abort_ends_it_without_reaching_vllm(
        monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.generation import engine as engine_module
    from asyncrl.generation.engine import EngineUnavailable, GenerateParams

    def params(rid: str, min_version: int) -> GenerateParams:
        return GenerateParams(request_id=rid, prompt_token_ids=[1, 2], max_tokens=1, min_version=min_version)

    async def new_version(engine: GenerationEngine, v: int) -> None:
        async with engine._version_changed:  # what update_weights does once generation resumed with version v
            engine.version = engine.updating_to = v
            engine._version_changed.notify_all()

    async def scenario() -> None:
        llm = OneTokenLLM()
        engine = GenerationEngine(llm, EngineSettings(model="unused", max_model_len=32))
        engine.version = 2
        now = await engine.generate(params("now", 2))  # at its version already: not held
        assert (now["start_version"], now["token_versions"], llm.started) == (2, [2], ["now"])
        held = asyncio.create_task(engine.generate(params("held", 3)))
        await asyncio.sleep(0.05)
        assert not held.done() and llm.started == ["now"]  # vLLM has not seen it
        assert engine.health()["waiting"] == 1
        await new_version(engine, 3)
        out = await asyncio.wait_for(held, 5)
        assert (out["start_version"], out["token_versions"], out["finish_reason"]) == (3, [3], "length")
        assert llm.started == ["now", "held"]

        one, two = (asyncio.create_task(engine.generate(params(r, 9))) for r in ("one", "two"))
        await asyncio.sleep(0.05)
        assert await engine.abort("one") is True
        assert await engine.abort_many(["two", "unknown"]) == ["two"]
        for task in (one, two):
            out = await asyncio.wait_for(task, 5)
            assert (out["finish_reason"], out["token_ids"], out["start_version"]) == ("abort", [], 3)
        assert llm.aborted == [] and llm.started == ["now", "held"]  # ended here, never sent to vLLM
        assert engine._inflight == {}

        monkeypatch.setattr(engine_module, "MAX_HOLD_S", 0.05)
        with pytest.raises(EngineUnavailable, match="min_version: weights version 9 not reached"):
            await engine.generate(params("late", 9))
        monkeypatch.setattr(engine_module, "MAX_HOLD_S", 60.0)
        stopping = asyncio.create_task(engine.generate(params("stopping", 9)))
        await asyncio.sleep(0.05)
        await engine.release_waiters()
        with pytest.raises(EngineUnavailable, match="stopping"):
            await asyncio.wait_for(stopping, 5)
        assert engine._inflight == {} and engine.counters.snapshot()["requests_aborted"] == 4

    asyncio.run(scenario())
