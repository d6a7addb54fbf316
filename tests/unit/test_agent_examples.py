"""The example calculator agent's own logic (asyncrl/agents/examples.py): problems from seeds, answers read from
replies, the calculator's result fed back. The client here replays scripted replies: the agent's decisions are
what is tested (the endpoint and the model behind it are tested by the embedded agent run)."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from asyncrl.agents.examples import DEMO, SYSTEM, calculator_agent, final_answer, sum_problem


class ScriptedClient:
    def __init__(self, replies: list[str]) -> None:
        self.replies, self.seen = list(replies), []
        self.chat = SimpleNamespace(completions=SimpleNamespace(create=self._create))

    def _create(self, model: str, messages: list[dict[str, Any]]) -> Any:
        self.seen.append([dict(m) for m in messages])
        content = self.replies.pop(0)
        return SimpleNamespace(choices=[SimpleNamespace(message=SimpleNamespace(content=content))])


def task(seed: int = 5, max_turns: int = 3, demo: bool = True) -> dict[str, Any]:
    return {"seed": seed, "split": "train", "params": {"terms": 2, "max_value": 99, "demo": demo},
            "max_turns": max_turns, "system_prompt": ""}


def test_problems_come_from_the_seed() -> None:
    assert sum_problem(5) == sum_problem(5)
    text, answer = sum_problem(5)
    a, b = (int(x) for x in text.removeprefix("Calculate ").removesuffix(".").split(" + "))
    assert answer == a + b and 0 <= a <= 99 and 0 <= b <= 99


def test_the_answer_is_read_from_the_phrase_else_the_last_number() -> None:
    assert final_answer("3 + 4 = 7. The answer is 7.") == 7
    assert final_answer("The answer is 1,024") == 1024
    assert final_answer("3 + 4 equals 7.") == 7
    assert final_answer("<calculator>3+4</calculator>") is None
    assert final_answer("no number") is None


def test_a_calculator_call_gets_its_result_and_a_right_answer_scores_one() -> None:
    text, answer = sum_problem(5)
    expr = text.removeprefix("Calculate ").removesuffix(".")
    client = ScriptedClient([f"<calculator>{expr}</calculator>", f"The answer is {answer}."])
    assert calculator_agent(client, task()) == {"reward": 1.0, "success": True, "calculator_calls": 1}
    first, second = client.seen
    assert first == [{"role": "system", "content": SYSTEM}, *DEMO, {"role": "user", "content": text}]
    assert second[6:] == [{"role": "assistant", "content": f"<calculator>{expr}</calculator>"},
                          {"role": "user", "content": f"Result: {answer}"}]


def test_a_wrong_answer_a_bad_expression_and_running_out_of_turns_score_zero() -> None:
    _, answer = sum_problem(5)
    assert calculator_agent(ScriptedClient([f"The answer is {answer + 1}."]), task())["reward"] == 0.0
    client = ScriptedClient(["<calculator>import os</calculator>", "<calculator>1+1</calculator>"])
    assert calculator_agent(client, task(max_turns=2)) == {"reward": 0.0, "success": False, "calculator_calls": 2}
    assert client.seen[1][-1]["content"].startswith("Error: ")


def test_the_example_config_names_the_example_agent() -> None:
    from pathlib import Path

    from asyncrl.config import load_config

    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/agent_calculator.yaml")
    assert cfg.env is not None and cfg.env.agent == "asyncrl.agents.examples:calculator_agent"


def test_without_the_demo_the_conversation_is_the_problem_alone() -> None:
    text, answer = sum_problem(5)
    client = ScriptedClient([f"The answer is {answer}."])
    calculator_agent(client, task(demo=False))
    assert client.seen[0] == [{"role": "system", "content": SYSTEM}, {"role": "user", "content": text}]
