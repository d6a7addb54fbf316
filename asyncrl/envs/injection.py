"""Latency and fault injection around any environment, for benchmarks and fault tests.

`InjectedEnvironment(inner, cfg, key)` wraps an `Environment`. Each call (reset or step, counted together from 0)
draws its fate from `random.Random(seed)` where `seed` is a hash of (cfg.seed, key, call index): the same episode key
gives the same fates for the same call sequence, in every process (the hash is blake2b, not Python's `hash`).

Per call, in this order (`draw`, pure):
- one uniform `u_fault`: below `failure_rate` -> the step raises `InjectedFault`; below `failure_rate +
  garbage_rate` -> it returns a malformed result (a `StepResult` with a NaN or None reward, or a plain dict); below
  `failure_rate + garbage_rate + hang_rate` -> it never returns. So each rate is exactly the share of steps with that
  fault (rates are clipped when they sum above 1, first come first served);
- one uniform `u_slow`: below `slowdown_rate` the latency is multiplied by `slowdown_factor`;
- latency: lognormal with mean `latency_mean_s` and standard deviation `latency_std_s` (`lognormal_params`);
  std 0 -> exactly the mean; mean 0 -> no wait (and no slow-down).
Faults apply to `step` only; latency applies to `reset` and `step` (a reset never raises, hangs or returns garbage by
injection). A faulted step does not reach the inner environment (its state does not advance).

Latency waits with `await asyncio.sleep`, so it never blocks other coroutines of the same loop. A hang blocks for
real when `blocking_hang` is true (a `time.sleep` loop: in a worker thread or process it holds that thread or
process, as a stuck native call would); with `blocking_hang` false it is `await asyncio.sleep(...)` forever (inline
mode, where blocking would freeze the caller's loop). A blocking hang ends early only when `release` (a
`threading.Event`) is set, so an executor can free its threads at shutdown; the step then raises `InjectedFault`.
"""

from __future__ import annotations

import asyncio
import hashlib
import math
import random
import threading
import time
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from asyncrl.envs.base import Environment, StepResult

Fault = Literal["fail", "garbage", "hang"]
GARBAGE_KINDS = ("nan_reward", "none_reward", "dict")
_HANG_TICK_S = 0.05
_ASYNC_HANG_S = 10.0 * 365 * 86400


class InjectedFault(RuntimeError):
    """An injected environment failure (`failure_rate`), or a blocking hang released at shutdown."""


def lognormal_params(mean: float, std: float) -> tuple[float, float]:
    """(mu, sigma) of the lognormal whose mean is `mean` and standard deviation is `std`.

    sigma^2 = ln(1 + std^2 / mean^2), mu = ln(mean) - sigma^2 / 2. Requires mean > 0 and std >= 0 (std 0 gives
    sigma 0: the distribution is the point `mean`).
    """
    if not mean > 0 or not math.isfinite(mean):
        raise ValueError(f"latency_mean_s: expected a finite value > 0, got {mean}")
    if not std >= 0 or not math.isfinite(std):
        raise ValueError(f"latency_std_s: expected a finite value >= 0, got {std}")
    var_log = math.log1p((std / mean) ** 2)
    return math.log(mean) - var_log / 2.0, math.sqrt(var_log)


def call_seed(seed: int, key: int, index: int) -> int:
    """The seed of call `index` of episode `key`: 64 bits of blake2b over the three integers (stable everywhere)."""
    digest = hashlib.blake2b(f"{seed}:{key}:{index}".encode(), digest_size=8).digest()
    return int.from_bytes(digest, "big")



