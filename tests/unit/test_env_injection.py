"""Injected latency and faults (asyncrl.envs.injection) and the hang detector (asyncrl.envs.hang): pure logic."""

from __future__ import annotations

import asyncio
import math
import time

import pytest

from asyncrl.config.schema import EnvInjectionConfig
from asyncrl.envs import make
from asyncrl.envs.base import StepResult
from asyncrl.envs.hang import ProgressWatch
from asyncrl.envs.injection import InjectedEnvironment, InjectedFault, call_seed, draw, lognormal_params


def test_lognormal_params_exact() -> None:
    # mean 10, std 10: sigma^2 = ln(1 + 1) = ln 2; mu = ln 10 - ln 2 / 2
    mu, sigma = lognormal_params(10.0, 10.0)
    assert sigma == pytest.approx(0.8325546111576977, abs=1e-15)
    assert mu == pytest.approx(1.9560115027140730, abs=1e-15)
    # mean 2, std 0: the point 2 (mu = ln 2, sigma = 0)
    assert lognormal_params(2.0, 0.0) == (pytest.approx(0.6931471805599453, abs=1e-15), 0.0)
    # mean 1, std 3: sigma^2 = ln 10, mu = -ln 10 / 2
    mu, sigma = lognormal_params(1.0, 3.0)
    assert (mu, sigma) == (pytest.approx(-1.1512925464970228, abs=1e-15), pytest.approx(1.5174271293851465, abs=1e-15))
    # the moments come back: E = exp(mu + sigma^2/2), Var = (exp(sigma^2) - 1) E^2
    mu, sigma = lognormal_params(0.3, 0.7)
    assert math.exp(mu + sigma**2 / 2) == pytest.approx(0.3, rel=1e-12)
    assert math.sqrt((math.exp(sigma**2) - 1) * math.exp(2 * mu + sigma**2)) == pytest.approx(0.7, rel=1e-12)
    with pytest.raises(ValueError, match="latency_mean_s"):
        lognormal_params(0.0, 1.0)
    with pytest.raises(ValueError, match="latency_std_s"):
        lognormal_params(1.0, -1.0)


def test_draw_latency_rules() -> None:
    point = EnvInjectionConfig(latency_mean_s=1.5)
    assert {draw(point, k, i).latency_s for k in range(5) for i in range(5)} == {1.5}
    slow = EnvInjectionConfig(latency_mean_s=1.5, slowdown_rate=1.0, slowdown_factor=4.0)
    assert draw(slow, 3, 7).latency_s == 6.0
    none = EnvInjectionConfig(latency_mean_s=0.0, latency_std_s=5.0, slowdown_rate=1.0)
    assert draw(none, 3, 7).latency_s == 0.0
    spread = EnvInjectionConfig(latency_mean_s=2.0, latency_std_s=1.0)
    xs = [draw(spread, 1, i).latency_s for i in range(4000)]
    mean = sum(xs) / len(xs)
    std = math.sqrt(sum((x - mean) ** 2 for x in xs) / (len(xs) - 1))
    assert mean == pytest.approx(2.0, abs=0.06)  # standard error 1/sqrt(4000) = 0.016
    assert std == pytest.approx(1.0, abs=0.1)
    assert min(xs) > 0


def test_call_seed_is_stable_and_distinct() -> None:
    assert call_seed(0, 1, 2) == call_seed(0, 1, 2)
    assert len({call_seed(s, k, i) for s in range(3) for k in range(3) for i in range(3)}) == 27
    # fixed values: the same in every process and on every platform (blake2b, not Python's salted hash)
    assert call_seed(0, 0, 0) == 12872406698261679099
    assert call_seed(7, 3, 1) == 11584467371280895624


async def _outcome(env: InjectedEnvironment) -> str:
    await env.reset(5)
    try:
        r = await env.step("right")
    except InjectedFault:
        return "fail"
    if isinstance(r, StepResult) and isinstance(r.reward, float) and math.isfinite(r.reward):
        return "ok"
    return "garbage"


def test_rates_and_determinism_over_2000_episodes() -> None:
    cfg = EnvInjectionConfig(failure_rate=0.1, garbage_rate=0.2, seed=7)

    async def run(keys: range) -> list[str]:
        return [await _outcome(InjectedEnvironment(make("frozenlake"), cfg, key=k)) for k in keys]

    outcomes = asyncio.run(run(range(2000)))
    share = {k: outcomes.count(k) / len(outcomes) for k in ("fail", "garbage", "ok")}
    # binomial standard errors: 0.0067 (10%) and 0.0089 (20%): 4 of them as tolerance
    assert share["fail"] == pytest.approx(0.1, abs=0.027)
    assert share["garbage"] == pytest.approx(0.2, abs=0.036)
    assert share["ok"] == pytest.approx(0.7, abs=0.04)
    # the same keys give the same fates; another seed gives others
    assert asyncio.run(run(range(200))) == outcomes[:200]
    other = EnvInjectionConfig(failure_rate=0.1, garbage_rate=0.2, seed=8)

    async def run_other() -> list[str]:
        return [await _outcome(InjectedEnvironment(make("frozenlake"), other, key=k)) for k in range(200)]

    assert asyncio.run(run_other()) != outcomes[:200]


