"""The run's tracking spool in S3: what MLflow could not take yet, kept in order until it can.

Under the run, `tracking/spool/<seq:012d>.json`, one JSON document per entry (never pickle), written once with a
conditional PUT, in increasing `seq`:
    {"kind": "metrics", "steps": [{"step": 3, "timestamp_ms": 1764670000000, "metrics": {"reward/mean": 0.5,
     "train/loss": "NaN"}}, ...], "time": ..., "error": "why it was spooled", "run": "generation-0"}
Metric values are numbers; NaN is the string "NaN" (S3 documents are strict JSON). `run` says which MLflow run the
steps belong to: absent (entries written before child runs) or "" for the job's run, else the key of one of its
child runs (`asyncrl.tracking.child_runs`); a replay sends each entry to its run. An entry that cannot be read
back as one of these is moved to `tracking/rejected/<seq>.json` by whoever replays the spool, never lost.

Invariants: entries are read back in `seq` order, exactly as written (metrics with their step and the wall-clock
timestamp of their submission, so that logging one again writes the very same MLflow points); `append` never
overwrites an entry (another writer's entry with the same `seq` moves it to the next one); `delete` is called only
once MLflow accepted the entry.
"""

from __future__ import annotations

import math
import re
import time
from collections.abc import Mapping, Sequence
from typing import Any

from asyncrl.storage.run_layout import SEQ_DIGITS, RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store

SPOOL = "tracking/spool/"
REJECTED = "tracking/rejected/"
METRICS = "metrics"
StepMetrics = tuple[Mapping[str, float], int, int]  # (metrics, step, timestamp in ms), as Tracker.log_steps takes


class SpoolEntryError(ValueError):
    """A spool object that is not a valid entry (its key and what is wrong)."""


def _encode_value(v: float) -> float | str:
    return "NaN" if math.isnan(v) else v


def _decode_value(key: str, name: str, v: Any) -> float:
    if v == "NaN":
        return float("nan")
    if isinstance(v, bool) or not isinstance(v, int | float):
        raise SpoolEntryError(f"{key}: metric {name!r}: expected a number or \"NaN\", got {v!r}")
    return float(v)


def metrics_entry(steps: Sequence[StepMetrics], error: str, run: str = "") -> dict[str, Any]:
    """The spool document for `steps` of run `run` ("": the job's; values must already be numbers:
    Tracker.log_steps checked them)."""
    return {"kind": METRICS, "time": time.time(), "error": error[:500], "run": run,
            "steps": [{"step": int(step), "timestamp_ms": int(ts),
                       "metrics": {k: _encode_value(float(v)) for k, v in metrics.items()}}
                      for metrics, step, ts in steps]}


def decode_run(key: str, doc: Any) -> str:
    """The run of a spool entry ("" for the job's); SpoolEntryError naming `key` when `run` is not a string."""
    run = doc.get("run", "") if isinstance(doc, dict) else ""
    if not isinstance(run, str):
        raise SpoolEntryError(f"{key}: run: expected the key of the MLflow run (a string), got {run!r}")
    return run


def decode_steps(key: str, doc: Any) -> list[StepMetrics]:
    """The steps of a `metrics` entry; SpoolEntryError naming `key` and the field when it is not one."""
    if not isinstance(doc, dict) or doc.get("kind") != METRICS or not isinstance(doc.get("steps"), list):
        raise SpoolEntryError(f"{key}: expected {{\"kind\": \"metrics\", \"steps\": [...]}}")
    out: list[StepMetrics] = []
    for i, s in enumerate(doc["steps"]):
        ok = isinstance(s, dict) and isinstance(s.get("metrics"), dict)
        if not ok or not all(isinstance(s.get(f), int) and not isinstance(s.get(f), bool)
                             for f in ("step", "timestamp_ms")):
            raise SpoolEntryError(f"{key}: steps[{i}]: expected integer 'step' and 'timestamp_ms' and a 'metrics' "
                                  "object")
        out.append(({str(k): _decode_value(key, str(k), v) for k, v in s["metrics"].items()}, s["step"],
                    s["timestamp_ms"]))
    return out


class MetricSpool:
    """One run's spool (see the module docstring)."""

    def __init__(self, store: S3Store, paths: RunPaths) -> None:
        self.store, self.paths = store, paths
        self.prefix = paths.file(SPOOL)
        self._next_seq: int | None = None
        self._key = re.compile(rf"{re.escape(self.prefix)}(\d{{{SEQ_DIGITS}}})\.json")

    def keys(self) -> list[str]:
        """The entries' keys, oldest first."""
        keys = sorted(k for k in self.store.list_keys(self.prefix) if self._key.fullmatch(k))
        if keys:  # a new entry goes after every one seen, even one replayed or moved aside since
            self._next_seq = max(self._next_seq or 0, self._seq(keys[-1]) + 1)
        return keys

    def _seq(self, key: str) -> int:
        m = self._key.fullmatch(key)
        assert m is not None, key
        return int(m.group(1))

    def append(self, doc: dict[str, Any]) -> str:
        """Write `doc` as the newest entry; its key."""
        if self._next_seq is None:
            self.keys()
            self._next_seq = self._next_seq or 0
        while True:
            key = f"{self.prefix}{self._next_seq:0{SEQ_DIGITS}d}.json"
            self._next_seq += 1
            try:
                self.store.put_json(key, doc, if_absent=True)
                return key
            except ObjectExists:
                continue

    def read(self, key: str) -> list[StepMetrics] | None:
        """The steps of the entry at `key` (None if it is gone); SpoolEntryError naming the key when it is not an
        entry."""
        entry = self.read_entry(key)
        return None if entry is None else entry[1]

    def read_entry(self, key: str) -> tuple[str, list[StepMetrics]] | None:
        """(its run, its steps) of the entry at `key` (None if it is gone); SpoolEntryError as for `read`."""
        try:
            doc = self.store.get_json(key)
        except ValueError as err:
            raise SpoolEntryError(str(err)) from err
        return None if doc is None else (decode_run(key, doc), decode_steps(key, doc))

    def delete(self, key: str) -> None:
        self.store.delete(key)

    def reject(self, key: str) -> str:
        """Move the unreadable entry at `key` to `tracking/rejected/` (bytes unchanged); the new key."""
        data = self.store.get_bytes(key)
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        moved = self.paths.file(f"{REJECTED}{name}.json")
        n = 0
        while data is not None:
            try:
                self.store.put_bytes(moved, data, if_absent=True)
                break
            except ObjectExists:  # one moved aside earlier under the same number (a later attempt of the run)
                n += 1
                moved = self.paths.file(f"{REJECTED}{name}-{n}.json")
        self.store.delete(key)
        return moved
