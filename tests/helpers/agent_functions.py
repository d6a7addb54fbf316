"""Agent functions the tests name by import path (env.agent): well-behaved ones and faulty ones."""

from __future__ import annotations

import asyncio
import itertools
import time
from typing import Any

_TRAIN_CALLS = itertools.count()


def returns_half(client: Any, task: dict[str, Any]) -> float:
    return 0.5


def returns_dict(client: Any, task: dict[str, Any]) -> dict[str, Any]:
    return {"reward": 1, "success": True, "turns": 2}


async def async_returns_seed(client: Any, task: dict[str, Any]) -> float:
    return float(task["seed"])


def raises(client: Any, task: dict[str, Any]) -> float:
    raise RuntimeError("the agent's own bug")


def sleeps(client: Any, task: dict[str, Any]) -> float:
    time.sleep(float(task["params"].get("sleep_s", 5.0)))
    return 1.0


async def async_hangs(client: Any, task: dict[str, Any]) -> float:
    await asyncio.sleep(3600)
    return 1.0


def returns_text(client: Any, task: dict[str, Any]) -> str:
    return "great"


def takes_one_argument(client: Any) -> float:
    return 1.0


class NotAFunction:
    pass


def frozenlake_via_openai(client: Any, task: dict[str, Any]) -> dict[str, Any]:
    """FrozenLake played through the episode endpoint with the official `openai` client, as a user would write it.

    On even seeds the conversation opens with a system message: the test's chat template then re-renders earlier
    replies differently, so each later request opens a new segment. Every episode's conversation is appended to
    `$ASYNCRL_TEST_AGENT_RECORD` (JSON lines: seed, system, replies and their token counts). With
    `$ASYNCRL_TEST_AGENT_FAULTS` = 1 episodes fail on purpose: in training the 4th call raises and the 6th returns
    without a model call; in the held-out evaluation level 3 sleeps `params["overrun_s"]` (past env.agent_timeout_s)
    before playing. (A training episode that overruns may be cancelled first, its group dropped as redundant.)
    """
    import json
    import os

    from asyncrl.envs.frozenlake import FrozenLake

    seed = int(task["seed"])
    params = dict(task["params"])
    overrun_s = float(params.pop("overrun_s", 0.0))
    faults = os.environ.get("ASYNCRL_TEST_AGENT_FAULTS") == "1"
    if faults and task["split"] == "eval" and seed == 3:
        time.sleep(overrun_s)
    if faults and task["split"] == "train":
        call = next(_TRAIN_CALLS)
        if call == 3:
            raise RuntimeError("injected agent failure")
        if call == 5:
            return {"reward": 0.0}  # never called the model
    env = FrozenLake(**params)
    observation, _ = asyncio.run(env.reset(seed))
    system = seed % 2 == 0
    messages: list[dict[str, str]] = [{"role": "system", "content": "lake"}] if system else []
    messages.append({"role": "user", "content": observation})
    replies, tokens, total, success = [], [], 0.0, False
    for _ in range(task["max_turns"]):
        r = client.chat.completions.create(model="policy", messages=messages)
        reply = r.choices[0].message.content or ""
        replies.append(reply)
        tokens.append(r.usage.completion_tokens if r.usage else -1)
        result = asyncio.run(env.step(reply))
        total += result.reward
        if result.done:
            success = bool(result.info.get("success", False))
            break
        messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": result.observation}]
    record = os.environ.get("ASYNCRL_TEST_AGENT_RECORD")
    if record:
        with open(record, "a") as f:
            f.write(json.dumps({"seed": seed, "split": task["split"], "system": system, "replies": replies,
                                "tokens": tokens}) + "\n")
    return {"reward": total, "success": success}
