"""Generate reasoning-gym rows: a standalone script run in the reasoning-gym venv (`asyncrl.tasks.rgym_venv`), never
imported by asyncrl and importing nothing of it (only the standard library and `reasoning_gym`).

    <venv>/bin/python -I rgym_generate.py < request.json > rows.jsonl

Request (one JSON object on stdin): {"dataset": NAME, "params": {config keys}, "jobs": [{"seed": S, "size": N}, ...],
"max_metadata_chars": M}. For each job, in order, the dataset is created with that seed and size and its N entries
are written as JSON Lines {"job": j, "question": ..., "answer": ..., "metadata": {...}}: the answer as the dataset
gives it when it is a JSON scalar (else its str()), the metadata only when it is a JSON object of at most M
characters. The last line is {"done": true, "version": V} (the installed reasoning-gym version).
A failure is one line {"error": KIND, "message": ...} and exit code 3, KIND one of "unknown_dataset" (with "names",
every registered dataset), "bad_params" (with "accepted", the dataset's config keys) and "generation_failed".
"""

import dataclasses
import json
import sys
from importlib.metadata import version
from typing import Any

EXIT_ERROR = 3


def _emit(doc: dict) -> None:
    sys.stdout.write(json.dumps(doc, ensure_ascii=False) + "\n")


def _fail(kind: str, message: str, **extra: Any) -> None:
    _emit({"error": kind, "message": message, **extra})
    sys.stdout.flush()
    sys.exit(EXIT_ERROR)


def _answer(value: Any) -> Any:
    return value if value is None or isinstance(value, str | int | float | bool) else str(value)


def _metadata(value: Any, limit: int) -> dict | None:
    if not isinstance(value, dict):
        return None
    try:
        text = json.dumps(value, ensure_ascii=False, allow_nan=False)
    except (TypeError, ValueError):
        return None
    return value if len(text) <= limit else None


def main() -> None:
    request = json.loads(sys.stdin.read())
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    name, params = request["dataset"], request.get("params", {})
    limit = int(request.get("max_metadata_chars", 0))
    if name not in DATASETS:
        _fail("unknown_dataset", f"no reasoning-gym dataset named {name!r}", names=sorted(DATASETS))
    accepted = sorted(f.name for f in dataclasses.fields(DATASETS[name][1]) if f.name not in ("seed", "size"))
    for index, job in enumerate(request["jobs"]):
        try:
            dataset = reasoning_gym.create_dataset(name, seed=int(job["seed"]), size=int(job["size"]), **params)
        except Exception as err:  # noqa: BLE001 - any config error (TypeError, AssertionError, ValueError) is reported
            _fail("bad_params", f"{type(err).__name__}: {err}", accepted=accepted)
        for i in range(int(job["size"])):
            try:
                entry = dataset[i]
                row = {"job": index, "question": entry["question"], "answer": _answer(entry["answer"])}
            except Exception as err:  # noqa: BLE001 - reported with the entry that failed
                _fail("generation_failed", f"entry {i} of seed {job['seed']}: {type(err).__name__}: {err}")
            meta = _metadata(entry.get("metadata"), limit)
            if meta is not None:
                row["metadata"] = meta
            _emit(row)
    _emit({"done": True, "version": version("reasoning-gym")})
    sys.stdout.flush()


if __name__ == "__main__":
    main()
