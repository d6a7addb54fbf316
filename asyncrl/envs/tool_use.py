"""Tool use: solve arithmetic word problems with a calculator or a small Python sandbox, over several turns.

Each episode is one word problem drawn from the seed (a few templates, operands within `max_operand`). Each reply
may call one tool or answer:
- `<calculator>3 * (4 + 5)</calculator>`: evaluated by `calculate` (numbers, + − × ÷ // % **, parentheses; an
  AST walk, never `eval`); the next observation is `Result: <value>` or `Error: <why>`;
- `<python>print(3 * 9)</python>` (when `allow_python`): run in a new `asyncrl.sandbox` (its own namespaces, no
  network, a seccomp filter, a small private folder, time, memory and output limits); the observation is its
  output (or its error), truncated. With `sandbox_url` set, the program runs in the sandbox service at that URL
  (`asyncrl.sandbox.server`, on a cluster the sandbox pool) instead, and this process needs no user namespaces;
- `<answer>27</answer>`: ends the episode; reward 1 if the number equals the answer, else 0.
A reply with none of these costs `format_penalty` and a turn; `max_turns` turns without an answer truncate the
episode. The last tag of a reply wins when it holds several.
"""

from __future__ import annotations

import ast
import asyncio
import operator
import random
import re
import weakref
from typing import Any

from asyncrl.envs.base import EpisodeOver, StepResult, register
from asyncrl.sandbox.client import RemoteSandbox, check_sandbox_url
from asyncrl.sandbox.host import sandbox_host
from asyncrl.sandbox.runner import SandboxResult, run_python

