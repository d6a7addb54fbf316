"""A user dataset of verifiable problems as JSON Lines: one `{"prompt": "...", "answer": "..."}` object a line.

Owns reading and checking the rows (`task.name: jsonl`), and the rules of a row that the other file formats share
(`field_problem`, `collect_rows`: `asyncrl.tasks.file_task`).

Invariants:
- a bad row (not UTF-8, not JSON, not an object, `prompt` or `answer` missing, not a string or empty, an unknown key, a
  prompt longer than `max_prompt_chars`) never stops loading: it is skipped, counted by reason, and logged with
  its file and 1-based line number (the first `MAX_LOGGED_ROWS`, then one summary line);
- blank lines are not rows; kept rows keep the file's order and get indices 0..n-1;
- a file that is missing, or without a single valid row, is a `DatasetError` naming the file.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

from asyncrl.tasks.arithmetic import Problem

log = logging.getLogger(__name__)

MAX_LOGGED_ROWS = 20
ROW_KEYS = ("prompt", "answer")


class DatasetError(ValueError):
    """The dataset file cannot be used at all; the message names the file."""


@dataclass
class LoadedDataset:
    problems: list[Problem]
    skipped: dict[str, int] = field(default_factory=dict)  # reason → rows skipped for it
    bad_lines: list[int] = field(default_factory=list)  # 1-based line numbers of the skipped rows

    @property
    def num_skipped(self) -> int:
        return sum(self.skipped.values())


def field_problem(row: dict[str, object], key: str) -> str | None:
    """Pure: why `row[key]` is not a usable prompt or answer (missing, not a non-empty string), or None."""
    if key not in row:
        return f"{key}: missing"
    if not isinstance(row[key], str) or not row[key]:
        return f"{key}: expected a non-empty string"
    return None


def check_row(line: str | bytes, max_prompt_chars: int) -> tuple[str, str] | str:
    """Pure: (prompt, answer) of one line, or the reason it is not a valid row."""
    if isinstance(line, bytes):
        try:
            line = line.decode("utf-8")
        except UnicodeDecodeError:
            return "not UTF-8 text"
    try:
        row = json.loads(line)
    except ValueError:
        return "not valid JSON"
    if not isinstance(row, dict):
        return f"expected a JSON object, got {type(row).__name__}"
    for key in ROW_KEYS:
        problem = field_problem(row, key)
        if problem is not None:
            return problem
    extra = sorted(set(row) - set(ROW_KEYS))
    if extra:
        return f"unknown key(s) {extra[:3]}"
    if len(row["prompt"]) > max_prompt_chars:
        return f"prompt: longer than {max_prompt_chars} characters"
    return row["prompt"], row["answer"]


def parse_rows(lines: list[str] | list[bytes], source: str, max_prompt_chars: int = 100_000) -> LoadedDataset:
    """Pure apart from logging: the valid rows of `lines` (see the module invariants)."""
    checked = ((number, check_row(line, max_prompt_chars)) for number, line in enumerate(lines, start=1)
               if line.strip())
    return collect_rows(checked, source, "JSON Lines of {\"prompt\": ..., \"answer\": ...}")


def collect_rows(checked: Iterable[tuple[int, tuple[str, str] | str]], source: str, expected: str) -> LoadedDataset:
    """Pure apart from logging: the kept rows of (1-based row number, (prompt, answer) or the reason it is bad), bad
    ones skipped, counted and logged as the module invariants say; `DatasetError` naming `source` and `expected`
    (what a row should be) when none is kept."""
    out = LoadedDataset([])
    for number, checked_row in checked:
        if isinstance(checked_row, str):
            out.skipped[checked_row] = out.skipped.get(checked_row, 0) + 1
            out.bad_lines.append(number)
            if len(out.bad_lines) <= MAX_LOGGED_ROWS:
                log.warning("%s:%d: row skipped: %s", source, number, checked_row)
            continue
        out.problems.append(Problem(index=len(out.problems), prompt=checked_row[0], answer=checked_row[1]))
    if out.num_skipped > MAX_LOGGED_ROWS:
        log.warning("%s: %d rows skipped in all (%s)", source, out.num_skipped, out.skipped)
    if not out.problems:
        raise DatasetError(f"{source}: no valid row (expected {expected}); {out.num_skipped} rows skipped: "
                           f"{out.skipped}")
    return out


def load_jsonl(path: str | Path, max_prompt_chars: int = 100_000) -> LoadedDataset:
    """The valid rows of the JSON Lines file at `path`."""
    p = Path(path)
    if not p.is_file():
        raise DatasetError(f"{p}: no such dataset file (expected JSON Lines)")
    try:
        data = p.read_bytes()
    except OSError as err:
        raise DatasetError(f"{p}: cannot read the dataset file: {err.strerror or err}") from None
    return parse_rows(data.splitlines(), str(p), max_prompt_chars)
