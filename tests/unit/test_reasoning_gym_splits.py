"""The split rules of a reasoning_gym task on rows given by hand (pure), the rounds of generation over a generator
that answers requests the way reasoning-gym does (entry i of a stream depends on seed + i only, a finite universe of
questions), the generator's output format, the config-level errors, and the config fields."""

from __future__ import annotations

import json
from typing import Any

import pytest

from asyncrl.config import RunConfig
from asyncrl.config.schema import TaskConfig
from asyncrl.tasks import datasets
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.rgym_splits import (
    MAX_METADATA_CHARS,
    MAX_ROUNDS,
    cache_key,
    close_matches,
    first_distinct,
    select_splits,
    split_seeds,
    to_row,
)
from asyncrl.tasks.rgym_task import dataset_error, generate_with
from asyncrl.tasks.rgym_venv import GeneratorError, parse_output
from asyncrl.tasks.rows import Row, TaskRows


def _rows(*prompts: str) -> list[Row]:
    return [Row(p, f"ans-{p}") for p in prompts]


def test_splits_are_disjoint_distinct_and_topped_up() -> None:
    got = select_splits(_rows("a", "b", "a", "c", "d"), _rows("c", "e", "e", "a", "f", "g", "h"), 3, 4)
    assert [r.prompt for r in got.eval] == ["a", "b", "c"]  # the duplicate "a" skipped, topped up with "c"
    assert [r.prompt for r in got.train] == ["e", "f", "g", "h"]  # held-out "c" and "a" dropped, "e" once
    short = select_splits(_rows("a", "b"), _rows("a", "b", "c"), 5, 5)
    assert [r.prompt for r in short.eval] == ["a", "b"] and [r.prompt for r in short.train] == ["c"]
    assert first_distinct(_rows("x", "y", "z"), 2, frozenset({"x"})) == _rows("y", "z")


def test_entries_become_rows() -> None:
    assert to_row({"question": "Q", "answer": 12, "metadata": {"k": [1, 2]}}, 10) == Row("Q", "12", {"k": [1, 2]})
    assert to_row({"question": "Q", "answer": 0.5}, 10) == Row("Q", "0.5")
    assert to_row({"question": "Q", "answer": "A", "metadata": {"big": "x" * MAX_METADATA_CHARS}}, 10) == Row("Q", "A")
    assert to_row({"question": "Q", "answer": "A", "metadata": [1]}, 10) == Row("Q", "A")
    assert to_row({"question": "", "answer": "A"}, 10) == "question: expected a non-empty string"
    assert to_row({"question": "Q", "answer": None}, 10) == "answer: expected a non-empty string or a number"
    assert to_row({"question": "Q", "answer": True}, 10) == "answer: expected a non-empty string or a number"
    assert to_row({"question": "Q", "answer": float("nan")}, 10) == "answer: expected a non-empty string or a number"
    assert to_row({"question": "Q" * 11, "answer": "A"}, 10) == "question: longer than 10 characters"


def test_seeds_and_cache_key() -> None:
    eval_seed, train_seed = split_seeds(1234)
    assert (eval_seed, train_seed) == split_seeds(1234) and abs(eval_seed - train_seed) > 10**6
    assert split_seeds(1235) != (eval_seed, train_seed)
    task = TaskConfig(name="reasoning_gym", dataset="chain_sum", dataset_params={"min_terms": 2})
    assert cache_key(task) == cache_key(task.model_copy(update={"reward": "", "prompt_format": "raw"}))
    for change in ({"dataset_params": {"min_terms": 3}}, {"seed": 1}, {"num_train": 5}, {"num_eval": 5},
                   {"dataset": "basic_arithmetic"}):
        assert cache_key(task.model_copy(update=change)) != cache_key(task), change


class Universe:
    """Answers generator requests as reasoning-gym does: entry i of a stream with seed s is question (s + i) mod
    `size` of a universe of `size` questions (so streams of nearby seeds overlap); records every request."""

    def __init__(self, size: int) -> None:
        self.size, self.requests = size, []

    def __call__(self, request: dict[str, Any]) -> list[list[dict[str, Any]]]:
        self.requests.append(request)
        return [[{"question": f"q{(job['seed'] + i) % self.size}", "answer": str((job["seed"] + i) % self.size),
                  "metadata": {"i": i}} for i in range(job["size"])] for job in request["jobs"]]


def _task(**fields: Any) -> TaskConfig:
    return TaskConfig(**{"name": "reasoning_gym", "dataset": "toy", "num_train": 6, "num_eval": 3, **fields})


def test_rounds_of_generation_on_a_large_universe() -> None:
    gen = Universe(2**40)
    got = generate_with(_task(), gen, 1000)
    eval_seed, train_seed = split_seeds(1234)
    assert gen.requests == [{"dataset": "toy", "params": {}, "max_metadata_chars": MAX_METADATA_CHARS,
                             "jobs": [{"seed": eval_seed, "size": 3}, {"seed": train_seed, "size": 6}]}]
    assert [r.prompt for r in got.eval] == [f"q{eval_seed + i}" for i in range(3)]
    assert [r.prompt for r in got.train] == [f"q{train_seed + i}" for i in range(6)]
    assert got.eval[0].metadata == {"i": 0} and got.info["rounds"] == 1
    assert got.info["seeds"] == {"eval": eval_seed, "train": train_seed}


