"""EnvExecutor in its three modes (inline, worker threads, worker processes): results, faults, deadlines, limits.

Real environments, real threads and real worker processes. Test-only environments are registered here under unique
names (they exist in this process only, so the processes mode uses injection instead).
"""

from __future__ import annotations

import asyncio
import math
import os
import signal
import socket
import threading
import time
import uuid
from collections.abc import Awaitable, Callable
from typing import Any

import pytest
import uvicorn

from asyncrl.config.schema import EnvConfig, EnvInjectionConfig
from asyncrl.envs import StepResult, make, register
from asyncrl.envs.execution import EnvExecutor, EnvFault, EnvHandle
from asyncrl.envs.injection import draw
from asyncrl.envs.remote import create_env_app

pytestmark = pytest.mark.integration
MODES = ["inline", "threads", "processes"]
ACTIONS = ["<answer>right</answer>", "down", "nonsense", "right", "down", "down", "right", "up", "left", "down"]

COUNTER = f"test_exec_counter_{uuid.uuid4().hex[:8]}"
BAD = f"test_exec_bad_{uuid.uuid4().hex[:8]}"
BROKEN = f"test_exec_broken_{uuid.uuid4().hex[:8]}"


class _Gauge:
    """How many counter-env steps run at once, and the most seen."""

    lock = threading.Lock()
    now = 0
    peak = 0


@register(COUNTER)
class _CounterEnv:
    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        return f"seed {seed}", {}

    async def step(self, action_text: str) -> StepResult:
        with _Gauge.lock:
            _Gauge.now += 1
            _Gauge.peak = max(_Gauge.peak, _Gauge.now)
        try:
            await asyncio.sleep(0.3)
        finally:
            with _Gauge.lock:
                _Gauge.now -= 1
        return StepResult(action_text, 0.0, False, False, {})


@register(BAD)
class _BadEnv:
    """Returns the malformed value named by `what` (from reset for "reset_info", else from step)."""

    def __init__(self, what: str) -> None:
        self.what = what

    async def reset(self, seed: int) -> Any:
        return ("obs", ["not", "a", "dict"]) if self.what == "reset_info" else ("obs", {})

    async def step(self, action_text: str) -> Any:
        return {"bool_reward": StepResult("o", True, False, False, {}),  # type: ignore[arg-type]
                "inf_reward": StepResult("o", math.inf, False, False, {}),
                "int_done": StepResult("o", 0.0, 1, False, {}),  # type: ignore[arg-type]
                "bytes_obs": StepResult(b"o", 0.0, False, False, {}),  # type: ignore[arg-type]
                "tuple": ("o", 0.0, False, False, {})}[self.what]


@register(BROKEN)
class _BrokenEnv:
    def __init__(self) -> None:
        raise RuntimeError("cannot start")


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run(mode: str, body: Callable[[EnvExecutor], Awaitable[Any]], **kw: Any) -> tuple[Any, EnvExecutor]:
    """Run `body(executor)` on a fresh loop; afterwards no env thread and no worker process may be left."""
    kw = {"max_concurrent_steps": 4, "step_timeout_s": 5.0, **kw}
    ex = EnvExecutor(mode, **kw)  # type: ignore[arg-type]
    pids: list[int] = []
    real_open = ex.open

    async def tracking_open(*a: Any, **k: Any) -> EnvHandle:
        h = await real_open(*a, **k)
        if h.pid is not None:
            pids.append(h.pid)
        return h

    ex.open = tracking_open  # type: ignore[method-assign]

    async def main() -> Any:
        try:
            return await body(ex)
        finally:
            await ex.aclose()

    out = asyncio.run(main())
    assert not [t for t in threading.enumerate() if t.name.startswith("asyncrl-env-")], "env threads left"
    assert not [p for p in pids if _alive(p)], "worker processes left"
    return out, ex


async def _play(reset: Callable[[int], Awaitable[Any]], step: Callable[[str], Awaitable[StepResult]]) -> list:
    obs, info = await reset(11)
    out: list = [(obs, info)]
    for a in ACTIONS:
        r = await step(a)
        out.append((r.observation, r.reward, r.terminated, r.truncated, r.info))
        if r.done:
            break
    return out


@pytest.mark.parametrize("mode", MODES)
def test_episode_equals_the_direct_one(mode: str) -> None:
    params = {"slippery": True, "size": 5}
    env = make("frozenlake", **params)
    direct = asyncio.run(_play(env.reset, env.step))

    async def body(ex: EnvExecutor) -> list:
        h = await ex.open("frozenlake", params)
        out = await _play(h.reset, h.step)
        await h.close()
        await h.close()  # idempotent
        return out

    out, ex = run(mode, body)
    assert out == direct and len(out) > 2
    assert ex.stats["calls"] == len(out) and ex.stats["opened"] == 1
    assert ex.stats["processes_started"] == (1 if mode == "processes" else 0)


