"""A reasoning-gym task's two splits (`task.name: reasoning_gym`): generated in reasoning-gym's venv by the rules of
`asyncrl.tasks.rgym_splits`, and cached under `cache_dir`.

Invariants:
- the splits of one (dataset, dataset_params, seed, num_train, num_eval) are generated once per `cache_dir`:
  `<cache_dir>/reasoning-gym/<dataset>-<cache_key>.json` holds both (written whole, a temporary file renamed), and
  a later call reads that file instead; a cache file that does not parse is generated again;
- each round runs the generator once, on the streams still short (`rgym_splits.MAX_ROUNDS` rounds at most); a split
  still short after the last is capped at what there is, with a warning; none at all is a `DatasetError`;
- errors name the config field: an unknown dataset `task.dataset` with its close matches; parameters the dataset
  refuses `task.dataset_params` with the keys it accepts; any other generation failure both.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config.schema import TaskConfig
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.rgym_splits import (
    GENERATOR,
    MAX_METADATA_CHARS,
    MAX_ROUNDS,
    Splits,
    Stream,
    cache_key,
    close_matches,
    next_size,
    select_splits,
    split_seeds,
    to_stream,
)
from asyncrl.tasks.rgym_venv import GeneratorError, ensure_venv, run_generator
from asyncrl.tasks.rows import Row, decode_row

log = logging.getLogger(__name__)

CACHE_FOLDER = "reasoning-gym"


@dataclass
class GeneratedSplits:
    """Both splits and how they were made (seeds, stream sizes, skipped entries, the reasoning-gym version)."""

    eval: list[Row]
    train: list[Row]
    info: dict[str, Any] = field(default_factory=dict)


def cache_file(task: TaskConfig, cache_dir: str | Path) -> Path:
    return Path(cache_dir).expanduser() / CACHE_FOLDER / f"{task.dataset}-{cache_key(task)}.json"


def _describe(task: TaskConfig) -> str:
    return f"reasoning-gym dataset {task.dataset!r} with task.dataset_params {task.dataset_params}"


def dataset_error(task: TaskConfig, err: GeneratorError) -> DatasetError:
    """The config-level error of the generator's report."""
    if err.kind == "unknown_dataset":
        names = [str(n) for n in err.details.get("names", [])]
        near = close_matches(task.dataset, names)
        hint = f"close matches: {near}" if near else f"{len(names)} datasets exist, e.g. {names[:8]}"
        return DatasetError(f"task.dataset: no reasoning-gym dataset named {task.dataset!r} ({hint})")
    if err.kind == "bad_params":
        return DatasetError(f"task.dataset_params: the reasoning-gym dataset {task.dataset!r} refuses "
                            f"{task.dataset_params}: {err.message} (its keys: {err.details.get('accepted', [])})")
    return DatasetError(f"task.dataset, task.dataset_params: generating {_describe(task)} failed: {err.message}")


def _read_cache(path: Path) -> GeneratedSplits | None:
    try:
        doc = json.loads(path.read_text())
        splits = {name: [decode_row(r) for r in doc[name]] for name in ("eval", "train")}
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if any(r is None for rows in splits.values() for r in rows) or not isinstance(doc.get("info"), dict):
        return None
    return GeneratedSplits(splits["eval"], splits["train"], doc["info"])  # type: ignore[arg-type]


def _write_cache(path: Path, splits: GeneratedSplits) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {"info": splits.info, "eval": [r.to_json() for r in splits.eval],
           "train": [r.to_json() for r in splits.train]}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".tmp-", suffix=".json")
    try:
        with os.fdopen(fd, "w") as f:
            json.dump(doc, f, ensure_ascii=False)
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


Generate = Callable[[dict[str, Any]], list[list[dict[str, Any]]]]
"""Runs one generator request (`asyncrl.tasks.rgym_generate`'s format), returns each job's entries."""


def generate_with(task: TaskConfig, generate: Generate, max_prompt_chars: int) -> GeneratedSplits:
    """Both splits, generated round by round through `generate` (see the module invariants)."""
    seeds = dict(zip(("eval", "train"), split_seeds(task.seed), strict=True))
    want = {"eval": task.num_eval, "train": task.num_train}
    sizes = dict(want)
    streams = {"eval": Stream([]), "train": Stream([])}
    todo, rounds, chosen = ["eval", "train"], 0, Splits([], [])
    while todo and rounds < MAX_ROUNDS:
        rounds += 1
        request = {"dataset": task.dataset, "params": task.dataset_params, "max_metadata_chars": MAX_METADATA_CHARS,
                   "jobs": [{"seed": seeds[name], "size": sizes[name]} for name in todo]}
        try:
            out = generate(request)
        except GeneratorError as err:
            raise dataset_error(task, err) from None
        for name, entries in zip(todo, out, strict=True):
            streams[name] = to_stream(entries, max_prompt_chars)
        chosen = select_splits(streams["eval"].rows, streams["train"].rows, task.num_eval, task.num_train)
        have = {"eval": len(chosen.eval), "train": len(chosen.train)}
        todo = [name for name in ("eval", "train") if have[name] < want[name]]
        for name in todo:
            sizes[name] = next_size(sizes[name])
    for name, rows in (("eval", chosen.eval), ("train", chosen.train)):
        if not rows:
            raise DatasetError(f"task.dataset: {_describe(task)} gave no usable {name} problem "
                               f"(entries skipped: {streams[name].skipped})")
        if len(rows) < want[name]:
            log.warning("task.num_%s: %s has only %d distinct %s problems%s after %d rounds of generation; the split "
                        "is capped at them (asked for %d)", name, _describe(task), len(rows), name,
                        " outside the held-out split" if name == "train" else "", rounds, want[name])
    info = {"generator": GENERATOR, "seeds": seeds, "rounds": rounds,
            "skipped": {name: s.skipped for name, s in streams.items()}}
    return GeneratedSplits(chosen.eval, chosen.train, info)


def generate_splits(task: TaskConfig, cache_dir: str | Path, max_prompt_chars: int) -> GeneratedSplits:
    """Both splits of a reasoning_gym task: from the cache under `cache_dir`, else generated and cached (see the
    module invariants)."""
    path = cache_file(task, cache_dir)
    cached = _read_cache(path) if path.is_file() else None
    if cached is not None:
        log.info("task.dataset %s: %d train and %d eval problems from the cache %s", task.dataset, len(cached.train),
                 len(cached.eval), path)
        return cached
    python = ensure_venv(cache_dir)
    splits = generate_with(task, lambda request: run_generator(python, request), max_prompt_chars)
    _write_cache(path, splits)
    log.info("task.dataset %s: generated %d train and %d eval problems (%d rounds); cached in %s", task.dataset,
             len(splits.train), len(splits.eval), splits.info["rounds"], path)
    return splits
