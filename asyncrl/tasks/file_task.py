"""A user's dataset file with field mapping (`task.name: file`): Parquet, JSON (a list of objects) or JSON Lines.

Owns reading such a file into problems: which column or key is the prompt and which the answer
(`task.prompt_field`, `task.answer_field`), and the answer's format (`task.answer_format`).

Invariants:
- the format is the file's suffix, any case: .parquet (a table), .json (one JSON list of objects), .jsonl (one JSON
  object a line; blank lines are not rows);
- a row's prompt is `row[prompt_field]`, a non-empty string of at most `max_prompt_chars` characters; its answer is
  `row[answer_field]`, a non-empty string or an integer (written in decimal); other fields are ignored;
- answer format "gsm8k": the answer is the text after the last "####", stripped, with thousands commas removed
  ("#### 1,234" -> "1234"); an answer without "####", or with nothing after it, makes the row bad;
- a bad row never stops loading: it is skipped, counted by reason and logged with the file and its 1-based row number,
  by the rules of a jsonl file (`asyncrl.tasks.jsonl.collect_rows`); kept rows keep the file's order, indices 0..n-1;
- a field that no row has (a Parquet column that is not there; a key in none of a JSON file's objects) is a
  `DatasetError` naming the field, the file and the fields found; so is a missing or unreadable file, a .json file that
  is not a list, and a file without a single valid row.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asyncrl.tasks.jsonl import DatasetError, LoadedDataset, collect_rows, field_problem

GSM8K_MARK = "####"
_THOUSANDS = re.compile(r"(?<=\d),(?=\d{3}(?!\d))")
MAX_FIELDS_SHOWN = 20


def gsm8k_answer(text: str) -> str | None:
    """Pure: the final answer of a GSM8K solution (the text after the last '####', stripped, thousands commas
    removed), or None when there is no '####' or nothing after it."""
    if GSM8K_MARK not in text:
        return None
    answer = _THOUSANDS.sub("", text.rsplit(GSM8K_MARK, 1)[1].strip())
    return answer or None


def check_mapped(row: Any, prompt_field: str, answer_field: str, answer_format: str,
                 max_prompt_chars: int) -> tuple[str, str] | str:
    """Pure: (prompt, answer) of one record, or the reason it is not a valid row."""
    if not isinstance(row, dict):
        return f"expected an object, got {type(row).__name__}"
    problem = field_problem(row, prompt_field)
    if problem is not None:
        return problem
    if answer_field not in row:
        return f"{answer_field}: missing"
    answer = row[answer_field]
    if isinstance(answer, int) and not isinstance(answer, bool):
        answer = str(answer)
    if not isinstance(answer, str) or not answer:
        return f"{answer_field}: expected a non-empty string or an integer"
    if answer_format == "gsm8k":
        final = gsm8k_answer(answer)
        if final is None:
            return f"{answer_field}: no final answer after '{GSM8K_MARK}' (task.answer_format gsm8k)"
        answer = final
    prompt = row[prompt_field]
    if len(prompt) > max_prompt_chars:
        return f"{prompt_field}: longer than {max_prompt_chars} characters"
    return prompt, answer


class _Bad(str):
    """A record that could not even be parsed: the reason (a str, so `collect_rows` counts it as a bad row)."""


def _json_lines(data: bytes) -> Iterator[tuple[int, Any]]:
    """(1-based line number, the object or the reason the line is not one) of each non-blank line."""
    for number, line in enumerate(data.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            yield number, json.loads(line.decode("utf-8"))
        except UnicodeDecodeError:
            yield number, _Bad("not UTF-8 text")
        except ValueError:
            yield number, _Bad("not valid JSON")


def _records(p: Path, fields: tuple[str, str]) -> tuple[list[tuple[int, Any]], list[str]]:
    """(1-based row number, record) of every row of the file, and the fields (columns or keys) found in it."""
    suffix = p.suffix.lower()
    if suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            pf = pq.ParquetFile(p)
            columns = list(pf.schema_arrow.names)
            wanted = [f for f in dict.fromkeys(fields) if f in columns]
            table = pf.read(columns=wanted)
        except (OSError, pa.ArrowException) as err:
            raise DatasetError(f"{p}: not a readable Parquet file: {err}") from None
        return list(enumerate(table.to_pylist(), start=1)), columns
    try:
        data = p.read_bytes()
    except OSError as err:
        raise DatasetError(f"{p}: cannot read the dataset file: {err.strerror or err}") from None
    if suffix == ".jsonl":
        records = list(_json_lines(data))
    elif suffix == ".json":
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as err:
            raise DatasetError(f"{p}: not a JSON file (expected a list of objects): {err}") from None
        if not isinstance(doc, list):
            raise DatasetError(f"{p}: expected a JSON list of objects, got {type(doc).__name__}")
        records = list(enumerate(doc, start=1))
    else:
        raise DatasetError(f"{p}: expected a .parquet, .json or .jsonl file")
    keys = dict.fromkeys(k for _, r in records if isinstance(r, dict) for k in r)
    return records, list(keys)


def load_mapped_file(path: str | Path, prompt_field: str = "prompt", answer_field: str = "answer",
                     answer_format: str = "raw", max_prompt_chars: int = 100_000) -> LoadedDataset:
    """The valid rows of a .parquet, .json or .jsonl file (see the module invariants)."""
    p = Path(path).expanduser()
    if not p.is_file():
        raise DatasetError(f"{p}: no such dataset file (expected a .parquet, .json or .jsonl file)")
    records, found = _records(p, (prompt_field, answer_field))
    for field, key in ((prompt_field, "task.prompt_field"), (answer_field, "task.answer_field")):
        if field not in found:
            shown = found[:MAX_FIELDS_SHOWN] + (["..."] if len(found) > MAX_FIELDS_SHOWN else [])
            raise DatasetError(f"{p}: no field {field!r} ({key}); fields found: {shown}")
    checked = ((n, r if isinstance(r, _Bad) else check_mapped(r, prompt_field, answer_field, answer_format,
                                                              max_prompt_chars)) for n, r in records)
    return collect_rows(checked, str(p), f"objects with a string {prompt_field!r} and an {answer_field!r}")
