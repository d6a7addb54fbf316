"""`task.name: file`: Parquet, JSON and JSON Lines files with field mapping (a GSM8K export included), bad rows skipped
and counted like a jsonl file's, a missing field named with the file and the fields found; and its config fields."""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.cli import main as cli_main
from asyncrl.config import RunConfig, load_config
from asyncrl.config.schema import JSONL_MIN_PROMPT_TOKENS, TaskConfig
from asyncrl.tasks import datasets
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.dataset_check import check_dataset
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.file_task import check_mapped, gsm8k_answer, load_mapped_file
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.materialised import prepare
from asyncrl.tasks.rows import digest, encode_rows

GSM8K = [
    {"question": "Natalia sold clips to 48 of her friends in April, and then half as many in May. How many in all?",
     "answer": "Natalia sold 48/2 = <<48/2=24>>24 clips in May.\nNatalia sold 48+24 = <<48+24=72>>72 clips.\n#### 72"},
    {"question": "A shop sells 1,000 pens a day. How many in 1,234 days?", "answer": "1000*1234 = 1234000\n#### 1,234,000"},
    {"question": "No final answer here.", "answer": "It is 5."},
    {"question": "Weng earns $12 an hour. How much for 50 minutes?", "answer": "12/60*50 = 10\n#### 10"},
]


def _parquet(path: Path, rows: list[dict]) -> str:
    pq.write_table(pa.Table.from_pylist(rows), path)
    return str(path)


def test_gsm8k_answers_are_the_text_after_the_last_mark() -> None:
    assert gsm8k_answer("a #### 3\n#### 72") == "72"
    assert gsm8k_answer("#### 1,234,567 ") == "1234567"
    assert gsm8k_answer("####  -3,000.5") == "-3000.5"
    assert gsm8k_answer("#### 12,34") == "12,34"  # not a thousands separator: kept
    assert gsm8k_answer("no mark") is None and gsm8k_answer("x ####  ") is None


def test_row_rules() -> None:
    assert check_mapped({"q": "a", "a": 7, "x": None}, "q", "a", "raw", 10) == ("a", "7")
    assert check_mapped({"q": "a", "a": True}, "q", "a", "raw", 10) == "a: expected a non-empty string or an integer"
    assert check_mapped({"q": "a", "a": 1.5}, "q", "a", "raw", 10) == "a: expected a non-empty string or an integer"
    assert check_mapped({"q": "", "a": "1"}, "q", "a", "raw", 10) == "q: expected a non-empty string"
    assert check_mapped({"a": "1"}, "q", "a", "raw", 10) == "q: missing"
    assert check_mapped({"q": "a"}, "q", "a", "raw", 10) == "a: missing"
    assert check_mapped({"q": "a" * 11, "a": "1"}, "q", "a", "raw", 10) == "q: longer than 10 characters"
    assert check_mapped(["q"], "q", "a", "raw", 10) == "expected an object, got list"
    assert check_mapped({"q": "a", "a": "so 4"}, "q", "a", "gsm8k", 10) == (
        "a: no final answer after '####' (task.answer_format gsm8k)")