def test_faults_hit_step_only_and_do_not_reach_the_inner_env() -> None:
    cfg = EnvInjectionConfig(failure_rate=1.0)

    async def run() -> tuple[str, int]:
        inner = make("frozenlake")
        env = InjectedEnvironment(inner, cfg, key=0)
        obs, _ = await env.reset(3)  # a reset is never faulted
        with pytest.raises(InjectedFault):
            await env.step("right")
        return obs, inner.steps  # type: ignore[attr-defined]

    obs, steps = asyncio.run(run())
    assert obs.startswith("P") and steps == 0


def test_clean_injection_is_transparent_and_hang_blocks() -> None:
    async def play(env) -> list[tuple]:
        out = [await env.reset(11)]
        for a in ["right", "down", "right", "down", "down", "right"]:
            r = await env.step(a)
            out.append((r.observation, r.reward, r.terminated, r.truncated))
            if r.done:
                break
        return out

    plain = asyncio.run(play(make("frozenlake")))
    assert asyncio.run(play(InjectedEnvironment(make("frozenlake"), EnvInjectionConfig(), key=3))) == plain

    async def hang() -> None:
        env = InjectedEnvironment(make("frozenlake"), EnvInjectionConfig(hang_rate=1.0), key=0)
        await env.reset(1)
        await asyncio.wait_for(env.step("down"), 0.2)

    t0 = time.monotonic()
    with pytest.raises(TimeoutError):
        asyncio.run(hang())
    assert time.monotonic() - t0 < 60.0  # the hang itself lasts years: this only shows wait_for cancelled it


def test_latency_waits_without_blocking_the_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    """The five resets' latency waits are all pending at once (they overlap): shown by counting the sleeps in
    flight, not by a wall-clock bound, which a loaded machine breaks."""
    cfg = EnvInjectionConfig(latency_mean_s=0.2)
    real_sleep = asyncio.sleep
    waits: list[float] = []
    in_flight = [0, 0]  # now, most at once

    async def counted_sleep(delay: float, *args, **kwargs):
        waits.append(delay)
        in_flight[0] += 1
        in_flight[1] = max(in_flight[1], in_flight[0])
        try:
            return await real_sleep(delay, *args, **kwargs)
        finally:
            in_flight[0] -= 1

    monkeypatch.setattr(asyncio, "sleep", counted_sleep)

    async def run() -> float:
        envs = [InjectedEnvironment(make("frozenlake"), cfg, key=k) for k in range(5)]
        t0 = time.monotonic()
        await asyncio.gather(*(e.reset(1) for e in envs))
        return time.monotonic() - t0

    assert asyncio.run(run()) >= 0.2
    assert waits == [0.2] * 5
    assert in_flight == [0, 5]


class _Clock:
    def __init__(self) -> None:
        self.t = 100.0

    def __call__(self) -> float:
        return self.t


def test_progress_watch_reports_each_stall_once() -> None:
    clock = _Clock()
    w = ProgressWatch(10.0, clock=clock)
    w.touch("a", "generate")
    clock.t = 105.0
    w.touch("b", "env.step")
    clock.t = 110.0
    assert w.stalled() == []  # a is idle exactly 10 s: not more than the threshold
    clock.t = 110.5
    assert w.stalled() == [("a", 10.5, "generate")]
    assert w.stalled() == []  # reported once
    clock.t = 120.0
    assert w.stalled() == [("b", 15.0, "env.step")]
    w.touch("a", "env.step")  # progress: a may stall again
    assert w.stalled(now=130.0) == []
    assert w.stalled(now=131.0) == [("a", 11.0, "env.step")]
    w.forget("b")
    w.forget("unknown")
    assert len(w) == 1


def test_progress_watch_orders_longest_idle_first() -> None:
    clock = _Clock()
    w = ProgressWatch(1.0, clock=clock)
    for i, key in enumerate(["x", "y", "z"]):
        clock.t = 100.0 + i
        w.touch(key, f"w{i}")
    clock.t = 101.0  # re-touching x puts it after z in touch order
    w.touch("x", "again")
    # idle at 110: y 9 s, x 9 s, z 8 s; y before x (tie: touch order), z last
    assert w.stalled(now=110.0) == [("y", 9.0, "w1"), ("x", 9.0, "again"), ("z", 8.0, "w2")]
    with pytest.raises(ValueError, match="report_after_s"):
        ProgressWatch(0.0)