@pytest.mark.parametrize("mode", MODES)
def test_raising_environment_and_config_errors(mode: str) -> None:
    async def body(ex: EnvExecutor) -> None:
        h = await ex.open("frozenlake", {}, EnvInjectionConfig(failure_rate=1.0), injection_key=3)
        await h.reset(1)  # resets are never faulted
        with pytest.raises(EnvFault) as e:
            await h.step("down")
        assert e.value.kind == "raised" and "InjectedFault" in e.value.message
        fresh = await ex.open("frozenlake", {})
        with pytest.raises(EnvFault) as e:
            await fresh.step("down")  # the environment's own error: a step before reset
        assert e.value.kind == "raised" and "EpisodeOver" in e.value.message
        await fresh.reset(2)
        assert isinstance((await fresh.step("down")).reward, float)  # a raised fault leaves the handle usable
        with pytest.raises(ValueError, match="unknown name"):
            await ex.open("no_such_env", {})
        with pytest.raises(ValueError, match="size"):
            await ex.open("frozenlake", {"size": 99})
        if mode != "processes":
            with pytest.raises(EnvFault, match="cannot start") as e:
                await ex.open(BROKEN, {})
            assert e.value.kind == "raised"

    _, ex = run(mode, body)
    assert ex.stats["faults_raised"] == 2


def _garbage_keys() -> list[int]:
    """Injection keys whose first step draws each kind of garbage once."""
    cfg, keys, seen = EnvInjectionConfig(garbage_rate=1.0), [], set()
    for k in range(100):
        kind = draw(cfg, k, 1).garbage_kind
        if kind not in seen:
            seen.add(kind)
            keys.append(k)
    assert len(keys) == 3
    return keys


@pytest.mark.parametrize("mode", MODES)
def test_garbage_is_a_fault(mode: str) -> None:
    async def body(ex: EnvExecutor) -> list[str]:
        messages = []
        for key in _garbage_keys():
            h = await ex.open("frozenlake", {}, EnvInjectionConfig(garbage_rate=1.0), injection_key=key)
            await h.reset(1)
            with pytest.raises(EnvFault) as e:
                await h.step("down")
            assert e.value.kind == "garbage"
            messages.append(e.value.message)
        if mode != "processes":
            for what in ("bool_reward", "inf_reward", "int_done", "bytes_obs", "tuple"):
                h = await ex.open(BAD, {"what": what})
                await h.reset(0)
                with pytest.raises(EnvFault, match="garbage"):
                    await h.step("x")
            h = await ex.open(BAD, {"what": "reset_info"})
            with pytest.raises(EnvFault, match="info must be dict"):
                await h.reset(0)
        return messages

    messages, ex = run(mode, body)
    assert any("reward" in m for m in messages) and any("StepResult" in m for m in messages)
    assert ex.stats["faults_garbage"] == (3 if mode == "processes" else 9)


@pytest.mark.parametrize("mode", MODES)
def test_hanging_environment_times_out(mode: str) -> None:
    timeout_s = 1.0

    async def body(ex: EnvExecutor) -> dict[str, Any]:
        before = await ex.open("frozenlake", {})  # pinned to the one thread in threads mode
        hung = await ex.open("frozenlake", {}, EnvInjectionConfig(hang_rate=1.0))
        await hung.reset(1)
        t0 = time.monotonic()
        with pytest.raises(EnvFault) as e:
            await hung.step("down")
        elapsed = time.monotonic() - t0
        assert e.value.kind == "timeout"
        with pytest.raises(EnvFault):
            await hung.step("down")  # the handle is abandoned
        after = await ex.open("frozenlake", {})
        for h in (before, after):
            obs, _ = await h.reset(4)
            assert (await h.step("right")).observation != obs
        gone = hung.pid is not None and not _alive(hung.pid)
        await hung.close()
        return {"elapsed": elapsed, "gone": gone}

    out, ex = run(mode, body, step_timeout_s=timeout_s, threads=1)
    assert timeout_s <= out["elapsed"] < timeout_s + 2.0
    assert ex.stats["faults_timeout"] == 1
    if mode == "threads":
        assert ex.stats["threads_retired"] == 1 and ex.stats["threads_started"] == 2
    if mode == "processes":
        assert out["gone"] and ex.stats["processes_killed"] == 1


