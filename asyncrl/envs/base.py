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

Names: `make(name)` takes a registered name (`register`) or an import path `"package.module:ClassName"` of a user's
environment class, imported on first use in every process that makes one (config check, environment role, worker
processes, the remote server). An import path that cannot be imported, names nothing, or names anything but a class
with `async def reset` and `async def step` is a ValueError naming the path (`NotAnEnvironment` for the last),
raised before anything is called: a config can name only environment classes, never run an arbitrary callable.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from asyncrl.plugins import import_object, is_import_path


class EpisodeOver(RuntimeError):
    """`step` was called on an episode that has already ended (or was never reset)."""


class NotAnEnvironment(ValueError):
    """An import path named a factory whose product is not an environment (no async `reset` and `step`)."""


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




def resolve(name: str) -> Callable[..., Environment]:
    """The factory `name` stands for: a registered one, or the class an import path names (imported now).

    Errors (ValueError) name `name` and say what is wrong: unknown registered name, malformed import path, a module
    that cannot be imported (or raised while importing), a missing attribute, or (`NotAnEnvironment`) an attribute
    that is not a class with `async def reset` and `async def step`. Nothing the path names is called here.
    """
    if not is_import_path(name):
        if name not in _REGISTRY:
            raise ValueError(f"environment: unknown name {name!r}; registered: {registered()}")
        return _REGISTRY[name]
    target = import_object(name, "environment", "a registered name or an import path 'package.module:ClassName'")
    if not inspect.isclass(target):
        raise NotAnEnvironment(f"environment {name!r}: expected a class, got a {type(target).__name__}")
    for method in ("reset", "step"):
        if not inspect.iscoroutinefunction(getattr(target, method, None)):
            raise NotAnEnvironment(f"environment {name!r}: {target.__name__} is not an environment: expected "
                                   f"`async def {method}` (reset(seed) -> (observation, info), "
                                   f"step(action_text) -> StepResult)")
    return target


def make(name: str, **params: Any) -> Environment:
    """A new environment `name` (registered name or import path) with `params`; errors name the unknown
    environment, the import problem or the bad parameters."""
    factory = resolve(name)
    try:
        return factory(**params)
    except TypeError as e:
        raise ValueError(f"environment {name!r}: bad parameters {sorted(params)}: {e}") from e
