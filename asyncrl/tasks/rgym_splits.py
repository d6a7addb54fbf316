"""The split rules of a reasoning-gym task (`task.name: reasoning_gym`): pure functions of the generated rows.

Generation itself runs in reasoning-gym's own venv (`asyncrl.tasks.rgym_venv`, `asyncrl.tasks.rgym_generate`);
`asyncrl.tasks.rgym_task` drives the rounds and the cache. Here:
- two streams are generated from the dataset with `task.dataset_params`: the held-out stream with `eval_seed`, the
  train stream with `train_seed`, both derived from `task.seed` by sha256 (`split_seeds`) so that they are far apart
  (reasoning-gym seeds entry i of a stream with seed + i: nearby seeds would give shifted copies of one stream);
- a generated entry becomes a row (`to_row`): question -> prompt, answer -> answer as a string (an integer or a
  float written with str()), metadata kept only when it is a JSON object of at most `MAX_METADATA_CHARS` characters;
  an entry without a non-empty question or answer, or with a question over `max_prompt_chars`, is skipped and
  counted;
- the held-out split is the first `num_eval` rows of the held-out stream with distinct prompts; the train split is
  the first `num_train` rows of the train stream with distinct prompts that are not held-out prompts
  (`select_splits`): the two splits are disjoint by prompt and neither holds a duplicate;
- a stream that falls short is generated again, twice as long, up to `MAX_ROUNDS` rounds in all (`next_size`), then
  the split is capped at what there is (the dataset's universe is smaller than asked for); the held-out stream's
  sizes depend only on the held-out rows, so `num_train` never changes the held-out split;
- hence the splits are a deterministic function of (dataset, dataset_params, seed, num_train, num_eval) and the
  reasoning-gym version (`GENERATOR`), which is what `cache_key` hashes.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config.schema import TaskConfig
from asyncrl.tasks.rows import Row

REASONING_GYM_VERSION = "0.1.25"
GENERATOR = f"reasoning-gym=={REASONING_GYM_VERSION}"
RULES_VERSION = 1
MAX_METADATA_CHARS = 2048
MAX_ROUNDS = 4
SEED_SPACE = 2**31


def split_seeds(seed: int) -> tuple[int, int]:
    """(held-out seed, train seed) of `task.seed`: sha256-derived, in [0, 2**31)."""
    def derive(tag: str) -> int:
        return int(hashlib.sha256(f"asyncrl-reasoning-gym:{tag}:{seed}".encode()).hexdigest(), 16) % SEED_SPACE

    return derive("eval"), derive("train")


def cache_key(task: TaskConfig) -> str:
    """What the splits depend on, hashed (16 hex digits)."""
    blob = json.dumps({"rules": RULES_VERSION, "generator": GENERATOR, "dataset": task.dataset,
                       "params": task.dataset_params, "seed": task.seed, "num_train": task.num_train,
                       "num_eval": task.num_eval}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _text(value: Any) -> str | None:
    if isinstance(value, str):
        return value or None
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return str(value) if isinstance(value, int) or math.isfinite(value) else None


def to_row(entry: Any, max_prompt_chars: int) -> Row | str:
    """The row of one generated entry {"question", "answer"[, "metadata"]}, or why it is skipped."""
    if not isinstance(entry, dict):
        return "not an object"
    prompt, answer = entry.get("question"), _text(entry.get("answer"))
    if not isinstance(prompt, str) or not prompt:
        return "question: expected a non-empty string"
    if answer is None:
        return "answer: expected a non-empty string or a number"
    if len(prompt) > max_prompt_chars:
        return f"question: longer than {max_prompt_chars} characters"
    meta = entry.get("metadata")
    if isinstance(meta, dict):
        try:
            small = len(json.dumps(meta, allow_nan=False)) <= MAX_METADATA_CHARS
        except (TypeError, ValueError):
            small = False
        meta = meta if small else None
    else:
        meta = None
    return Row(prompt, answer, meta)


@dataclass
class Stream:
    """One generated stream's usable rows, in order, and the entries skipped (reason -> count)."""

    rows: list[Row]
    skipped: dict[str, int] = field(default_factory=dict)


def to_stream(entries: Iterable[Any], max_prompt_chars: int) -> Stream:
    out = Stream([])
    for entry in entries:
        row = to_row(entry, max_prompt_chars)
        if isinstance(row, str):
            out.skipped[row] = out.skipped.get(row, 0) + 1
        else:
            out.rows.append(row)
    return out


def first_distinct(rows: Sequence[Row], n: int, exclude: frozenset[str] = frozenset()) -> list[Row]:
    """The first `n` rows whose prompts are distinct and not in `exclude` (fewer when there are fewer)."""
    seen, out = set(exclude), []
    for r in rows:
        if len(out) == n:
            break
        if r.prompt not in seen:
            seen.add(r.prompt)
            out.append(r)
    return out


@dataclass(frozen=True)
class Splits:
    eval: list[Row]
    train: list[Row]


def select_splits(eval_rows: Sequence[Row], train_rows: Sequence[Row], num_eval: int, num_train: int) -> Splits:
    """The held-out and train splits of two generated streams (see the module invariants)."""
    held_out = first_distinct(eval_rows, num_eval)
    return Splits(held_out, first_distinct(train_rows, num_train, frozenset(r.prompt for r in held_out)))


def next_size(size: int) -> int:
    """The size a stream is generated at in the next round when its split fell short at `size`."""
    return 2 * size


def close_matches(name: str, names: Sequence[str]) -> list[str]:
    """The registered dataset names closest to a misspelt one (at most 5, best first)."""
    return difflib.get_close_matches(name, list(names), n=5, cutoff=0.6)
