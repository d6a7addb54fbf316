"""A task's rows as they travel: the JSON Lines form of a split that is materialised into a run (reasoning_gym and
file tasks: `asyncrl.tasks.materialised`), and the problems the roles get from it. Pure: bytes in, bytes out.

Invariants:
- a row is {"prompt": non-empty str, "answer": non-empty str} plus, optionally, "metadata": a JSON object (what the
  source said about the row; reasoning-gym's entry metadata when it is small);
- `encode_rows` writes one compact JSON object a line, keys sorted, UTF-8, newline-terminated: the same rows always
  give the same bytes, so a split's sha256 (`digest`) names its content;
- `decode_rows` accepts exactly what `encode_rows` writes: any other line is a `DatasetError` naming the source and
  the line (the run's copy is written by asyncrl, so a bad line means a damaged object, never a row to skip); it
  never evaluates anything but JSON;
- `to_problems` keeps the order: row i is `Problem(index=i)`.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.jsonl import DatasetError

ROW_KEYS = frozenset({"prompt", "answer", "metadata"})


@dataclass(frozen=True)
class Row:
    """One problem of a materialised split: prompt, exact answer, and optional metadata (a JSON object)."""

    prompt: str
    answer: str
    metadata: dict[str, Any] | None = None

    def to_json(self) -> dict[str, Any]:
        doc: dict[str, Any] = {"prompt": self.prompt, "answer": self.answer}
        if self.metadata is not None:
            doc["metadata"] = self.metadata
        return doc


@dataclass(frozen=True)
class TaskRows:
    """Both splits of a materialised task, and where they came from (a small JSON object: `data/dataset.json`'s
    "source")."""

    train: list[Row]
    eval: list[Row]
    source: dict[str, Any]


def encode_rows(rows: Sequence[Row]) -> bytes:
    """The split as JSON Lines bytes (see the module invariants)."""
    return "".join(json.dumps(r.to_json(), sort_keys=True, ensure_ascii=False, separators=(",", ":")) + "\n"
                   for r in rows).encode("utf-8")


def digest(data: bytes) -> str:
    """sha256 (hex) of a split's bytes."""
    return hashlib.sha256(data).hexdigest()


def decode_row(doc: Any) -> Row | None:
    """The row of one parsed JSON value, or None when it is not one."""
    if not isinstance(doc, dict) or not {"prompt", "answer"} <= set(doc) or not set(doc) <= ROW_KEYS:
        return None
    prompt, answer, meta = doc["prompt"], doc["answer"], doc.get("metadata")
    if not (isinstance(prompt, str) and prompt and isinstance(answer, str) and answer):
        return None
    if meta is not None and not isinstance(meta, dict):
        return None
    return Row(prompt, answer, meta)


def decode_rows(data: bytes, source: str) -> list[Row]:
    """The rows of `encode_rows` bytes; `DatasetError` naming `source` and the 1-based line on anything else."""
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise DatasetError(f"{source}: not UTF-8 text (expected the JSON Lines asyncrl wrote)") from None
    rows = []
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            row = decode_row(json.loads(line))
        except ValueError:
            row = None
        if row is None:
            raise DatasetError(f"{source}:{number}: expected a JSON object {{\"prompt\", \"answer\"[, \"metadata\"]}} "
                               f"with non-empty strings, got {line[:120]!r}")
        rows.append(row)
    return rows


def to_problems(rows: Sequence[Row]) -> list[Problem]:
    """The split's problems, indices 0..n-1 in row order."""
    return [Problem(index=i, prompt=r.prompt, answer=r.answer) for i, r in enumerate(rows)]