@pytest.mark.parametrize("mode", MODES)
def test_concurrent_steps_are_limited_per_environment(mode: str) -> None:
    inj = EnvInjectionConfig(latency_mean_s=0.3)

    async def body(ex: EnvExecutor) -> tuple[float, list[float], float]:
        handles = [await ex.open("frozenlake", {}, inj, injection_key=k) for k in range(6)]
        await asyncio.gather(*(h.reset(k) for k, h in enumerate(handles)))
        other = await ex.open("sokoban", {})  # another name has its own limit: not held up by these
        await other.reset(0)
        t0 = time.monotonic()
        done: list[float] = []

        async def one(h: EnvHandle) -> None:
            await h.step("right")
            done.append(time.monotonic() - t0)

        steps = asyncio.gather(*(one(h) for h in handles))
        await asyncio.sleep(0.05)
        t1 = time.monotonic()
        await other.step("up")
        other_s = time.monotonic() - t1
        await steps
        return time.monotonic() - t0, sorted(done), other_s

    (elapsed, done, other_s), _ = run(mode, body, max_concurrent_steps=2)
    assert 0.9 <= elapsed < 2.5
    for k, t in enumerate(done, start=1):  # at most 2 at a time: the k-th finishes after ceil(k/2) latencies
        assert t >= 0.3 * math.ceil(k / 2) - 0.01, (k, done)
    assert other_s < 0.5  # behind the 4 queued frozenlake steps it would wait >= 0.85 s

    if mode != "processes":
        _Gauge.peak = 0

        async def counted(ex: EnvExecutor) -> float:
            handles = [await ex.open(COUNTER, {}) for _ in range(6)]
            for h in handles:
                await h.reset(0)
            t0 = time.monotonic()
            results = await asyncio.gather(*(h.step(f"a{i}") for i, h in enumerate(handles)))
            assert [r.observation for r in results] == [f"a{i}" for i in range(6)]
            return time.monotonic() - t0

        elapsed, _ = run(mode, counted, max_concurrent_steps=2)
        assert _Gauge.peak == 2 and 0.9 <= elapsed < 2.5


@pytest.mark.parametrize("mode", MODES)
def test_a_cancelled_call_abandons_the_handle(mode: str) -> None:
    async def body(ex: EnvExecutor) -> tuple[int | None, bool]:
        h = await ex.open("frozenlake", {}, EnvInjectionConfig(latency_mean_s=5.0))
        task = asyncio.ensure_future(h.reset(1))
        await asyncio.sleep(0.2)
        task.cancel()
        t0 = time.monotonic()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert time.monotonic() - t0 < 1.0
        with pytest.raises(EnvFault, match="cancelled") as e:
            await h.reset(1)
        assert e.value.kind == "crashed"
        deadline = time.monotonic() + 3.0  # the killed worker is reaped by asyncio's child watcher
        while h.pid is not None and _alive(h.pid) and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        return h.pid, h.pid is not None and _alive(h.pid)

    (pid, alive), ex = run(mode, body)
    assert (pid is not None) == (mode == "processes") and not alive
    assert EnvExecutor.from_config(EnvConfig(executor=mode, max_concurrent_steps=3, step_timeout_s=2.0)).threads == 3


def test_processes_crash_and_overlong_reply() -> None:
    async def body(ex: EnvExecutor) -> None:
        h = await ex.open("frozenlake", {})
        await h.reset(1)
        assert h.pid is not None
        os.kill(h.pid, signal.SIGKILL)
        with pytest.raises(EnvFault) as e:
            await h.step("down")
        assert e.value.kind == "crashed"
        long = await ex.open("frozenlake", {"size": 16})  # its observation is longer than the reply bound
        with pytest.raises(EnvFault) as e:
            await long.reset(1)
        assert e.value.kind == "garbage" and "longer than" in e.value.message
        assert long.pid is not None and not _alive(long.pid)
        small = await ex.open("frozenlake", {"size": 2})
        await small.reset(1)

    _, ex = run("processes", body, max_reply_bytes=500)
    assert ex.stats["faults_crashed"] == 1 and ex.stats["faults_garbage"] == 1


def test_remote_runs_inline_whatever_the_executor() -> None:
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(create_env_app(), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "environment server did not start"
        time.sleep(0.05)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}"
    try:
        env = make("frozenlake")
        direct = asyncio.run(_play(env.reset, env.step))

        async def body(ex: EnvExecutor) -> list:
            h = await ex.open("remote", {"url": url, "env": "frozenlake", "timeout_s": 10.0})
            assert h.pid is None
            return await _play(h.reset, h.step)

        out, ex = run("processes", body)
        assert out == direct
        assert ex.stats["processes_started"] == 0
    finally:
        server.should_exit = True
        thread.join(timeout=10)
        sock.close()
