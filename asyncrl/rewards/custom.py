"""A user's reward function for the single-turn tasks, chosen by `task.reward: "package.module:function"`.

The contract (docs/extending.md, "Your own reward function"): `function(prompt: str, response: str, answer: str)
-> float`, where `response` is the decoded response up to the first end-of-sequence marker (not stripped) and
`answer` is the row's reference answer. It must be pure and fast (it runs in the reward role's thread pool, one call
per sample) and return a finite number (a bool is refused: say 1.0 or 0.0). `load_reward_fn` checks, without calling
it, that the path names a plain function (or another callable that is not a class); `make_scorer` wraps it into the
verifier's `score` signature. A function that raises or returns something else is a bug of the function: the call
raises `RewardFunctionError` naming the path, and the reward role answers that item as failed (never a default
reward).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable
from typing import Any

from asyncrl.plugins import import_object
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


def builtin_scorer(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
    """The built-in exact-match verifier in the scorer's shape."""
    return score(task, response, answer)


def scorer_for(reward_path: str) -> Scorer:
    """`task.reward`'s scorer, or the built-in verifier when it is empty."""
    return make_scorer(reward_path) if reward_path else builtin_scorer
