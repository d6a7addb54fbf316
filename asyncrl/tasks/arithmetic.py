"""The built-in verifiable task: integer arithmetic problems "a+b=", "a-b=", "a*b=".

Owns the problem universe, the deterministic train/eval splits and the prompt/answer format.

Invariants:
- a problem is a triple (a, op, b) with 0 <= a, b <= task.max_operand and op in task.operations;
  its prompt is f"{a}{op}{b}=" (no spaces, no sign: operands are never negative) and its answer is
  str(a op b) (negative for some '-' problems, e.g. "-7");
- the splits depend only on the TaskConfig (seed, max_operand, operations, num_eval, num_train), never
  on global random state; the eval split depends only on (seed, max_operand, operations, num_eval),
  so changing num_train never changes the eval problems;
- eval and train are disjoint as sets of (a, op, b) and each holds no duplicate;
- the train split holds min(num_train, universe - num_eval) problems: asking for more than exist
  outside eval gives all of them (with a warning).
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass
from typing import Literal

from asyncrl.config.schema import TaskConfig

log = logging.getLogger(__name__)

Split = Literal["train", "eval"]


@dataclass(frozen=True)
class Problem:
    """One problem: its index within its split, the prompt text and the exact expected answer."""

    index: int
    prompt: str
    answer: str


def universe_size(task: TaskConfig) -> int:
    """Number of distinct (a, op, b) triples the task can produce."""
    side = task.max_operand + 1
    return side * side * len(task.operations)


def _decode(task: TaskConfig, code: int) -> tuple[int, str, int]:
    """Map an integer in [0, universe_size) to its triple (a, op, b); a bijection."""
    side = task.max_operand + 1
    op_index, rest = divmod(code, side * side)
    a, b = divmod(rest, side)
    return a, task.operations[op_index], b


def solve(a: int, op: str, b: int) -> int:
    """The exact integer result of `a op b`."""
    if op == "+":
        return a + b
    if op == "-":
        return a - b
    if op == "*":
        return a * b
    raise ValueError(f"task.operations: expected one of '+', '-', '*', got {op!r}")


def make_problem(index: int, a: int, op: str, b: int) -> Problem:
    """The problem for one triple, in the task's prompt/answer format."""
    return Problem(index=index, prompt=f"{a}{op}{b}=", answer=str(solve(a, op, b)))


def _eval_codes(task: TaskConfig) -> list[int]:
    total = universe_size(task)
    if task.num_eval >= total:
        raise ValueError(
            f"task.num_eval: expected fewer than the {total} distinct problems of max_operand={task.max_operand} "
            f"and operations={task.operations} (some must be left for training), got {task.num_eval}"
        )
    return random.Random(f"asyncrl-arithmetic-eval-{task.seed}").sample(range(total), task.num_eval)


def _train_codes(task: TaskConfig, eval_codes: list[int]) -> list[int]:
    total = universe_size(task)
    available = total - len(eval_codes)
    n = task.num_train
    if n > available:
        log.warning(
            "task.num_train=%d exceeds the %d problems outside the eval split; training on all %d",
            n,
            available,
            available,
        )
        n = available
    held_out = set(eval_codes)
    # A sample of n + |eval| distinct codes holds at least n codes outside eval.
    drawn = random.Random(f"asyncrl-arithmetic-train-{task.seed}").sample(
        range(total), min(total, n + len(held_out))
    )
    return [c for c in drawn if c not in held_out][:n]


def load_split(task: TaskConfig, split: Split) -> list[Problem]:
    """The problems of one split ("train" or "eval"), deterministic from the TaskConfig."""
    if task.name != "arithmetic":
        raise ValueError(f"task.name: expected 'arithmetic', got {task.name!r}")
    eval_codes = _eval_codes(task)
    if split == "eval":
        codes = eval_codes
    elif split == "train":
        codes = _train_codes(task, eval_codes)
    else:
        raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
    return [make_problem(i, *_decode(task, c)) for i, c in enumerate(codes)]
