"""The arithmetic task's splits and the exact-match verifier."""

from __future__ import annotations

import pytest

from asyncrl.config.schema import TaskConfig
from asyncrl.rewards.verifier import score
from asyncrl.tasks.arithmetic import Problem, load_split, make_problem, universe_size


def _triples(problems: list[Problem]) -> set[str]:
    return {p.prompt for p in problems}


def test_splits_are_deterministic_and_disjoint() -> None:
    task = TaskConfig(num_train=3000, num_eval=150, max_operand=49, seed=7)
    train, evals = load_split(task, "train"), load_split(task, "eval")
    assert len(train) == 3000 and len(evals) == 150
    assert load_split(task, "train") == train and load_split(task, "eval") == evals
    assert len(_triples(train)) == 3000 and len(_triples(evals)) == 150
    assert not _triples(train) & _triples(evals)
    assert [p.index for p in train] == list(range(3000))


def test_eval_split_does_not_depend_on_num_train_and_seed_changes_it() -> None:
    base = TaskConfig(num_train=100, num_eval=50, max_operand=99, seed=1)
    assert load_split(base, "eval") == load_split(base.model_copy(update={"num_train": 5000}), "eval")
    assert load_split(base, "eval") != load_split(base.model_copy(update={"seed": 2}), "eval")


def test_problem_format_and_ranges() -> None:
    task = TaskConfig(num_train=500, num_eval=100, max_operand=12, operations=["+", "-", "*"], seed=3)
    for p in load_split(task, "train") + load_split(task, "eval"):
        a_text, op, b_text = p.prompt[:-1].partition("+")
        if not op:
            a_text, op, b_text = p.prompt[:-1].partition("-")
        if not op:
            a_text, op, b_text = p.prompt[:-1].partition("*")
        a, b = int(a_text), int(b_text)
        assert p.prompt.endswith("=") and 0 <= a <= 12 and 0 <= b <= 12
        assert int(p.answer) == {"+": a + b, "-": a - b, "*": a * b}[op]
        assert len(p.prompt) + 1 <= task.max_prompt_tokens()


def test_make_problem_negative_answer() -> None:
    assert make_problem(0, 3, "-", 10) == Problem(index=0, prompt="3-10=", answer="-7")
    assert make_problem(1, 12, "*", 11) == Problem(index=1, prompt="12*11=", answer="132")


def test_small_universe_train_is_everything_outside_eval() -> None:
    task = TaskConfig(num_train=10_000, num_eval=20, max_operand=9, operations=["+"], seed=0)
    assert universe_size(task) == 100
    train, evals = load_split(task, "train"), load_split(task, "eval")
    assert len(train) == 80 and len(_triples(train) | _triples(evals)) == 100


def test_eval_too_large_and_bad_split_are_errors() -> None:
    with pytest.raises(ValueError, match="task.num_eval"):
        TaskConfig(num_eval=100, max_operand=9, operations=["+"])
    with pytest.raises(ValueError, match="split"):
        load_split(TaskConfig(), "test")  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("response", "answer", "reward", "reason"),
    [
        ("42", "42", 1.0, "correct"),
        (" 42 ", "42", 1.0, "correct"),
        ("42<eos>", "42", 1.0, "correct"),
        ("42<eos>17", "42", 1.0, "correct"),
        ("-7", "-7", 1.0, "correct"),
        ("7", "-7", 0.0, "mismatch"),
        ("-7", "7", 0.0, "mismatch"),
        ("43", "42", 0.0, "mismatch"),
        ("420", "42", 0.0, "mismatch"),
        ("42=", "42", 0.0, "mismatch"),
        ("4 2", "42", 0.0, "mismatch"),
        ("", "42", 0.0, "empty"),
        ("<eos>42", "42", 0.0, "empty"),
        ("   ", "0", 0.0, "empty"),
    ],
)
def test_verifier_exact_cases(response: str, answer: str, reward: float, reason: str) -> None:
    got, details = score("arithmetic", response, answer)
    assert got == reward
    assert details["correct"] is (reward == 1.0)
    assert details["reason"] == reason


def test_verifier_details_and_any_task() -> None:
    assert score("arithmetic", " -12<eos>", "-12") == (
        1.0,
        {"parsed": "-12", "expected": "-12", "correct": True, "reason": "correct"},
    )
    assert score("gsm8k", "1", "1")[0] == 1.0  # the verifier choice (scorer_for), not the task name, decides
