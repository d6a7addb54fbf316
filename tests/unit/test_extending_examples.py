"""docs/extending.md's examples, run for real, with exact expected values.

Every fenced block preceded by `<!-- example: NAME -->` is extracted from the page and used as it is: the Python
blocks are written to a package on `sys.path` (`my_envs/guess.py`, `my_envs/graded.py`), the JSON Lines blocks to
`data/*.jsonl` in the working folder, the YAML blocks are validated as run configurations, and the text blocks are
what the code must print or log. The environment is driven through `make`, the executor (threads and a worker
process) and the config check; the reward through the reward role's `/score_batch` app; the dataset through the
task loader every role uses. No engine, no network; well under a second or two.
"""

from __future__ import annotations

import ast
import asyncio
import json
import logging
import re
import sys
from collections.abc import Awaitable, Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml

from asyncrl.config import ConfigError, RunConfig
from asyncrl.config.load import config_from_dict
from asyncrl.envs import EpisodeOver, NotAnEnvironment, StepResult, make, resolve
from asyncrl.envs.execution import EnvExecutor
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
TEXT = DOC.read_text()
PROSE = " ".join(TEXT.split())  # the page's text with every run of whitespace as one space (line wrapping aside)
MARKER = re.compile(r"<!-- example: ([\w-]+) -->")
EXAMPLE = re.compile(r"<!-- example: ([\w-]+) -->\n```(\w+)\n(.*?)\n```", re.DOTALL)
PACKAGE = "my_envs"
EXPECTED_EXAMPLES = {
    "env": "python", "env-config": "yaml", "env-transcript": "text",
    "reward-request": "json", "reward-answer": "json", "reward-fn": "python", "reward-fn-config": "yaml",
    "reward": "python", "reward-config": "yaml",
    "dataset-train": "jsonl", "dataset-eval": "jsonl", "dataset-config": "yaml", "dataset-log": "text",
    "loss": "python", "loss-config": "yaml",  # run by tests/unit/test_extending_loss.py
}


def _examples() -> dict[str, str]:
    found = EXAMPLE.findall(TEXT)
    names = [name for name, _, _ in found]
    assert len(names) == len(set(names)), f"an example name is used twice: {names}"
    assert {name: lang for name, lang, _ in found} == EXPECTED_EXAMPLES
    return {name: body + "\n" for name, _, body in found}


EXAMPLES = _examples()


def _config(name: str) -> RunConfig:
    return config_from_dict(yaml.safe_load(EXAMPLES[name]), f"docs/extending.md example {name}")


