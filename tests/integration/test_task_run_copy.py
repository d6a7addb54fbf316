"""A file task's rows are materialised into the run when it is created (a real SeaweedFS server), and a role reads
that copy, not the user's files: the files may change or vanish afterwards (a role on another machine has none of
them). A retried creation keeps the copy; a damaged or missing copy stops the role with the key named."""

from __future__ import annotations

import json
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.config import load_config
from asyncrl.roles.context import RoleContext
from asyncrl.run.create import create_run
from asyncrl.storage.run_layout import RunPaths
from asyncrl.tasks import datasets
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.rows import digest

pytestmark = pytest.mark.integration

TRAIN = [{"question": f"Tom has {i} apples and buys {i + 1} more. How many?", "answer": f"{i}+{i + 1}\n#### {2 * i + 1}",
          "id": i} for i in range(6)]


def test_roles_read_the_runs_copy_of_a_file_task(s3_server, s3_store, tmp_path: Path,
                                                monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "_registered", {})
    train, evals = tmp_path / "train.parquet", tmp_path / "eval.jsonl"
    pq.write_table(pa.Table.from_pylist(TRAIN), train)
    evals.write_text(json.dumps({"question": "Ann has 1,000 pens and 1,000 more. How many?",
                                 "answer": "#### 2,000"}) + "\n")
    cfg = load_config(None, ["task.name=file", f"task.train_path={train}", f"task.eval_path={evals}",
                             "task.prompt_field=question", "task.answer_format=gsm8k", "task.num_train=4",
                             "model.path=/models/elsewhere", f"storage.bucket={s3_store.bucket}", "run_id=copy-test",
                             f"cache_dir={tmp_path / 'cache'}"])
    paths = RunPaths(cfg.storage.prefix, cfg.run_id)
    created = create_run(s3_store, paths, cfg, tracking_uri="", mode="cluster")
    doc = s3_store.get_json(paths.task_data())
    assert created.task_data == doc and doc["task"] == "file" and doc["format"] == 1
    train_bytes = s3_store.get_bytes(paths.task_split("train"))
    assert doc["splits"]["train"] == {"key": "data/train.jsonl", "rows": 4, "sha256": digest(train_bytes),
                                      "bytes": len(train_bytes)}
    assert doc["splits"]["eval"]["rows"] == 1 and doc["source"]["answer_format"] == "gsm8k"
    assert json.loads(train_bytes.splitlines()[0]) == {"prompt": TRAIN[0]["question"], "answer": "1"}
    expected = [Problem(i, TRAIN[i]["question"], str(2 * i + 1)) for i in range(4)]

    # after the run was created the user's files change and vanish; a fresh role process reads the run's copy
    pq.write_table(pa.Table.from_pylist(TRAIN[::-1]), train)
    evals.unlink()
    monkeypatch.setattr(datasets, "_registered", {})
    role = RoleContext("environment", "env0", f"s3://{s3_store.bucket}/{paths.root}", s3_store, paths, cfg)
    role.load_task_data()
    assert load_split(cfg.task, "train") == expected
    assert load_split(cfg.task, "eval") == [Problem(0, "Ann has 1,000 pens and 1,000 more. How many?", "2000")]

    again = create_run(s3_store, paths, cfg, tracking_uri="", mode="cluster")  # a retry: the copy stands
    assert not again.written and again.task_data == doc
    assert s3_store.get_bytes(paths.task_split("train")) == train_bytes

    s3_store.put_bytes(paths.task_split("eval"), b'{"answer":"3","prompt":"forged"}\n')
    monkeypatch.setattr(datasets, "_registered", {})
    with pytest.raises(SystemExit) as info:
        role.load_task_data()
    assert str(info.value).startswith(f"environment: {s3_store.bucket}/{paths.task_split('eval')}: sha256 ")
    assert str(info.value).endswith("the run's copy is damaged")
    s3_store.delete(paths.task_data())
    with pytest.raises(SystemExit, match=rf"^environment: {s3_store.bucket}/{paths.task_data()}: missing: expected the "
                                         r"task's rows, written by `asyncrl run` or the pipeline's setup step"):
        role.load_task_data()
    with pytest.raises(DatasetError, match=r"^task.eval_path: .*eval.jsonl: no such dataset file"):
        load_split(cfg.task, "eval")  # nothing registered: only the user's files, and they are gone
