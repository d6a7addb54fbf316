"""The other roles' own figures, read from their heartbeats, named by role for MLflow.

Every role's heartbeat (`asyncrl.roles.liveness`) carries its own metrics; the trainer logs them each step as
`<role>/<id>/<name>` (e.g. `generation/0/tokens_generated`, `reward/0/scored`), so every metric in a run names the
role and instance that produced it and runs compare cleanly in the MLflow UI. Every role's system figures (CPU
cores, memory, GPU: `asyncrl.roles.system_metrics`) are logged as `system/<role>/<id>/<name>`. The training role's own metrics are
its step's figures (`train/`, `reward/mean`, `staleness/`, ...), logged as they are.
"""

from __future__ import annotations

import math
from typing import Any

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store


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


def read_role_metrics(store: S3Store, paths: RunPaths) -> dict[str, float]:
    """Every role's latest heartbeat metrics (one LIST and one GET per role instance)."""
    keys = [k for k in store.list_keys(paths.heartbeats_prefix()) if k.endswith(".json")]
    return heartbeat_metrics([store.get_json(k) for k in sorted(keys)])
