"""A JSON Lines dataset with bad rows: each bad row is skipped, counted and logged with its line number; loading
never stops on one; a file without a valid row is an error naming the file. And its wiring: task.name jsonl in the
config, the split dispatcher, the reward rule, the pre-flight check of `asyncrl validate`/`run`, the tiny model key."""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from asyncrl.cli import main as cli_main
from asyncrl.config import ConfigError, RunConfig, load_config
from asyncrl.config.schema import JSONL_MIN_PROMPT_TOKENS, TaskConfig
from asyncrl.rewards.verifier import score
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.arithmetic import load_split as arithmetic_split
from asyncrl.tasks.dataset_check import check_dataset
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError, load_jsonl, parse_rows
from asyncrl.tiny_model.build import build_inputs, cache_key


def test_bad_rows_are_skipped_counted_and_logged(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = tmp_path / "d.jsonl"
    path.write_bytes(b'{"prompt": "1+1=", "answer": "2"}\n'
                     b'{"prompt": "2+2=", "answer": 4}\n'          # 2: answer not a string
                     b"not json\n"                                 # 3
                     b"\n"                                         # blank: not a row
                     b'[1, 2]\n'                                   # 5: not an object
                     b'{"prompt": "\xff", "answer": "1"}\n'        # 6: not UTF-8
                     b'{"answer": "1"}\n'                          # 7: prompt missing
                     b'{"prompt": "3+3=", "answer": "6", "x": 1}\n'  # 8: unknown key
                     b'{"prompt": "' + b"9" * 50 + b'", "answer": "1"}\n'  # 9: too long
                     b'{"prompt": "3+4=", "answer": "7"}')
    with caplog.at_level(logging.WARNING, logger="asyncrl.tasks.jsonl"):
        data = load_jsonl(path, max_prompt_chars=40)
    assert [(p.index, p.prompt, p.answer) for p in data.problems] == [(0, "1+1=", "2"), (1, "3+4=", "7")]
    assert data.bad_lines == [2, 3, 5, 6, 7, 8, 9] and data.num_skipped == 7
    assert data.skipped == {"answer: expected a non-empty string": 1, "not valid JSON": 1,
                            "expected a JSON object, got list": 1, "not UTF-8 text": 1, "prompt: missing": 1,
                            "unknown key(s) ['x']": 1, "prompt: longer than 40 characters": 1}
    assert f"{path}:2: row skipped: answer: expected a non-empty string" in caplog.messages
    assert f"{path}:9: row skipped: prompt: longer than 40 characters" in caplog.messages


def test_many_bad_rows_log_a_summary(caplog: pytest.LogCaptureFixture) -> None:
    lines = ["x"] * 30 + ['{"prompt": "a", "answer": "b"}']
    with caplog.at_level(logging.WARNING, logger="asyncrl.tasks.jsonl"):
        data = parse_rows(lines, "big.jsonl")
    assert len(data.problems) == 1 and data.num_skipped == 30
    assert len(caplog.messages) == 21 and caplog.messages[-1] == (
        "big.jsonl: 30 rows skipped in all ({'not valid JSON': 30})")


def test_a_file_without_a_valid_row_is_an_error(tmp_path: Path) -> None:
    with pytest.raises(DatasetError, match=r"^e.jsonl: no valid row \(expected JSON Lines of \{\"prompt\": ..., "
                                           r"\"answer\": ...\}\); 2 rows skipped: \{'not valid JSON': 2\}$"):
        parse_rows(["a", "b", ""], "e.jsonl")
    with pytest.raises(DatasetError, match=r"nope.jsonl: no such dataset file \(expected JSON Lines\)$"):
        load_jsonl(tmp_path / "nope.jsonl")


# ---- wiring: config, dispatcher, reward, pre-flight check, CLI -----------------------------------------------------

def _write(path: Path, rows: list[str]) -> str:
    path.write_text("".join(r + "\n" for r in rows))
    return str(path)


def _row(prompt: str, answer: str) -> str:
    return json.dumps({"prompt": prompt, "answer": answer})


def _config_error(tmp_path: Path, text: str) -> list[str]:
    path = tmp_path / "c.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError) as info:
        load_config(path)
    return str(info.value).splitlines()[1:]


def test_config_jsonl_needs_both_paths_and_arithmetic_takes_none(tmp_path: Path) -> None:
    assert _config_error(tmp_path, "task:\n  name: jsonl\n  eval_path: e.jsonl\n") == [
        "  task.train_path: expected the path of a JSON Lines file of {\"prompt\", \"answer\"} rows (task.name jsonl "
        "needs train_path and eval_path)"]
    assert _config_error(tmp_path, "task:\n  name: jsonl\n  train_path: t.jsonl\n")[0].startswith(
        "  task.eval_path: expected the path of a JSON Lines file")
    assert _config_error(tmp_path, "task:\n  eval_path: e.jsonl\n") == [
        "  task.eval_path: only for task.name jsonl or file (the arithmetic task generates its own problems); remove "
        "it or set task.name: jsonl, got 'e.jsonl'"]


def test_config_jsonl_skips_the_arithmetic_checks_and_bounds_prompt_tokens() -> None:
    # num_eval 9 with max_operand 1 and one operation is an arithmetic error (4 problems), not a jsonl one
    task = TaskConfig(name="jsonl", train_path="t", eval_path="e", max_operand=1, operations=["+"], num_eval=9)
    assert task.max_prompt_tokens() == JSONL_MIN_PROMPT_TOKENS == 2
    assert TaskConfig().max_prompt_tokens() == 7  # arithmetic, max_operand 29: BOS + 2 + 1 + 2 + 1
    # the run-level length check uses that bound: max_model_len 16 >= 2 + 14, but 16 < 2 + 15
    RunConfig.model_validate({"task": task.model_dump(), "generation": {"max_model_len": 16},
                              "rollout": {"max_new_tokens": 14}})
    with pytest.raises(ValueError, match=r"longest prompt \(2 tokens\) \+ rollout.max_new_tokens \(15\)"):
        RunConfig.model_validate({"task": task.model_dump(), "generation": {"max_model_len": 16},
                                  "rollout": {"max_new_tokens": 15}})


def test_dispatcher_takes_the_first_rows_and_reads_a_file_once(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    train = _write(tmp_path / "train.jsonl", [_row(f"{i}+1=", str(i + 1)) for i in range(5)] + ["oops"])
    evals = _write(tmp_path / "eval.jsonl", [_row("7+7=", "14"), _row("8+8=", "16")])
    task = TaskConfig(name="jsonl", train_path=train, eval_path=evals, num_train=3, num_eval=10)
    with caplog.at_level(logging.INFO, logger="asyncrl.tasks"):
        got = load_split(task, "train")
        assert load_split(task.model_copy(update={"num_train": 100}), "train")[3:] == [
            Problem(3, "3+1=", "4"), Problem(4, "4+1=", "5")]
    assert got == [Problem(0, "0+1=", "1"), Problem(1, "1+1=", "2"), Problem(2, "2+1=", "3")]
    assert load_split(task, "eval") == [Problem(0, "7+7=", "14"), Problem(1, "8+8=", "16")]
    assert [m for m in caplog.messages if "rows kept" in m] == [
        f"task.train_path {train}: 5 rows kept, 1 skipped {{'not valid JSON': 1}}"]
    assert f"{train}:6: row skipped: not valid JSON" in caplog.messages
    # an edited file is read again
    _write(tmp_path / "train.jsonl", [_row("a", "b"), _row("c", "d"), _row("e", "f"), _row("g", "h")])
    assert [p.prompt for p in load_split(task, "train")] == ["a", "c", "e"]
    arithmetic = TaskConfig(num_train=20, num_eval=10)
    assert load_split(arithmetic, "train") == arithmetic_split(arithmetic, "train")
    with pytest.raises(DatasetError, match=r"^task.eval_path: .*missing.jsonl: no such dataset file"):
        load_split(task.model_copy(update={"eval_path": str(tmp_path / "missing.jsonl")}), "eval")


def test_reward_jsonl_is_the_exact_match_rule() -> None:
    assert score("jsonl", " Paris <eos>xx", "Paris") == (
        1.0, {"parsed": "Paris", "expected": "Paris", "correct": True, "reason": "correct"})
    assert score("jsonl", "paris", " Paris ") == (
        0.0, {"parsed": "paris", "expected": "Paris", "correct": False, "reason": "mismatch"})
    assert score("jsonl", "<eos>Paris", "Paris")[1]["reason"] == "empty"
    assert score("gsm8k", "1", "1")[0] == 1.0  # the verifier choice, not the task name, decides (scorer_for)


def _jsonl_run(tmp_path: Path, train_rows: list[str], eval_rows: list[str], **extra: object) -> RunConfig:
    train = _write(tmp_path / "train.jsonl", train_rows)
    evals = _write(tmp_path / "eval.jsonl", eval_rows)
    return RunConfig.model_validate({"task": {"name": "jsonl", "train_path": train, "eval_path": evals},
                                     "generation": {"max_model_len": 16}, "rollout": {"max_new_tokens": 8},
                                     **extra})


def test_check_dataset_counts_long_prompts_and_warns(tmp_path: Path) -> None:
    # limit 16 - 8 = 8 tokens = BOS + 7 characters with the built-in tokenizer
    cfg = _jsonl_run(tmp_path, [_row("1234567", "1"), _row("12345678", "2"), _row("é+1=", "x")],
                     [_row("1234567", "1")])
    report = check_dataset(cfg)
    assert (report.num_train, report.num_eval, report.train_too_long) == (3, 1, 1)
    assert report.warnings == [
        "task.eval_path: 1 eval prompt(s) also in task.train_path (the eval is not held out)",
        "task.train_path: 1 of 3 train prompts are longer than generation.max_model_len - rollout.max_new_tokens = "
        "8 tokens; the run skips them",
        "task: 1 prompt(s) and 0 answer(s) hold characters the built-in tokenizer does not have (e.g. ['é']); they "
        "read as <unk>, and such an answer can never be produced"]
    assert check_dataset(RunConfig()).num_train == 0  # arithmetic: nothing to check


def test_check_dataset_errors_name_the_field_and_file(tmp_path: Path) -> None:
    cfg = _jsonl_run(tmp_path, [_row("12345678", "1")], [_row("1", "1")])
    with pytest.raises(DatasetError, match=r"^task.train_path: .*train.jsonl: no train prompt fits in "
                                           r"generation.max_model_len - rollout.max_new_tokens = 8 tokens \(the "
                                           r"shortest has 9\)"):
        check_dataset(cfg)
    cfg = _jsonl_run(tmp_path, [_row("1", "1")], [_row("1", "1"), _row("123456789", "1")])
    with pytest.raises(DatasetError, match=r"^task.eval_path: .*eval.jsonl: 1 of 2 eval prompts are longer than .* "
                                           r"\(the longest, valid row 1 counting from 0, has 10\)"):
        check_dataset(cfg)
    assert check_dataset(cfg.model_copy(update={"eval": cfg.eval.model_copy(update={"every_steps": 0})})).num_eval == 2
    (tmp_path / "eval.jsonl").write_text("not json\n")
    with pytest.raises(DatasetError, match=r"^task.eval_path: .*eval.jsonl: no valid row"):
        check_dataset(cfg)


def test_validate_names_a_missing_dataset_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = _write(tmp_path / "train.jsonl", [_row("1+1=", "2")])
    missing = tmp_path / "nope.jsonl"
    args = ["validate", "--set", "task.name=jsonl", "--set", f"task.train_path={train}",
            "--set", f"task.eval_path={missing}"]
    with pytest.raises(SystemExit) as info:
        cli_main(args)
    assert info.value.code == 2
    assert capsys.readouterr().err == (f"asyncrl: task.eval_path: {missing}: no such dataset file (expected JSON "
                                       f"Lines)\n")
    _write(missing, [_row("2+2=", "4")])
    cli_main(args)
    assert json.loads(capsys.readouterr().out)["task"]["eval_path"] == str(missing)


def test_tiny_model_key_follows_the_train_file(tmp_path: Path) -> None:
    cfg = _jsonl_run(tmp_path, [_row("1+1=", "2")], [_row("2+2=", "4")])
    key = cache_key(cfg)
    assert build_inputs(cfg)["charset"] == "text" and "eval_path" not in build_inputs(cfg)["task"]
    _write(tmp_path / "eval.jsonl", [_row("3+3=", "6")])
    assert cache_key(cfg) == key  # the warm start never sees the eval file
    _write(tmp_path / "train.jsonl", [_row("1+1=", "3")])
    assert cache_key(cfg) != key
