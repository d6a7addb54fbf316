"""A user's agent function: found by import path, called once per episode, its result read as a reward.

`env.agent: "package.module:function"` names `function(client, task)`. It is called with
- `client`: an `openai.OpenAI` (or, for an `async def` function, `openai.AsyncOpenAI`) whose base URL is the
  episode's own endpoint (`asyncrl.agents.endpoint`): every model call it makes is a turn of this episode;
- `task`: a dict `{"seed": int, "split": "train" | "eval", "params": env.params, "max_turns": env.max_turns,
  "system_prompt": env.system_prompt}`: what to play (the agent derives its problem from the seed);
and returns the episode's reward: a number, or a dict with a number under `"reward"` and optionally a bool under
`"success"` (other JSON values are kept as the episode's info).

Where it runs: an `async def` function on the role's event loop, cancelled at `env.agent_timeout_s`; a plain
function in a worker thread. A thread cannot be killed: past its deadline the episode fails at once and its URL is
closed, so the agent's next model call raises and the thread ends there; an agent that hangs without calling the
model keeps its thread until it returns (give blocking tools their own deadlines). The sample kind gives plain
functions a pool of `env.agent_threads` threads: episodes beyond that wait for a thread.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import math
from collections.abc import Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Any

from asyncrl.plugins import import_object

FORM = "an import path 'package.module:function'"


class AgentFault(RuntimeError):
    """The agent raised, returned something that is not a reward, never called the model, or ran out of time:
    `kind` names which (counted per kind in the run's metrics)."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class AgentResult:
    reward: float
    success: bool | None = None
    info: dict[str, Any] = field(default_factory=dict)


def resolve_agent(path: str) -> Callable[..., Any]:
    """The function `path` names (imported now); ValueError naming the path otherwise."""
    target = import_object(path, "agent", FORM)
    if inspect.isclass(target) or not callable(target):
        raise ValueError(f"agent {path!r}: expected a function (client, task) -> reward, got "
                         f"{'a class' if inspect.isclass(target) else type(target).__name__}")
    try:
        inspect.signature(target).bind(None, None)
    except TypeError as e:
        raise ValueError(f"agent {path!r}: expected a function taking (client, task): {e}") from e
    except ValueError:  # a builtin without a signature: called as is
        pass
    return target


def agent_task(env: Any, seed: int, split: str) -> dict[str, Any]:
    """The `task` argument of one episode of `env` (the run's `EnvConfig`)."""
    return {"seed": seed, "split": split, "params": dict(env.params), "max_turns": env.max_turns,
            "system_prompt": env.system_prompt}


def read_result(value: Any) -> AgentResult:
    """The agent's return value as a reward; AgentFault("result") when it is not one."""
    info: dict[str, Any] = {}
    success = None
    if isinstance(value, dict):
        info = {k: v for k, v in value.items() if k not in ("reward", "success")}
        success = value.get("success")
        if success is not None and not isinstance(success, bool):
            raise AgentFault("result", f"agent result: 'success' must be a bool, got {type(success).__name__}")
        value = value.get("reward")
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(float(value)):
        raise AgentFault("result", f"agent result: expected a finite number or {{'reward': number, ...}}, got "
                                   f"{value!r}"[:300])
    return AgentResult(float(value), success, info)


def make_client(function: Callable[..., Any], base_url: str, timeout_s: float) -> Any:
    """The OpenAI client the agent gets: async for an `async def` function. No retries: a failed turn is the
    episode's, and the endpoint answers every request once."""
    import openai

    cls = openai.AsyncOpenAI if inspect.iscoroutinefunction(function) else openai.OpenAI
    return cls(base_url=base_url, api_key="episode", max_retries=0, timeout=timeout_s)


async def call_agent(function: Callable[..., Any], client: Any, task: dict[str, Any], timeout_s: float,
                     threads: Executor | None = None) -> AgentResult:
    """Run the agent once with its deadline (see the module docstring); AgentFault when it fails. A plain function
    runs in `threads` (the loop's default executor, a handful of threads, when None)."""
    try:
        if inspect.iscoroutinefunction(function):
            value = await asyncio.wait_for(function(client, task), timeout_s)
        else:
            call = asyncio.get_running_loop().run_in_executor(threads, functools.partial(function, client, task))
            value = await asyncio.wait_for(call, timeout_s)
    except TimeoutError as e:
        raise AgentFault("timeout", f"agent: no result within env.agent_timeout_s = {timeout_s:g} s") from e
    except asyncio.CancelledError:
        raise
    except Exception as e:  # noqa: BLE001 - whatever the user's code raises ends its episode, recorded
        raise AgentFault("raised", f"agent raised {type(e).__name__}: {e}"[:500]) from e
    return read_result(value)