def test_a_gsm8k_parquet_export(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    path = _parquet(tmp_path / "train.parquet", GSM8K)
    with caplog.at_level(logging.WARNING, logger="asyncrl.tasks.jsonl"):
        data = load_mapped_file(path, "question", "answer", "gsm8k")
    assert [(p.index, p.answer) for p in data.problems] == [(0, "72"), (1, "1234000"), (2, "10")]
    assert data.problems[0].prompt == GSM8K[0]["question"]
    assert data.skipped == {"answer: no final answer after '####' (task.answer_format gsm8k)": 1}
    assert data.bad_lines == [3]
    assert caplog.messages == [f"{path}:3: row skipped: answer: no final answer after '####' (task.answer_format gsm8k)"]
    raw = load_mapped_file(path, "question", "answer", "raw")  # the whole solution is the answer
    assert len(raw.problems) == 4 and raw.problems[0].answer == GSM8K[0]["answer"]


def test_a_missing_field_names_the_field_the_file_and_the_fields_found(tmp_path: Path) -> None:
    path = _parquet(tmp_path / "t.parquet", GSM8K)
    with pytest.raises(DatasetError) as info:
        load_mapped_file(path)  # default fields prompt / answer
    assert str(info.value) == f"{path}: no field 'prompt' (task.prompt_field); fields found: ['question', 'answer']"
    j = tmp_path / "t.json"
    j.write_text(json.dumps([{"q": "1+1", "solution": "2"}, {"q": "2+2", "extra": 1}]))
    with pytest.raises(DatasetError) as info:
        load_mapped_file(j, "q", "answer")
    assert str(info.value) == f"{j}: no field 'answer' (task.answer_field); fields found: ['q', 'solution', 'extra']"


def test_json_and_jsonl_files_with_bad_rows(tmp_path: Path) -> None:
    j = tmp_path / "d.json"
    j.write_text(json.dumps([{"q": "1+1", "a": "2"}, "text", {"q": "2+2"}, {"q": "3+3", "a": 6}]))
    data = load_mapped_file(j, "q", "a")
    assert [(p.prompt, p.answer) for p in data.problems] == [("1+1", "2"), ("3+3", "6")]
    assert data.skipped == {"expected an object, got str": 1, "a: missing": 1} and data.bad_lines == [2, 3]
    lines = tmp_path / "d.JSONL"
    lines.write_bytes(b'{"q": "1+1", "a": "2"}\nnot json\n\n{"q": "\xff"}\n[1]\n{"q": "5+5", "a": "10", "z": 0}\n')
    data = load_mapped_file(lines, "q", "a")
    assert [(p.index, p.prompt) for p in data.problems] == [(0, "1+1"), (1, "5+5")]
    assert data.skipped == {"not valid JSON": 1, "not UTF-8 text": 1, "expected an object, got list": 1}
    assert data.bad_lines == [2, 4, 5]
    (tmp_path / "n.json").write_text('{"q": "x"}')
    with pytest.raises(DatasetError, match=r"n.json: expected a JSON list of objects, got dict$"):
        load_mapped_file(tmp_path / "n.json", "q", "a")
    (tmp_path / "bad.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(DatasetError, match=r"bad.parquet: not a readable Parquet file"):
        load_mapped_file(tmp_path / "bad.parquet")
    with pytest.raises(DatasetError, match=r"none.json: no such dataset file \(expected a .parquet, .json or .jsonl"):
        load_mapped_file(tmp_path / "none.json")
    j.write_text(json.dumps([{"q": "", "a": "1"}]))
    with pytest.raises(DatasetError, match=r"d.json: no valid row \(expected objects with a string 'q' and an 'a'\); "
                                           r"1 rows skipped: \{'q: expected a non-empty string': 1\}$"):
        load_mapped_file(j, "q", "a")


def test_config_fields_of_the_file_task() -> None:
    task = TaskConfig(name="file", train_path="t.parquet", eval_path="e.JSON", prompt_field="question",
                      answer_format="gsm8k")
    assert task.max_prompt_tokens() == JSONL_MIN_PROMPT_TOKENS
    bad = [({"name": "file", "train_path": "t.csv", "eval_path": "e.json"},
            "task.train_path: expected the path of a .parquet, .json or .jsonl file (task.name file needs train_path "
            "and eval_path), got 't.csv'"),
           ({"name": "file", "train_path": "t.json"},
            "task.eval_path: expected the path of a .parquet, .json or .jsonl file (task.name file needs train_path "
            "and eval_path), got ''"),
           ({"name": "jsonl", "train_path": "t", "eval_path": "e", "prompt_field": "question"},
            "task.prompt_field: only for task.name file (default 'prompt'); remove it or set task.name: file, got "
            "'question'"),
           ({"answer_format": "gsm8k"},
            "task.answer_format: only for task.name file (default 'raw'); remove it or set task.name: file, got "
            "'gsm8k'")]
    for fields, message in bad:
        with pytest.raises(ValueError) as info:
            TaskConfig(**fields)
        assert message in str(info.value), str(info.value)


def test_load_split_and_prepare_of_a_file_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "_registered", {})
    train = _parquet(tmp_path / "train.parquet", GSM8K)
    evals = tmp_path / "eval.jsonl"
    evals.write_text("\n".join(json.dumps({"question": f"{i}+{i}?", "answer": f"so #### {2 * i}"}) for i in range(5)))
    task = TaskConfig(name="file", train_path=train, eval_path=str(evals), prompt_field="question",
                      answer_format="gsm8k", num_train=2, num_eval=3)
    assert [p.answer for p in load_split(task, "train")] == ["72", "1234000"]  # the first num_train valid rows
    assert load_split(task, "eval") == [Problem(0, "0+0?", "0"), Problem(1, "1+1?", "2"), Problem(2, "2+2?", "4")]
    cfg = RunConfig.model_validate({"task": task.model_dump()})
    rows = prepare(cfg)
    assert rows is not None and [r.answer for r in rows.eval] == ["0", "2", "4"] and len(rows.train) == 2
    assert rows.source["task"] == "file" and rows.source["answer_format"] == "gsm8k"
    assert len(rows.source["train_file_sha256"]) == 64 and rows.source["eval_path"] == str(evals.resolve())
    assert prepare(cfg) is rows  # once per process
    Path(train).unlink()  # registered: the split no longer reads the file
    assert [p.answer for p in load_split(task, "train")] == ["72", "1234000"]


def test_validate_checks_a_file_task(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    train = _parquet(tmp_path / "train.parquet", GSM8K)
    evals = _parquet(tmp_path / "eval.parquet", GSM8K[:2])
    args = ["validate", "--set", "task.name=file", "--set", f"task.train_path={train}", "--set",
            f"task.eval_path={evals}", "--set", "task.prompt_field=question", "--set", "task.answer_format=gsm8k",
            "--set", "generation.max_model_len=512", "--set", "rollout.max_new_tokens=8"]
    cli_main(args)
    out = capsys.readouterr()
    assert json.loads(out.out)["task"]["answer_format"] == "gsm8k"
    assert "(expected answer: '72')" in out.err
    with pytest.raises(SystemExit) as info:
        cli_main([a.replace("task.prompt_field=question", "task.prompt_field=problem") for a in args])
    assert info.value.code == 2
    assert capsys.readouterr().err.strip().endswith(
        f"asyncrl: task.train_path: {train}: no field 'problem' (task.prompt_field); fields found: "
        f"['question', 'answer']")


def test_the_pre_flight_check_reads_a_file_task(tmp_path: Path) -> None:
    train = _parquet(tmp_path / "train.parquet", GSM8K)
    evals = tmp_path / "eval.json"
    evals.write_text(json.dumps([{"question": GSM8K[0]["question"], "answer": "#### 72"}, {"question": "x?",
                                                                                         "answer": "#### 1"}]))
    cfg = RunConfig.model_validate({"task": {"name": "file", "train_path": train, "eval_path": str(evals),
                                             "prompt_field": "question", "answer_format": "gsm8k"},
                                    "generation": {"max_model_len": 512}, "rollout": {"max_new_tokens": 8}})
    report = check_dataset(cfg)
    assert (report.num_train, report.num_eval) == (3, 2)
    assert "task.eval_path: 1 eval prompt(s) also in task.train_path (the eval is not held out)" in report.warnings


def test_the_config_examples_of_docs_datasets_validate(tmp_path: Path) -> None:
    text = (Path(__file__).resolve().parents[2] / "docs/datasets.md").read_text()
    blocks = re.findall(r"```yaml\n(.*?)```", text, flags=re.S)
    names = []
    for i, block in enumerate(blocks):
        (tmp_path / f"{i}.yaml").write_text(block)
        names.append(load_config(tmp_path / f"{i}.yaml").task.name)
    assert names == ["reasoning_gym", "file"]


def test_the_tiny_model_key_and_the_lineage_of_a_file_task(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from asyncrl.run.lineage import dataset_inputs
    from asyncrl.tiny_model.build import build_inputs, cache_key

    monkeypatch.setattr(datasets, "_registered", {})
    train = _parquet(tmp_path / "train.parquet", GSM8K)
    evals = _parquet(tmp_path / "eval.parquet", GSM8K[:1])
    fields = {"name": "file", "train_path": train, "eval_path": evals, "prompt_field": "question",
              "answer_format": "gsm8k"}
    cfg = RunConfig.model_validate({"task": fields})
    inputs = build_inputs(cfg)
    assert inputs["task"] == {"name": "file", "num_train": 1600} and inputs["charset"] == "text"
    assert inputs["train_sha256"] == digest(encode_rows(prepare(cfg).train))
    other = RunConfig.model_validate({"task": {**fields, "answer_format": "raw"}})  # other rows: another model
    assert cache_key(other) != cache_key(cfg)
    found = {d["context"]: d for d in dataset_inputs(cfg)}
    assert (found["train"]["source"], found["train"]["source_type"], found["train"]["size"]) == (train, "local", 3)
    assert found["eval"]["name"] == "file-eval" and found["eval"]["size"] == 1
