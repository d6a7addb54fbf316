"""The run's copy of a materialised task's rows (reasoning_gym and file tasks), under the run's S3 prefix:
`data/train.jsonl`, `data/eval.jsonl` and `data/dataset.json` (`asyncrl.storage.run_layout`).

`record_task_data` is called where the run is created (`asyncrl.run.create.create_run`: the embedded launcher and
the pipeline's setup step), before any role starts; `load_run_copy` by a role that needs the rows (the environment
role, through `RoleContext.load_task_data`), which then serves them to `load_split`.

Invariants:
- the copy is written once: both splits (`asyncrl.tasks.rows.encode_rows`), then `data/dataset.json` last
  ({"format", "task", "source", "splits": {split: {"key", "rows", "sha256", "bytes"}}}, by a conditional PUT); a
  creation that finds the document already there (a retry, a resume) keeps it and writes nothing;
- a role never reads the user's files or runs reasoning-gym: it reads the copy, checks each split's sha256 and row
  count against the document, and parses it as JSON only (never unpickled); a missing or damaged copy is a
  `DatasetError` naming the key;
- other tasks (arithmetic, jsonl, agentic) have no copy: both functions return None for them.
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.config.schema import RunConfig
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store
from asyncrl.tasks.datasets import register_rows
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.materialised import is_materialised, prepare
from asyncrl.tasks.rows import TaskRows, decode_rows, digest, encode_rows

log = logging.getLogger(__name__)

DATA_FORMAT = 1
SPLITS = ("train", "eval")


def record_task_data(store: S3Store, paths: RunPaths, cfg: RunConfig) -> dict[str, Any] | None:
    """Write the run's copy of the task's rows (made by `asyncrl.tasks.materialised.prepare`) unless it is there;
    returns `data/dataset.json`'s document, or None for a task without a copy."""
    if not is_materialised(cfg):
        return None
    existing = store.get_json(paths.task_data())
    if isinstance(existing, dict) and existing.get("splits"):
        return existing
    rows = prepare(cfg)
    assert rows is not None
    doc: dict[str, Any] = {"format": DATA_FORMAT, "task": cfg.task.name, "source": rows.source, "splits": {}}
    for split, split_rows in (("train", rows.train), ("eval", rows.eval)):
        data = encode_rows(split_rows)
        key = paths.task_split(split)
        store.put_bytes(key, data)
        doc["splits"][split] = {"key": key[len(paths.root) + 1:], "rows": len(split_rows), "sha256": digest(data),
                                "bytes": len(data)}
    try:
        store.put_json(paths.task_data(), doc, if_absent=True)
    except ObjectExists:  # another creation of the same run finished first: its copy stands
        return store.get_json(paths.task_data())
    log.info("task rows written to %s: %d train, %d eval", paths.task_data(), len(rows.train), len(rows.eval))
    return doc


def load_run_copy(store: S3Store, paths: RunPaths, cfg: RunConfig) -> TaskRows | None:
    """The run's copy of the task's rows, checked and registered for `load_split` in this process; None for a task
    without a copy. `DatasetError` naming the key when it is missing or damaged."""
    if not is_materialised(cfg):
        return None
    where = f"{store.bucket}/{paths.task_data()}"
    doc = store.get_json(paths.task_data())
    if not isinstance(doc, dict) or not isinstance(doc.get("splits"), dict):
        raise DatasetError(f"{where}: missing: expected the task's rows, written by `asyncrl run` or the pipeline's "
                           f"setup step before the roles start (task.name {cfg.task.name})")
    if doc.get("format") != DATA_FORMAT or doc.get("task") != cfg.task.name:
        raise DatasetError(f"{where}: expected format {DATA_FORMAT} of a task.name {cfg.task.name} run, got format "
                           f"{doc.get('format')!r} of task {doc.get('task')!r}")
    splits = {}
    for split in SPLITS:
        key, meta = paths.task_split(split), doc["splits"].get(split)
        data = store.get_bytes(key)
        if data is None or not isinstance(meta, dict):
            raise DatasetError(f"{store.bucket}/{key}: missing: the run's {split} split (listed in {where})")
        if digest(data) != meta.get("sha256"):
            raise DatasetError(f"{store.bucket}/{key}: sha256 {digest(data)} differs from {meta.get('sha256')} in "
                               f"{where}: the run's copy is damaged")
        rows = decode_rows(data, f"{store.bucket}/{key}")
        if len(rows) != meta.get("rows"):
            raise DatasetError(f"{store.bucket}/{key}: {len(rows)} rows, {where} says {meta.get('rows')}")
        splits[split] = rows
    source = doc.get("source") if isinstance(doc.get("source"), dict) else {}
    rows_of_run = TaskRows(train=splits["train"], eval=splits["eval"], source=source)
    register_rows(cfg.task, rows_of_run)
    log.info("task rows from the run's copy %s: %d train, %d eval", where, len(splits["train"]), len(splits["eval"]))
    return rows_of_run
