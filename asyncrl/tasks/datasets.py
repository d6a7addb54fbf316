"""The task's problems by split, whatever the task: the one entry point every caller uses (`load_split`).

Owns the dispatch on `task.name` ("arithmetic": generated problems, `asyncrl.tasks.arithmetic`; "jsonl": the user's
files, `asyncrl.tasks.jsonl`) and the jsonl split rules.

Invariants:
- a split is a list of `Problem` with indices 0..n-1 in order;
- jsonl: the train split is the first `task.num_train` valid rows of `task.train_path`, the eval split the first
  `task.num_eval` valid rows of `task.eval_path` (fewer when the file has fewer); nothing is shuffled or deduplicated
  (the user owns the split; a prompt in both files is only warned about, by `asyncrl.tasks.dataset_check`);
- each jsonl file is read, and its row and skip counts logged, once per process while it is unchanged (same path,
  size and modification time); a missing file or one without a valid row is a `DatasetError` naming the task field
  and the file.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

from asyncrl.config.schema import TaskConfig
from asyncrl.tasks import arithmetic
from asyncrl.tasks.arithmetic import Problem, Split
from asyncrl.tasks.jsonl import DatasetError, LoadedDataset, load_jsonl

log = logging.getLogger(__name__)

MAX_PROMPT_CHARS = 100_000
"""Longest jsonl prompt kept, in characters (longer rows are skipped as bad rows)."""

_loaded: dict[tuple[str, int, int], LoadedDataset] = {}  # (resolved path, size, mtime_ns) → rows, read once


def split_path(task: TaskConfig, split: Split) -> tuple[str, str]:
    """(field name, path) of a jsonl split's file."""
    if split == "train":
        return "task.train_path", task.train_path
    if split == "eval":
        return "task.eval_path", task.eval_path
    raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")


def load_file(field: str, path: str) -> LoadedDataset:
    """All valid rows of one jsonl file, read once per process while it is unchanged; `DatasetError` names `field`."""
    p = Path(path).expanduser()
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_size, st.st_mtime_ns)
    except OSError:
        key = None
    if key is not None and key in _loaded:
        return _loaded[key]
    try:
        data = load_jsonl(p, MAX_PROMPT_CHARS)
    except DatasetError as err:
        raise DatasetError(f"{field}: {err}") from None
    log.info("%s %s: %d rows kept, %d skipped%s", field, p, len(data.problems), data.num_skipped,
             f" {data.skipped}" if data.skipped else "")
    if key is not None:
        _loaded[key] = data
    return data


def file_digest(field: str, path: str) -> str:
    """sha256 (hex) of a dataset file's bytes: what a model built from it depends on; `DatasetError` names `field`."""
    p = Path(path).expanduser()
    digest = hashlib.sha256()
    try:
        with p.open("rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                digest.update(chunk)
    except OSError as err:
        raise DatasetError(f"{field}: {p}: cannot read the dataset file: {err.strerror or err}") from None
    return digest.hexdigest()


def load_split(task: TaskConfig, split: Split) -> list[Problem]:
    """The problems of one split ("train" or "eval") of the configured task."""
    if task.name == "arithmetic":
        return arithmetic.load_split(task, split)
    if task.name == "jsonl":
        field, path = split_path(task, split)
        limit = task.num_train if split == "train" else task.num_eval
        return load_file(field, path).problems[:limit]
    raise ValueError(f"task.name: expected 'arithmetic' or 'jsonl', got {task.name!r}")
