"""The environment protocol of agentic tasks, and the registry that creates environments by name.

An environment speaks text at its boundary: `reset(seed)` returns the first observation, `step(action_text)`
takes the model's raw reply and returns the next observation, the reward of that step, and whether the episode
ended (`terminated`: the task is over, won or lost) or was cut (`truncated`: the step limit). Both are `async` so
that slow environments (remote, sandboxed, with latency) never block the event loop that drives generation; an
in-process environment simply returns at once.

Invariants:
- `reset` must be called before `step`; a `step` after the episode ended raises `EpisodeOver`;
- the same seed gives the same episode for the same actions (deterministic given seed and actions);
- `info` holds only JSON-serialisable values; `info["success"]` (bool) is set on the last step of an episode.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol


class EpisodeOver(RuntimeError):
    """`step` was called on an episode that has already ended (or was never reset)."""


@dataclass
class StepResult:
    observation: str
    reward: float
    terminated: bool
    truncated: bool
    info: dict[str, Any] = field(default_factory=dict)

    @property
    def done(self) -> bool:
        return self.terminated or self.truncated


class Environment(Protocol):
    """What the environment role drives; see the module docstring for the contract."""

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]: ...

    async def step(self, action_text: str) -> StepResult: ...


_REGISTRY: dict[str, Callable[..., Environment]] = {}


def register(name: str) -> Callable[[Callable[..., Environment]], Callable[..., Environment]]:
    """Class decorator: make an environment constructible by `make(name, **params)`."""

    def deco(factory: Callable[..., Environment]) -> Callable[..., Environment]:
        if name in _REGISTRY and _REGISTRY[name] is not factory:
            raise ValueError(f"environment {name!r} is already registered")
        _REGISTRY[name] = factory
        return factory

    return deco


def registered() -> list[str]:
    return sorted(_REGISTRY)


def make(name: str, **params: Any) -> Environment:
    """A new environment `name` with `params`; errors name the unknown environment or parameter."""
    if name not in _REGISTRY:
        raise ValueError(f"environment: unknown name {name!r}; registered: {registered()}")
    try:
        return _REGISTRY[name](**params)
    except TypeError as e:
        raise ValueError(f"environment {name!r}: bad parameters {sorted(params)}: {e}") from e