def test_a_small_universe_is_topped_up_then_capped(caplog: pytest.LogCaptureFixture) -> None:
    gen = Universe(8)  # 8 distinct questions: 3 held out, at most 5 left for training
    got = generate_with(_task(num_train=6, num_eval=3), gen, 1000)
    assert len(got.eval) == 3 and len(got.train) == 5
    assert not {r.prompt for r in got.eval} & {r.prompt for r in got.train}
    assert len({r.prompt for r in got.train}) == 5
    sizes = [[job["size"] for job in r["jobs"]] for r in gen.requests]
    assert sizes == [[3, 6], [12], [24], [48]] and got.info["rounds"] == MAX_ROUNDS  # only the short stream again
    assert any("task.num_train: reasoning-gym dataset 'toy'" in m and "only 5 distinct train problems outside the "
               "held-out split" in m for m in caplog.messages)
    again = generate_with(_task(num_train=6, num_eval=3), Universe(8), 1000)  # deterministic
    assert (again.eval, again.train) == (got.eval, got.train)
    more = generate_with(_task(num_train=2, num_eval=3), Universe(8), 1000)  # num_train never moves the eval split
    assert more.eval == got.eval


def test_a_dataset_without_a_usable_problem_is_an_error() -> None:
    def empty(request: dict[str, Any]) -> list[list[dict[str, Any]]]:
        return [[{"question": "", "answer": "1"}] * job["size"] for job in request["jobs"]]

    with pytest.raises(DatasetError, match=r"^task.dataset: reasoning-gym dataset 'toy' with task.dataset_params \{\} "
                                           r"gave no usable eval problem \(entries skipped: "
                                           r"\{'question: expected a non-empty string': 24\}\)$"):
        generate_with(_task(), empty, 1000)


def test_generator_output_and_errors() -> None:
    out = "\n".join(json.dumps(d) for d in [{"job": 1, "question": "b"}, {"job": 0, "question": "a"},
                                            {"done": True, "version": "0.1.25"}])
    assert parse_output(out, 2) == [[{"job": 0, "question": "a"}], [{"job": 1, "question": "b"}]]
    with pytest.raises(ValueError, match="ended before its last line"):
        parse_output('{"job": 0}\n', 1)
    with pytest.raises(ValueError, match="line 1: expected a row of job 0..0"):
        parse_output('{"job": 3}\n{"done": true}', 1)
    with pytest.raises(ValueError, match="line 2 is not JSON"):
        parse_output('{"job": 0}\n{"jo', 1)
    with pytest.raises(GeneratorError) as info:
        parse_output('{"job": 0}\n{"error": "unknown_dataset", "message": "m", "names": ["chain_sum"]}', 1)
    assert (info.value.kind, info.value.details) == ("unknown_dataset", {"names": ["chain_sum"]})

    task = _task(dataset="basic_arithmetc", dataset_params={"min_term": 2})
    names = ["basic_arithmetic", "chain_sum", "gsm_symbolic", "arc_1d"]
    assert close_matches("basic_arithmetc", names) == ["basic_arithmetic"]
    assert str(dataset_error(task, GeneratorError("unknown_dataset", "m", {"names": names}))) == (
        "task.dataset: no reasoning-gym dataset named 'basic_arithmetc' (close matches: ['basic_arithmetic'])")
    assert str(dataset_error(_task(dataset="zzz"), GeneratorError("unknown_dataset", "m", {"names": names}))) == (
        "task.dataset: no reasoning-gym dataset named 'zzz' (4 datasets exist, e.g. ['basic_arithmetic', "
        "'chain_sum', 'gsm_symbolic', 'arc_1d'])")
    bad = GeneratorError("bad_params", "TypeError: unexpected keyword argument 'min_term'", {"accepted": ["min_terms"]})
    assert str(dataset_error(task, bad)) == (
        "task.dataset_params: the reasoning-gym dataset 'basic_arithmetc' refuses {'min_term': 2}: TypeError: "
        "unexpected keyword argument 'min_term' (its keys: ['min_terms'])")
    assert str(dataset_error(task, GeneratorError("generation_failed", "boom", {}))).startswith(
        "task.dataset, task.dataset_params: generating reasoning-gym dataset 'basic_arithmetc' with")


def test_config_fields_of_the_reasoning_gym_task(monkeypatch: pytest.MonkeyPatch) -> None:
    task = TaskConfig(name="reasoning_gym", dataset="gsm_symbolic", num_train=10, num_eval=10)
    assert task.max_prompt_tokens() == 2
    with pytest.raises(ValueError, match=r"task.dataset: expected a reasoning-gym dataset name"):
        TaskConfig(name="reasoning_gym")
    with pytest.raises(ValueError, match=r"task.dataset_params: \['seed', 'size'\] are set by asyncrl"):
        TaskConfig(name="reasoning_gym", dataset="x", dataset_params={"size": 3, "seed": 1})
    with pytest.raises(ValueError, match=r"task.dataset_params: only for task.name reasoning_gym"):
        TaskConfig(dataset_params={"a": 1})
    with pytest.raises(ValueError, match=r"task.train_path: only for task.name jsonl or file \(the reasoning_gym task "
                                         r"generates its own problems\)"):
        TaskConfig(name="reasoning_gym", dataset="x", train_path="t.jsonl")
    monkeypatch.setattr(datasets, "_registered", {})
    with pytest.raises(DatasetError, match=r"task.dataset: the train split of reasoning-gym dataset 'gsm_symbolic' is "
                                           r"not prepared in this process"):
        load_split(task, "train")
    cfg = RunConfig.model_validate({"task": task.model_dump()})
    datasets.register_rows(cfg.task, TaskRows(_rows("p", "q"), _rows("r"), {}))
    assert [(p.index, p.prompt) for p in load_split(task, "train")] == [(0, "p"), (1, "q")]
    assert [p.answer for p in load_split(task, "eval")] == ["ans-r"]
    with pytest.raises(DatasetError, match="not prepared"):  # another seed: other rows
        load_split(task.model_copy(update={"seed": 9}), "train")
