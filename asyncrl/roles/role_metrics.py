"""The other roles' own figures, read from their heartbeats, named by role for MLflow.

Every role's heartbeat (`asyncrl.roles.liveness`) carries its own metrics; the trainer logs them each step as
`<role>/<id>/<name>` (e.g. `generation/0/tokens_generated`, `reward/0/scored`), so every metric in a run names the
role and instance that produced it and runs compare cleanly in the MLflow UI. The training role's own metrics are
its step's figures (`train/`, `reward/mean`, `staleness/`, ...), logged as they are.
"""

from __future__ import annotations

import math
from typing import Any

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store


def heartbeat_metrics(docs: list[Any]) -> dict[str, float]:
    """Pure: `<role>/<id>/<name>` → value for every finite numeric metric of every non-training heartbeat."""
    out: dict[str, float] = {}
    for doc in docs:
        if not isinstance(doc, dict) or doc.get("role") == "training":
            continue
        role, role_id, metrics = doc.get("role"), doc.get("id"), doc.get("metrics")
        if not isinstance(role, str) or not isinstance(role_id, str) or not isinstance(metrics, dict):
            continue
        for name, value in metrics.items():
            if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
                out[f"{role}/{role_id}/{name}"] = float(value)
    return out


def read_role_metrics(store: S3Store, paths: RunPaths) -> dict[str, float]:
    """Every role's latest heartbeat metrics (one LIST and one GET per role instance)."""
    keys = [k for k in store.list_keys(paths.heartbeats_prefix()) if k.endswith(".json")]
    return heartbeat_metrics([store.get_json(k) for k in sorted(keys)])
