"""A user's agent function (asyncrl.agents.agent_function): found by path with clear errors, its result read as a
reward, and each way it can fail (raising, hanging, a result that is not a reward) a fault of its own kind."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.agents.agent_function import AgentFault, AgentResult, call_agent, read_result, resolve_agent

H = "tests.helpers.agent_functions"


def run(name: str, timeout_s: float = 5.0, params: dict | None = None) -> AgentResult:
    task = {"seed": 7, "split": "train", "params": params or {}, "max_turns": 2, "system_prompt": ""}
    return asyncio.run(call_agent(resolve_agent(f"{H}:{name}"), None, task, timeout_s))


def test_results_are_read_as_rewards() -> None:
    assert run("returns_half") == AgentResult(0.5)
    assert run("returns_dict") == AgentResult(1.0, True, {"turns": 2})
    assert run("async_returns_seed") == AgentResult(7.0)


@pytest.mark.parametrize("path,message", [
    (f"{H}:missing", "has no attribute 'missing'"),
    (f"{H}:NotAFunction", "expected a function .* got a class"),
    (f"{H}:takes_one_argument", r"expected a function taking \(client, task\)"),
    ("no_such_module_xyz:f", "cannot import module 'no_such_module_xyz'"),
    ("not a path", "expected an import path 'package.module:function'"),
])
def test_a_bad_agent_path_names_itself(path: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        resolve_agent(path)


@pytest.mark.parametrize("name,kind,message", [
    ("raises", "raised", "agent raised RuntimeError: the agent's own bug"),
    ("returns_text", "result", "expected a finite number or"),
    ("async_hangs", "timeout", "no result within env.agent_timeout_s = 0.3 s"),
    ("sleeps", "timeout", "no result within env.agent_timeout_s = 0.3 s"),
])
def test_each_failure_is_a_fault_of_its_kind(name: str, kind: str, message: str) -> None:
    with pytest.raises(AgentFault, match=message) as e:
        run(name, timeout_s=0.3, params={"sleep_s": 1.0})
    assert e.value.kind == kind


def test_a_non_finite_or_boolean_reward_is_refused() -> None:
    for value in (float("nan"), True, {"reward": "1"}, {"reward": 1.0, "success": "yes"}):
        with pytest.raises(AgentFault):
            read_result(value)