_TAG_RE = re.compile(r"<(calculator|python|answer)>(.*?)</\1>", re.IGNORECASE | re.DOTALL)
_BINOPS = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}
TEMPLATES = [
    ("{name} has {a} apples and buys {b} bags of {c} apples each. How many apples does {name} have now?",
     lambda a, b, c: a + b * c),
    ("A train carries {a} passengers. At the first stop {b} get off and {c} get on. How many are on the train?",
     lambda a, b, c: a - b + c),
    ("{name} reads {a} pages a day for {b} days, then {c} more pages. How many pages in total?",
     lambda a, b, c: a * b + c),
    ("{a} cookies are shared equally by {b} children, and each child then eats {c}. How many cookies does each "
     "child have left? (The cookies divide evenly.)", lambda a, b, c: a // b - c),
]
NAMES = ["Ann", "Bo", "Chen", "Dara", "Eli", "Fay"]


def calculate(expression: str, max_exponent: int = 64, max_chars: int = 200) -> float | int:
    """The value of an arithmetic expression; ValueError naming what is not allowed."""
    if len(expression) > max_chars:
        raise ValueError(f"expression longer than {max_chars} characters")
    try:
        tree = ast.parse(expression.strip(), mode="eval")
    except SyntaxError as e:
        raise ValueError(f"not an arithmetic expression: {e.msg}") from e

    def walk(node: ast.AST) -> float | int:
        if isinstance(node, ast.Expression):
            return walk(node.body)
        if isinstance(node, ast.Constant) and type(node.value) in (int, float):
            return node.value
        if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
            return _UNARY[type(node.op)](walk(node.operand))
        if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
            left, right = walk(node.left), walk(node.right)
            if isinstance(node.op, ast.Pow) and abs(right) > max_exponent:
                raise ValueError(f"exponent {right} is larger than {max_exponent}")
            try:
                return _BINOPS[type(node.op)](left, right)
            except ZeroDivisionError as e:
                raise ValueError("division by zero") from e
        raise ValueError(f"{type(node).__name__} is not allowed (numbers and + - * / // % ** only)")

    return walk(tree)


def make_problem(seed: int, max_operand: int = 20) -> tuple[str, int]:
    """(question, integer answer) of the seed."""
    rng = random.Random(seed)
    template, answer = TEMPLATES[rng.randrange(len(TEMPLATES))]
    b = rng.randint(2, max_operand)
    c = rng.randint(1, max_operand)
    if template.startswith("{a} cookies"):
        a = b * rng.randint(c, c + max_operand)  # divisible, and each child has at least c
    elif template.startswith("A train"):
        a = rng.randint(b, b + max_operand)  # never fewer passengers than get off
    else:
        a = rng.randint(1, max_operand)
    return template.format(name=rng.choice(NAMES), a=a, b=b, c=c), int(answer(a, b, c))


def _number(text: str) -> float | None:
    m = re.search(r"-?\d+(?:\.\d+)?", text.replace(",", ""))
    return float(m.group()) if m else None


@register("tool_use")
class ToolUse:
    """A word problem per `reset(seed)`; see the module docstring."""

    def __init__(self, max_operand: int = 20, max_turns: int = 4, allow_python: bool = True,
                 python_timeout_s: float = 5.0, format_penalty: float = -0.1, sandbox_url: str | None = None) -> None:
        if max_turns < 1:
            raise ValueError(f"max_turns: expected >= 1, got {max_turns}")
        if max_operand < 2:
            raise ValueError(f"max_operand: expected >= 2, got {max_operand}")
        self.max_operand, self.max_turns, self.allow_python = max_operand, max_turns, allow_python
        self.python_timeout_s, self.format_penalty = python_timeout_s, format_penalty
        self.sandbox_url = sandbox_url if sandbox_url is None else check_sandbox_url(sandbox_url)
        if allow_python and not sandbox_url:
            sandbox_host()  # refuse to start (SandboxUnavailable, saying what is missing) where tools cannot be isolated
        self.answer: int | None = None
        self.turns = 0
        self.done = True

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        question, self.answer = make_problem(seed, self.max_operand)
        self.turns, self.done = 0, False
        tools = "<calculator>expression</calculator>" + (" or <python>code</python>" if self.allow_python else "")
        return (f"{question}\nUse {tools} to compute, then reply <answer>number</answer>. "
                f"Turns left: {self.max_turns}."), {"answer": self.answer}

    async def step(self, action_text: str) -> StepResult:
        if self.done:
            raise EpisodeOver("tool_use: step after the episode ended (call reset first)")
        self.turns += 1
        tags = _TAG_RE.findall(action_text)
        info: dict[str, Any] = {"tool": None, "invalid_action": not tags}
        reward, terminated, observation = 0.0, False, ""
        if not tags or (tags[-1][0].lower() == "python" and not self.allow_python):
            reward, info["invalid_action"] = self.format_penalty, True
            observation = "No tool call or answer found."
        else:
            kind, body = tags[-1][0].lower(), tags[-1][1]
            info["tool"] = kind
            if kind == "answer":
                given = _number(body)
                terminated = True
                reward = 1.0 if given is not None and given == self.answer else 0.0
                info["success"] = reward == 1.0
                observation = "Correct." if info["success"] else "Wrong."
            elif kind == "calculator":
                try:
                    observation = f"Result: {calculate(body)}"
                except ValueError as e:
                    observation = f"Error: {e}"
            else:
                r = await self._run_python(body)
                observation = (r.stdout or "(no output)") if r.ok else (
                    "Error: time limit exceeded" if r.timed_out else "Error: output limit exceeded" if r.overflow
                    else f"Error: {r.stderr.strip().splitlines()[-1:]}")
        truncated = not terminated and self.turns >= self.max_turns
        if truncated:
            info["success"] = False
        self.done = terminated or truncated
        return StepResult(f"{observation}\nTurns left: {self.max_turns - self.turns}.", reward, terminated,
                          truncated, info)

    async def _run_python(self, code: str) -> SandboxResult:
        if self.sandbox_url:
            return await _remote_sandbox(self.sandbox_url).run(code, timeout_s=self.python_timeout_s)
        return await run_python(code, timeout_s=self.python_timeout_s)


_REMOTES: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, dict[str, RemoteSandbox]] = weakref.WeakKeyDictionary()


def _remote_sandbox(url: str) -> RemoteSandbox:
    """One client (and its kept-alive connections) per sandbox URL and event loop, shared by every episode on that
    loop (the "threads" executor runs one loop per worker thread; a client belongs to one loop)."""
    per_loop = _REMOTES.setdefault(asyncio.get_running_loop(), {})
    if url not in per_loop:
        per_loop[url] = RemoteSandbox(url)
    return per_loop[url]