class EnvInjectionConfig(BaseModel):
    """Faults and latency injected into every environment step (benchmarks and fault tests); the `env.injection`
    section of the run's config (`asyncrl.config.schema` uses this class)."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)

    latency_mean_s: float = Field(0.0, ge=0, le=3600, description="Mean injected latency of a step (lognormal).")
    latency_std_s: float = Field(0.0, ge=0, le=3600, description="Its standard deviation (0: every step waits the mean).")
    slowdown_rate: float = Field(0.0, ge=0, le=1, description="Share of steps slowed down by slowdown_factor.")
    slowdown_factor: float = Field(10.0, ge=1, le=1000)
    failure_rate: float = Field(0.0, ge=0, le=1, description="Share of steps that raise.")
    garbage_rate: float = Field(0.0, ge=0, le=1, description="Share of steps that return a malformed result.")
    hang_rate: float = Field(0.0, ge=0, le=1, description="Share of steps that never return (blocking the worker).")
    seed: int = 0

@dataclass(frozen=True)
class Draw:
    """The fate of one call: how long it waits first and which fault (if any) it then suffers."""

    latency_s: float
    fault: Fault | None
    garbage_kind: str


def draw(cfg: EnvInjectionConfig, key: int, index: int) -> Draw:
    """The fate of call `index` of episode `key` under `cfg` (pure; see the module docstring for the order)."""
    rng = random.Random(call_seed(cfg.seed, key, index))
    u_fault, u_slow = rng.random(), rng.random()
    garbage_kind = GARBAGE_KINDS[rng.randrange(len(GARBAGE_KINDS))]
    fault: Fault | None = None
    if u_fault < cfg.failure_rate:
        fault = "fail"
    elif u_fault < cfg.failure_rate + cfg.garbage_rate:
        fault = "garbage"
    elif u_fault < cfg.failure_rate + cfg.garbage_rate + cfg.hang_rate:
        fault = "hang"
    latency = 0.0
    if cfg.latency_mean_s > 0:
        mu, sigma = lognormal_params(cfg.latency_mean_s, cfg.latency_std_s)
        latency = cfg.latency_mean_s if sigma == 0 else math.exp(mu + sigma * rng.gauss(0.0, 1.0))
        if u_slow < cfg.slowdown_rate:
            latency *= cfg.slowdown_factor
    return Draw(latency, fault, garbage_kind)


def garbage(kind: str) -> Any:
    """A malformed step result of `kind` (one of GARBAGE_KINDS)."""
    if kind == "nan_reward":
        return StepResult("garbage", float("nan"), False, False, {})
    if kind == "none_reward":
        return StepResult("garbage", None, False, False, {})  # type: ignore[arg-type]
    return {"observation": "garbage", "reward": 0.0, "terminated": False, "truncated": False}


class InjectedEnvironment:
    """`inner` with injected latency and faults (see the module docstring); `calls` counts reset + step calls."""

    def __init__(self, inner: Environment, cfg: EnvInjectionConfig, key: int, blocking_hang: bool = False,
                 release: threading.Event | None = None) -> None:
        self.inner, self.cfg, self.key = inner, cfg, key
        self.blocking_hang, self.release = blocking_hang, release
        self.calls = 0

    def _next(self) -> Draw:
        d = draw(self.cfg, self.key, self.calls)
        self.calls += 1
        return d

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        d = self._next()
        if d.latency_s > 0:
            await asyncio.sleep(d.latency_s)
        return await self.inner.reset(seed)

    async def step(self, action_text: str) -> StepResult:
        d = self._next()
        if d.latency_s > 0:
            await asyncio.sleep(d.latency_s)
        if d.fault == "fail":
            raise InjectedFault(f"injected failure (key {self.key}, call {self.calls - 1})")
        if d.fault == "garbage":
            return garbage(d.garbage_kind)  # type: ignore[no-any-return]
        if d.fault == "hang":
            await self._hang()
        return await self.inner.step(action_text)

    async def _hang(self) -> None:
        if not self.blocking_hang:
            await asyncio.sleep(_ASYNC_HANG_S)
            return
        while self.release is None or not self.release.is_set():
            time.sleep(_HANG_TICK_S)
        raise InjectedFault(f"injected hang released at shutdown (key {self.key})")

    async def aclose(self) -> None:
        """Close the inner environment if it has an `aclose` (e.g. RemoteEnvironment)."""
        closer = getattr(self.inner, "aclose", None)
        if closer is not None:
            await closer()
