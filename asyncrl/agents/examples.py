"""Example agents, written as a user would write them: plain functions with the official `openai` client.

`calculator_agent` (configs/agent_calculator.yaml): sums of `terms` whole numbers in [0, max_value], drawn from the
seed. The conversation opens with one worked exchange (`DEMO`, unless `params["demo"]` is false); the model may call a
calculator by writing `<calculator>EXPRESSION</calculator>` (evaluated by the tool-use
environment's `calculate`, never `eval`), gets `Result: <value>` back as the next user message, and ends with
"The answer is N" (without that phrase, the reply's last number counts). Reward 1 when the answer is the sum, else 0.
A reply without a calculator call ends the episode; so does running out of turns (reward 0).
"""

from __future__ import annotations

import random
import re
from typing import Any

from asyncrl.envs.tool_use import calculate

SYSTEM = ("Solve the problem. You may use a calculator: write <calculator>EXPRESSION</calculator> and wait for its "
          "result. End with: The answer is N.")
DEMO = [  # one worked exchange as chat turns: without it SmolLM2-135M never writes the tag (docs/results.md)
    {"role": "user", "content": "Calculate 12 + 30."},
    {"role": "assistant", "content": "<calculator>12 + 30</calculator>"},
    {"role": "user", "content": "Result: 42"},
    {"role": "assistant", "content": "The answer is 42."},
]
_CALL = re.compile(r"<calculator>(.*?)</calculator>", re.DOTALL)
_ANSWER = re.compile(r"answer is\s*\**\s*(-?\d[\d,]*)", re.IGNORECASE)
_NUMBER = re.compile(r"-?\d+")


def sum_problem(seed: int, terms: int = 2, max_value: int = 99) -> tuple[str, int]:
    """The problem text of `seed` and its answer."""
    rng = random.Random(seed)
    numbers = [rng.randint(0, max_value) for _ in range(terms)]
    return f"Calculate {' + '.join(map(str, numbers))}.", sum(numbers)


def final_answer(reply: str) -> int | None:
    """The N of the last "The answer is N" in `reply`; without one, the last whole number outside calculator calls
    (as the real job's verifier reads a chain of thought); None when there is none."""
    found = _ANSWER.findall(reply) or _NUMBER.findall(_CALL.sub(" ", reply))
    return int(found[-1].replace(",", "")) if found else None


def calculator_agent(client: Any, task: dict[str, Any]) -> dict[str, Any]:
    params = task["params"]
    problem, answer = sum_problem(task["seed"], int(params.get("terms", 2)), int(params.get("max_value", 99)))
    demo = DEMO if params.get("demo", True) else []
    messages = [{"role": "system", "content": task.get("system_prompt") or SYSTEM}, *demo,
                {"role": "user", "content": problem}]
    calls = 0
    for _ in range(task["max_turns"]):
        reply = client.chat.completions.create(model="policy", messages=messages).choices[0].message.content or ""
        call = _CALL.search(reply)
        given = final_answer(reply) if call is None or _ANSWER.search(reply) else None
        if call is None or given is not None:
            correct = given == answer
            return {"reward": float(correct), "success": correct, "calculator_calls": calls}
        calls += 1
        try:
            result = f"Result: {calculate(call.group(1))}"
        except ValueError as err:
            result = f"Error: {err}"
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": result}]
    return {"reward": 0.0, "success": False, "calculator_calls": calls}
