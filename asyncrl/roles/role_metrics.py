"""The other roles' own figures, read from their heartbeats, for each role instance's MLflow child run.

Every role's heartbeat (`asyncrl.roles.liveness`) carries its own metrics and its system figures (CPU, memory, GPU:
`asyncrl.roles.system_metrics`). The trainer logs each role instance's in that instance's child run
(`asyncrl.tracking.child_runs`, key `<role>-<id>`: `instance_figures`) as `<role>/<name>` (e.g.
`generation/tokens_generated`, `reward/scored`: the same names in every child of a role, so its instances compare
on one chart) and `system/<name>` (MLflow's system metric names where MLflow has one, so the child's *System
metrics* tab shows them). The training role's own metrics are its step's figures (`train/`, `reward/mean`,
`staleness/`, ...), in the job's run; its child run holds its system figures.

`heartbeat_metrics` is the same figures flat, named by role and instance (`generation/0/tokens_generated`,
`system/generation/0/cpu_cores`): what `versions/latest.json` publishes.
"""

from __future__ import annotations

import math
from typing import Any

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.child_runs import child_key


def _numbers(d: Any) -> dict[str, float]:
    if not isinstance(d, dict):
        return {}
    return {str(k): float(v) for k, v in d.items()
            if isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v)}


def heartbeat_metrics(docs: list[Any]) -> dict[str, float]:
    """Pure: `<role>/<id>/<name>` → value for every finite numeric metric of every non-training heartbeat, and
    `system/<role>/<id>/<name>` for every role's system figures (`system` of the heartbeat, the training role's
    included: MLflow shows `system/` metrics in a run's System metrics tab)."""
    out: dict[str, float] = {}
    for doc in docs:
        if not isinstance(doc, dict):
            continue
        role, role_id = doc.get("role"), doc.get("id")
        if not isinstance(role, str) or not isinstance(role_id, str):
            continue
        for name, value in _numbers(doc.get("system")).items():
            out[f"system/{role}/{role_id}/{name}"] = value
        if role == "training":
            continue
        for name, value in _numbers(doc.get("metrics")).items():
            out[f"{role}/{role_id}/{name}"] = value
    return out


def instance_figures(docs: list[Any]) -> dict[str, dict[str, float]]:
    """Pure: child run key (`generation-0`) → that instance's figures, `<role>/<name>` for every finite numeric
    metric of a non-training heartbeat and `system/<name>` for every role's system figures; a heartbeat whose role
    or id is not a valid one is left out."""
    out: dict[str, dict[str, float]] = {}
    for doc in docs:
        if not isinstance(doc, dict) or not isinstance(doc.get("role"), str) or not isinstance(doc.get("id"), str):
            continue
        role = doc["role"]
        try:
            key = child_key(role, doc["id"])
        except ValueError:
            continue
        figures = {f"system/{name}": value for name, value in _numbers(doc.get("system")).items()}
        if role != "training":
            figures.update({f"{role}/{name}": value for name, value in _numbers(doc.get("metrics")).items()})
        if figures:
            out.setdefault(key, {}).update(figures)
    return out


def read_heartbeats(store: S3Store, paths: RunPaths) -> list[Any]:
    """Every role instance's latest heartbeat document (one LIST and one GET per role instance)."""
    keys = [k for k in store.list_keys(paths.heartbeats_prefix()) if k.endswith(".json")]
    return [store.get_json(k) for k in sorted(keys)]


def read_role_metrics(store: S3Store, paths: RunPaths) -> dict[str, float]:
    """Every role's latest heartbeat metrics, flat (`heartbeat_metrics`)."""
    return heartbeat_metrics(read_heartbeats(store, paths))
