"""A user's reward function for the single-turn tasks, chosen by `task.reward: "package.module:function"`.

The contract (docs/extending.md, "Your own reward function"): `function(prompt: str, response: str, answer: str)
-> float`, where `response` is the decoded response up to the first end-of-sequence marker (not stripped) and
`answer` is the row's reference answer. It must be pure and fast (it runs in the reward role's thread pool, one call
per sample) and return a finite number (a bool is refused: say 1.0 or 0.0). `load_reward_fn` checks, without calling
it, that the path names a plain function (or another callable that is not a class); `make_scorer` wraps it into the
verifier's `score` signature. A function that raises or returns something else is a bug of the function: the call
raises `RewardFunctionError` naming the path, and the reward role answers that item as failed (never a default
reward).

`scorer_for(task)` is the one place that picks how a run scores (the reward role, which scores every rollout sample
for the environment role, and the held-out evaluation): the user's function when `task.reward` is set, else the
built-in verifier `task.resolved_verifier()` names: exact match (`asyncrl.rewards.verifier`) or the math verifier
(`asyncrl.rewards.math_verifier`, with `task.format_reward`). The scorer it returns refuses (ValueError) an item of
another task than the run's `task.name`; the verifiers themselves never look at the task name. `is_correct` says
whether a scored sample counts as correct (its details' "correct", else reward >= 1).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any, Protocol

from asyncrl.plugins import import_object
from asyncrl.rewards.math_verifier import score_math
from asyncrl.rewards.verifier import EOS_TEXT, score

RewardFn = Callable[[str, str, str], float]
Scorer = Callable[[str, str, str, str], tuple[float, dict[str, Any]]]
"""(task, prompt, response, answer) -> (reward, details), the shape the reward role and the evaluation call."""


class RewardFunctionError(RuntimeError):
    """The user's reward function raised or returned something other than a finite number."""


def load_reward_fn(path: str) -> RewardFn:
    """The function `path` names; ValueError naming `task.reward` and the problem otherwise."""
    fn = import_object(path, "task.reward")
    if inspect.isclass(fn) or not callable(fn):
        raise ValueError(f"task.reward {path!r}: expected a function (prompt, response, answer) -> float, got a "
                         f"{'class' if inspect.isclass(fn) else type(fn).__name__}")
    if inspect.iscoroutinefunction(fn):
        raise ValueError(f"task.reward {path!r}: expected a plain function, got `async def` (it runs in a thread)")
    try:
        inspect.signature(fn).bind("prompt", "response", "answer")
    except (TypeError, ValueError) as e:
        raise ValueError(f"task.reward {path!r}: expected a function of (prompt, response, answer): {e}") from None
    return fn


def make_scorer(path: str) -> Scorer:
    """The scorer of `task.reward`: the user's function on the response cut at the first EOS marker."""
    fn = load_reward_fn(path)

    def scorer(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        text = response.split(EOS_TEXT, 1)[0]
        try:
            value = fn(prompt, text, answer)
        except Exception as e:
            raise RewardFunctionError(f"task.reward {path!r} raised {type(e).__name__}: {e}") from e
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            raise RewardFunctionError(f"task.reward {path!r}: expected a finite number, got {value!r}")
        return float(value), {"reward_fn": path, "correct": value >= 1.0}

    return scorer


class TaskSpec(Protocol):
    """What `scorer_for` reads of the run's task (`asyncrl.config.TaskConfig`)."""

    name: str
    reward: str
    format_reward: float

    def resolved_verifier(self) -> str: ...


def exact_scorer(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
    """The built-in exact-match verifier in the scorer's shape."""
    return score(task, response, answer)


def math_scorer(format_weight: float = 0.0) -> Scorer:
    """The math verifier in the scorer's shape, with the format component weighted `format_weight`."""

    def scorer(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        return score_math(response, answer, format_weight)

    return scorer


def for_task(names: tuple[str, ...], scorer: Scorer) -> Scorer:
    """`scorer`, refusing (ValueError) an item whose task is not one of `names` (a run: its task.name)."""
    expected = f"{names[0]!r} (this run's task.name)" if len(names) == 1 else f"one of {list(names)}"

    def checked(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        if task not in names:
            raise ValueError(f"expected {expected}, got {task!r}")
        return scorer(task, prompt, response, answer)

    return checked


def scorer_for(task: TaskSpec) -> Scorer:
    """How the run scores (module docstring): `task.reward`'s function, else the verifier `task.resolved_verifier()`
    names; items of another task than `task.name` refused."""
    if task.reward:
        return for_task((task.name,), make_scorer(task.reward))
    verifier = task.resolved_verifier()
    if verifier == "math":
        return for_task((task.name,), math_scorer(task.format_reward))
    if verifier == "exact":
        return for_task((task.name,), exact_scorer)
    raise ValueError(f"task.verifier: expected exact or math, got {verifier!r}")


def is_correct(reward: float, details: dict[str, Any]) -> bool:
    """Whether a scored sample is correct: `details["correct"]` when the details say it (a bool), else reward >= 1
    (so a format bonus never makes a wrong answer count)."""
    said = details.get("correct")
    return said if isinstance(said, bool) else reward >= 1.0


builtin_scorer: Scorer = for_task(("arithmetic", "jsonl"), exact_scorer)
"""The scorer of a reward app built without a run's config (tests, benchmarks): exact match of the tasks whose
`task.verifier: auto` is exact (arithmetic, jsonl); other tasks refused."""
