"""Workload specs for the simulator: length, turn, latency and reward distributions, sampled deterministically.

A `Dist` is one scalar distribution ("fixed", "lognormal" by median and sigma clipped to [min, max], "uniform",
or "empirical": draws from a list). A `Workload` says what one sample (trajectory) looks like: a prompt, then
`turns` rounds of generate → environment step (agentic; the environment takes `env_latency_s` and appends
`observation_tokens`), then a reward (Bernoulli with `reward_p`, after `reward_latency_s`).

Determinism: the samples of prompt p come from one RNG seeded by (seed, p), drawn in sample order, so sample i
looks the same whatever order the simulator asks in, and sync and async runs of one seed see the very
same samples.
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Literal

__all__ = ["Dist", "SamplePlan", "Workload", "rlvr_workload", "agentic_workload"]

DistKind = Literal["fixed", "lognormal", "uniform", "empirical"]


@dataclass(frozen=True)
class Dist:
    """One scalar distribution. Invariant: every draw lies in [lo, hi] (lognormal and uniform are clipped)."""

    kind: DistKind = "fixed"
    value: float = 0.0  # fixed: the value; lognormal: the median
    sigma: float = 1.0  # lognormal: std of log(x)
    lo: float = 0.0
    hi: float = math.inf
    values: tuple[float, ...] = ()  # empirical

    def __post_init__(self) -> None:
        if self.kind not in ("fixed", "lognormal", "uniform", "empirical"):
            raise ValueError(f"kind: expected fixed|lognormal|uniform|empirical, got {self.kind!r}")
        if self.lo > self.hi:
            raise ValueError(f"lo ({self.lo}) must not exceed hi ({self.hi})")
        if self.kind == "lognormal" and (self.value <= 0 or self.sigma < 0):
            raise ValueError(f"lognormal: expected median > 0 and sigma >= 0, got {self.value}, {self.sigma}")
        if self.kind == "empirical" and not self.values:
            raise ValueError("empirical: expected a non-empty list of values")

    def draw(self, rng: random.Random) -> float:
        if self.kind == "fixed":
            x = self.value
        elif self.kind == "lognormal":
            x = self.value * math.exp(self.sigma * rng.gauss(0.0, 1.0))
        elif self.kind == "uniform":
            x = rng.uniform(self.lo, self.hi)
        else:
            x = self.values[rng.randrange(len(self.values))]
        return min(self.hi, max(self.lo, x))

    def draw_int(self, rng: random.Random) -> int:
        return max(int(self.lo), int(round(self.draw(rng))))


@dataclass(frozen=True)
class SamplePlan:
    """What one sample will do: tokens of each generation turn, environment latency and observation tokens
    after each turn, and its reward."""

    response_tokens: tuple[int, ...]
    env_latency_s: tuple[float, ...]
    observation_tokens: tuple[int, ...]
    reward: float


@dataclass(frozen=True)
class Workload:
    """The sample distribution of a simulated job. `agentic`: every turn ends with an environment step (the
    last one returns done); otherwise one generation then the reward."""

    response_tokens: Dist = field(default_factory=lambda: Dist("lognormal", 3000, 1.0, 1, 32768))
    prompt_tokens: Dist = field(default_factory=lambda: Dist("fixed", 512))
    turns: Dist = field(default_factory=lambda: Dist("fixed", 1, lo=1))
    env_latency_s: Dist = field(default_factory=lambda: Dist("fixed", 0.0))
    observation_tokens: Dist = field(default_factory=lambda: Dist("fixed", 0))
    reward_p: float = 0.5
    reward_latency_s: float = 0.0
    agentic: bool = False
    seed: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.reward_p <= 1.0:
            raise ValueError(f"reward_p: expected a probability in [0, 1], got {self.reward_p}")
        if self.reward_latency_s < 0:
            raise ValueError(f"reward_latency_s: expected >= 0, got {self.reward_latency_s}")
        if self.response_tokens.lo < 1:
            raise ValueError("response_tokens.lo: expected >= 1 (a response has at least one token)")

    @property
    def max_response_tokens(self) -> int:
        hi = self.response_tokens.hi
        if math.isinf(hi):
            return max(int(v) for v in self.response_tokens.values) if self.response_tokens.values else 1 << 20
        return int(hi)

    def _rng(self, prompt_index: int, sample_index: int, what: int) -> random.Random:
        return random.Random(((self.seed * (1 << 40) + prompt_index) * (1 << 20) + sample_index + 1) * 4 + what)

    def prompt_length(self, prompt_index: int) -> int:
        return max(1, self.prompt_tokens.draw_int(self._rng(prompt_index, -1, 0)))

    def plans(self, prompt_index: int, count: int) -> list[SamplePlan]:
        """Plans of samples 0..count-1 of one prompt (one RNG per prompt: sample i's plan depends on (seed,
        prompt_index, i) only, not on count)."""
        rng = self._rng(prompt_index, 0, 1)
        return [self._plan(rng) for _ in range(count)]

    def plan(self, prompt_index: int, sample_index: int) -> SamplePlan:
        return self.plans(prompt_index, sample_index + 1)[sample_index]

    def _plan(self, rng: random.Random) -> SamplePlan:
        if not self.agentic:
            resp = (max(1, self.response_tokens.draw_int(rng)),)
            return SamplePlan(resp, (0.0,), (0,), 1.0 if rng.random() < self.reward_p else 0.0)
        turns = max(1, self.turns.draw_int(rng))
        resp = tuple(max(1, self.response_tokens.draw_int(rng)) for _ in range(turns))
        lat = tuple(max(0.0, self.env_latency_s.draw(rng)) for _ in range(turns))
        obs = tuple(max(0, self.observation_tokens.draw_int(rng)) for _ in range(turns))
        reward = 1.0 if rng.random() < self.reward_p else 0.0
        return SamplePlan(resp, lat, obs, reward)


def rlvr_workload(median: float = 3000, sigma: float = 1.0, max_tokens: int = 32768, prompt: int = 512,
                  seed: int = 0) -> Workload:
    """RLVR-like: one long-tailed generation per sample (lognormal, median a few thousand tokens, tail to 32K)."""
    return Workload(response_tokens=Dist("lognormal", median, sigma, 1, max_tokens), prompt_tokens=Dist("fixed", prompt),
                    seed=seed)


def agentic_workload(turns: int = 5, median: float = 600, sigma: float = 0.8, max_tokens: int = 8192,
                     env_median_s: float = 2.0, seed: int = 0) -> Workload:
    """Agentic: several turns of generate → env.step (lognormal environment latency) with observations."""
    return Workload(response_tokens=Dist("lognormal", median, sigma, 1, max_tokens), prompt_tokens=Dist("fixed", 1024),
                    turns=Dist("fixed", turns, lo=1), env_latency_s=Dist("lognormal", env_median_s, 0.7, 0.05, 60.0),
                    observation_tokens=Dist("lognormal", 200, 0.5, 1, 2048), agentic=True, seed=seed)
