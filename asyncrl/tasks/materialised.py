"""The tasks whose rows are materialised into their run (reasoning_gym and file): made once, on the machine that
creates the run, and then read by every role from the run's copy (`asyncrl.tasks.run_copy`), so that roles on other
machines (without the user's files, without reasoning-gym) see exactly the same rows.

Owns `prepare(cfg)`: both splits of such a task on this machine, registered for `load_split`
(`asyncrl.tasks.datasets.register_rows`):
- reasoning_gym: generated in reasoning-gym's venv and cached under `cfg.cache_dir` (`asyncrl.tasks.rgym_task`;
  the split rules, determinism and disjointness: `asyncrl.tasks.rgym_splits`);
- file: the first num_train / num_eval valid rows of train_path / eval_path (`asyncrl.tasks.file_task`).

Invariants: `prepare` is idempotent within a process (a registered task is returned as it is); it returns None for
the tasks that are not materialised (arithmetic, jsonl, agentic); the source document it records is small JSON
(names, parameters, seeds, file paths and their sha256), never the rows.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from asyncrl.config.schema import RunConfig, TaskConfig
from asyncrl.tasks.datasets import (
    MAX_PROMPT_CHARS,
    file_digest,
    load_split,
    register_rows,
    registered_rows,
    split_path,
)
from asyncrl.tasks.rgym_splits import GENERATOR
from asyncrl.tasks.rows import Row, TaskRows

MATERIALISED = ("reasoning_gym", "file")


def is_materialised(cfg: RunConfig) -> bool:
    """Whether this run's rows are materialised into it (a single-turn reasoning_gym or file task)."""
    return cfg.env is None and cfg.task.name in MATERIALISED


def _file_source(task: TaskConfig) -> dict[str, Any]:
    out: dict[str, Any] = {"task": "file", "prompt_field": task.prompt_field, "answer_field": task.answer_field,
                           "answer_format": task.answer_format}
    for split in ("train", "eval"):
        field, path = split_path(task, split)
        out[f"{split}_path"] = str(Path(path).expanduser().resolve())
        out[f"{split}_file_sha256"] = file_digest(field, path)
    return out


def prepare(cfg: RunConfig) -> TaskRows | None:
    """Both splits of a materialised task, made (or found) on this machine and registered; None for other tasks.
    `DatasetError` naming the config field when they cannot be made."""
    if not is_materialised(cfg):
        return None
    task = cfg.task
    found = registered_rows(task)
    if found is not None:
        return found
    if task.name == "reasoning_gym":
        from asyncrl.tasks.rgym_task import generate_splits

        made = generate_splits(task, cfg.cache_dir, MAX_PROMPT_CHARS)
        source = {"task": "reasoning_gym", "dataset": task.dataset, "params": task.dataset_params, "seed": task.seed,
                  "generator": GENERATOR, **made.info}
        rows = TaskRows(train=made.train, eval=made.eval, source=source)
    else:
        train, evals = (load_split(task, split) for split in ("train", "eval"))
        rows = TaskRows(train=[Row(p.prompt, p.answer) for p in train], eval=[Row(p.prompt, p.answer) for p in evals],
                        source=_file_source(task))
    register_rows(task, rows)
    return rows