@pytest.fixture
def user_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The page's files laid out as a user would: `my_envs/` on sys.path (and PYTHONPATH, for worker processes),
    `data/*.jsonl` in the working folder. The package is forgotten afterwards so each test imports it afresh."""
    pkg = tmp_path / "src" / PACKAGE
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "guess.py").write_text(EXAMPLES["env"])
    (pkg / "graded.py").write_text(EXAMPLES["reward"])
    (pkg / "near_miss.py").write_text(EXAMPLES["reward-fn"])
    (pkg / "broken.py").write_text("raise RuntimeError('no config here')\n")
    data = tmp_path / "work" / "data"
    data.mkdir(parents=True)
    (data / "train.jsonl").write_text(EXAMPLES["dataset-train"])
    (data / "eval.jsonl").write_text(EXAMPLES["dataset-eval"])
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("PYTHONPATH", str(pkg.parent))
    monkeypatch.chdir(data.parent)
    try:
        yield pkg
    finally:
        for module in [m for m in sys.modules if m == PACKAGE or m.startswith(PACKAGE + ".")]:
            del sys.modules[module]


def test_every_marker_heads_an_extracted_block() -> None:
    assert len(MARKER.findall(TEXT)) == len(EXAMPLES) == len(EXPECTED_EXAMPLES)


# ---- your own environment -----------------------------------------------------------------------------------------

def _transcript_actions() -> tuple[int, list[str]]:
    lines = EXAMPLES["env-transcript"].splitlines()
    seed = int(re.fullmatch(r"reset\((\d+)\) -> .*", lines[0]).group(1))  # type: ignore[union-attr]
    actions = [ast.literal_eval(re.fullmatch(r"step\((.*?)\) -> .*", line).group(1))  # type: ignore[union-attr]
               for line in lines[1:]]
    return seed, actions


async def _play(reset: Callable[[int], Awaitable[tuple[str, dict[str, Any]]]],
                step: Callable[[str], Awaitable[StepResult]], seed: int, actions: list[str]) -> str:
    observation, _ = await reset(seed)
    lines = [f"reset({seed}) -> {observation!r}"]
    for action in actions:
        r = await step(action)
        lines.append(f"step({action!r}) -> {r.observation!r} reward={r.reward!r} terminated={r.terminated!r} "
                     f"truncated={r.truncated!r} info={r.info!r}")
    return "\n".join(lines) + "\n"


def test_env_config_validates_and_the_transcript_is_what_the_environment_does(user_package: Path) -> None:
    cfg = _config("env-config")
    assert cfg.env is not None and cfg.env.name == "my_envs.guess:GuessNumber"
    assert cfg.env.params == {"max_number": 16, "max_guesses": 4} and cfg.env.max_turns == 4
    seed, actions = _transcript_actions()
    assert (seed, actions) == (0, ["8", "Maybe 12?", "hmm", "It is 13"])
    env = make(cfg.env.name, **cfg.env.params)
    assert asyncio.run(_play(env.reset, env.step, seed, actions)) == EXAMPLES["env-transcript"]
    with pytest.raises(EpisodeOver):
        asyncio.run(env.step("13"))


def test_env_runs_through_the_executor_in_threads_and_in_a_worker_process(user_package: Path) -> None:
    cfg = _config("env-config")
    assert cfg.env is not None
    seed, actions = _transcript_actions()

    async def run(executor: EnvExecutor) -> str:
        try:
            handle = await executor.open(cfg.env.name, cfg.env.params)  # type: ignore[union-attr]
            return await _play(handle.reset, handle.step, seed, actions)
        finally:
            await executor.aclose()

    assert asyncio.run(run(EnvExecutor.from_config(cfg.env))) == EXAMPLES["env-transcript"]
    # a fresh interpreter resolves the import path on its own (PYTHONPATH, as the docs say)
    assert asyncio.run(run(EnvExecutor("processes", 4, 20.0))) == EXAMPLES["env-transcript"]


def test_env_truncates_after_max_guesses_without_success(user_package: Path) -> None:
    env = make("my_envs.guess:GuessNumber", max_number=16, max_guesses=4)

    async def episode() -> list[StepResult]:
        await env.reset(1)  # the secret of level 1 is 5
        return [await env.step(guess) for guess in ("1", "9", "6", "4")]

    results = asyncio.run(episode())
    assert [(r.observation, r.reward, r.terminated, r.truncated) for r in results] == [
        ("Higher.", 0.0, False, False), ("Lower.", 0.0, False, False), ("Lower.", 0.0, False, False),
        ("Higher.", 0.0, False, True)]
    assert results[-1].info == {"guesses": 4, "success": False}


def _env_error(name: str, params: dict[str, Any] | None = None) -> str:
    with pytest.raises(ConfigError) as err:
        config_from_dict({"model": {"path": "/models/x"}, "env": {"name": name, "params": params or {}}})
    return str(err.value)


def test_import_path_errors_name_the_field(user_package: Path) -> None:
    assert ("\n  env.name: environment 'my_envs.nothere:GuessNumber': cannot import module 'my_envs.nothere' "
            "(No module named 'my_envs.nothere'); install it in the run's Python environment or put its folder on "
            "PYTHONPATH") in _env_error("my_envs.nothere:GuessNumber")
    assert ("\n  env.name: environment 'my_envs.broken:X': importing module 'my_envs.broken' raised RuntimeError: "
            "no config here") in _env_error("my_envs.broken:X")
    assert ("\n  env.name: environment 'my_envs.guess:GuessNumbers': module 'my_envs.guess' has no attribute "
            "'GuessNumbers'") in _env_error("my_envs.guess:GuessNumbers")
    assert ("\n  env.name: environment 'my_envs.guess:NUMBER': expected a class, got a Pattern"
            in _env_error("my_envs.guess:NUMBER"))
    assert ("\n  env.name: environment 'my_envs.graded:Problem': Problem is not an environment: expected "
            "`async def reset`") in _env_error("my_envs.graded:Problem")
    assert ("\n  env.name: environment 'my_envs.guess:': expected a registered name or an import path "
            "'package.module:ClassName'") in _env_error("my_envs.guess:")
    assert ("\n  env.params: environment 'my_envs.guess:GuessNumber': bad parameters ['colour']: "
            in _env_error("my_envs.guess:GuessNumber", {"colour": "red"}))
    assert ("\n  env.params: max_number: expected >= 2, got 1"
            in _env_error("my_envs.guess:GuessNumber", {"max_number": 1}))


def test_an_import_path_never_calls_what_is_not_an_environment_class(user_package: Path) -> None:
    # a class that is not an environment is refused before it is constructed (Popen would start a process)
    with pytest.raises(NotAnEnvironment, match="Popen is not an environment: expected `async def reset`"):
        make("subprocess:Popen", args=["false"])
    with pytest.raises(NotAnEnvironment, match="expected a class, got a builtin_function_or_method"):
        resolve("os:getpid")
    assert resolve("my_envs.guess:GuessNumber").__name__ == "GuessNumber"
    assert resolve("frozenlake").__name__ == "FrozenLake"  # registered names are untouched


# ---- your own reward ----------------------------------------------------------------------------------------------

def test_reward_role_answers_the_documented_batch_exactly() -> None:
    from asyncrl.roles.reward import create_app

    stats: dict[str, int] = {}
    app = create_app(stats, token=None)

    async def post() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post("/score_batch", json=json.loads(EXAMPLES["reward-request"]))

    response = asyncio.run(post())
    assert response.status_code == 200
    assert response.json() == json.loads(EXAMPLES["reward-answer"])
    assert stats == {"scored": 2, "rejected": 1}


def test_task_reward_function_scores_through_the_reward_role(user_package: Path) -> None:
    from asyncrl.rewards.custom import scorer_for
    from asyncrl.roles.reward import create_app

    cfg = _config("reward-fn-config")
    assert cfg.task.reward == "my_envs.near_miss:near_miss"
    items = [{"task": "arithmetic", "prompt": "3+4=", "response": r, "metadata": {"answer": "7"}}
             for r in ("7<eos>", " 8 <eos>9", "6", "x", "7")]
    app = create_app({}, token=None, scorer=scorer_for(cfg.task))

    async def post(body: dict[str, Any]) -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as client:
            return await client.post("/score_batch", json=body)

    results = asyncio.run(post({"items": items})).json()["results"]
    assert [r["reward"] for r in results] == [1.0, 0.5, 0.5, 0.0, 1.0]
    assert results[0]["details"] == {"reward_fn": "my_envs.near_miss:near_miss", "correct": True}


def test_task_reward_errors_name_the_field(user_package: Path) -> None:
    from asyncrl.rewards.custom import RewardFunctionError, make_scorer

    def error(path: str) -> str:
        with pytest.raises(ConfigError) as e:
            config_from_dict({"task": {"reward": path}}, "test")
        return str(e.value)

    assert "task.reward: task.reward 'my_envs.near_miss:far': module 'my_envs.near_miss' has no attribute" in error(
        "my_envs.near_miss:far")
    assert "expected a function (prompt, response, answer) -> float, got a class" in error("my_envs.graded:GradedAnswer")
    assert "expected a function of (prompt, response, answer)" in error("my_envs.graded:grade")
    (user_package / "bad.py").write_text("def boolean(prompt, response, answer):\n    return response == answer\n"
                                         "def boom(prompt, response, answer):\n    raise KeyError(answer)\n")
    with pytest.raises(RewardFunctionError, match=r"'my_envs.bad:boolean': expected a finite number, got True"):
        make_scorer("my_envs.bad:boolean")("t", "p", "7", "7")
    with pytest.raises(RewardFunctionError, match=r"'my_envs.bad:boom' raised KeyError: '7'"):
        make_scorer("my_envs.bad:boom")("t", "p", "7", "7")


def test_reward_function_scores_exactly(user_package: Path) -> None:
    from my_envs.graded import grade  # type: ignore[import-not-found]

    assert [grade(reply, "42") for reply in ("42", " 42\n", "It is 42.", "41", "42 or 43", "", "forty-two")] == [
        1.0, 1.0, 0.5, 0.0, 0.0, 0.0, 0.0]


def test_single_turn_reward_environment_plays_the_dataset_rows(user_package: Path) -> None:
    cfg = _config("reward-config")
    assert cfg.env is not None and cfg.env.max_turns == 1 and cfg.env.num_eval == 2
    env = make(cfg.env.name, **cfg.env.params)

    async def ask(seed: int, reply: str) -> tuple[str, dict[str, Any], StepResult]:
        observation, info = await env.reset(seed)
        return observation, info, await env.step(reply)

    assert asyncio.run(ask(0, "42")) == ("What is 7 * 6?", {"index": 0},
                                         StepResult("", 1.0, True, False, {"success": True, "answer": "42"}))
    assert asyncio.run(ask(0, "It is 42.")) == ("What is 7 * 6?", {"index": 0},
                                                StepResult("", 0.5, True, False, {"success": False, "answer": "42"}))
    assert asyncio.run(ask(0, "41"))[2].reward == 0.0
    assert asyncio.run(ask(1, "god"))[:2] == ("Spell dog backwards.", {"index": 1})
    assert asyncio.run(ask(2, "x"))[:2] == ("What is 7 * 6?", {"index": 0})  # held-out seeds cycle over the eval rows
    assert asyncio.run(ask(1_000_000, "5"))[0] == "What is 2 + 3?"  # training seeds play the train rows
    assert asyncio.run(ask(1_000_002, "tac"))[:2] == ("Spell cat backwards.", {"index": 2})
    with pytest.raises(EpisodeOver):
        asyncio.run(env.step("again"))
    assert "level 0 asks `What is 7 * 6?`; the reply `42` gets 1.0, `It is 42.` 0.5, `41` 0.0" in PROSE


def test_reward_environment_with_a_missing_file_fails_the_config_check(user_package: Path) -> None:
    for f in (user_package.parent.parent / "work" / "data").iterdir():
        f.unlink()
    with pytest.raises(ConfigError) as err:
        _config("reward-config")
    documented = re.search(r"`(env\.params: data/train\.jsonl: no such dataset file \(expected JSON Lines\))`", PROSE)
    assert documented is not None
    assert str(err.value).endswith("\n  " + documented.group(1))


# ---- your own dataset ---------------------------------------------------------------------------------------------

def test_dataset_example_loads_the_documented_rows_and_logs_the_bad_one(
        user_package: Path, caplog: pytest.LogCaptureFixture) -> None:
    cfg = _config("dataset-config")
    assert cfg.env is None and cfg.task.name == "jsonl"
    with caplog.at_level(logging.WARNING, logger="asyncrl.tasks.jsonl"):
        train = load_split(cfg.task, "train")
        evals = load_split(cfg.task, "eval")
    rows = [(p.index, p.prompt, p.answer) for p in train]
    assert rows == [(0, "What is 2 + 3?", "5"), (1, "What is 10 - 4?", "6"), (2, "Spell cat backwards.", "tac")]
    prose = PROSE[PROSE.index("The train split is three rows"):PROSE.index("and the load logs")]
    assert [(int(i), p, a) for i, p, a in re.findall(r'\((\d+), "([^"]*)", "([^"]*)"\)', prose)] == rows
    assert [(p.index, p.prompt, p.answer) for p in evals] == [(0, "What is 7 * 6?", "42"),
                                                              (1, "Spell dog backwards.", "god")]
    logged = [r.getMessage() for r in caplog.records if r.name == "asyncrl.tasks.jsonl"]
    assert "\n".join(logged) + "\n" == EXAMPLES["dataset-log"]


def test_dataset_without_a_valid_row_is_the_documented_error(user_package: Path) -> None:
    Path("data/train.jsonl").write_text('{"prompt": "What is 9 * 9?", "answer": 81}\nnot json\n')
    cfg = _config("dataset-config")
    with pytest.raises(DatasetError) as err:
        load_split(cfg.task, "train")
    documented = re.search(r"`(task\.train_path: data/train\.jsonl: no valid row .*?); \.\.\.`", PROSE)
    assert documented is not None
    assert str(err.value).startswith(documented.group(1) + "; ")
    assert str(err.value) == (documented.group(1) + "; 2 rows skipped: {'answer: expected a non-empty string': 1, "
                              "'not valid JSON': 1}")
