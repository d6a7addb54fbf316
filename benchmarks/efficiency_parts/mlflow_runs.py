"""The efficiency benchmark's measurements that are not asyncrl runs (the raw vLLM engine, TRL's GRPOTrainer), as
MLflow runs of their own in the benchmark's experiment, beside its end-to-end runs, so that
`asyncrl compare --experiment efficiency` lists them together.

Each becomes one FINISHED run named `<part>-<job>-<time>`, tagged `bench.part` and `bench.job`, with the part's
numeric figures as metrics (at step 0) and its settings as parameters. Logged into the embedded store of the
benchmark's runs folder (`<runs_dir>/mlflow.db`).
"""

from __future__ import annotations

import math
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import EXPERIMENT, log


def numeric_figures(part: dict[str, Any], prefix: str = "") -> dict[str, float]:
    """The part's finite numbers (nested dicts flattened with `/`); lists and text left out."""
    out: dict[str, float] = {}
    for k, v in part.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict):
            out.update(numeric_figures(v, f"{key}/"))
        elif isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(float(v)):
            out[key] = float(v)
    return out


def log_part_run(runs_dir: Path, job: str, part_name: str, part: dict[str, Any] | None,
                 params: dict[str, Any]) -> str | None:
    """Log `part` as a run of its own; its MLflow run id (None when the part did not run or failed)."""
    if not part or "error" in part or part.get("status", "ok") != "ok":
        return None
    from asyncrl.tracking.mlflow_tracker import Tracker, embedded_tracking_uri

    name = f"{part_name}-{job}-{time.strftime('%Y%m%d-%H%M%S')}"
    tracker = Tracker.create(embedded_tracking_uri(runs_dir), EXPERIMENT, name, params=params,
                             tags={"bench.part": part_name, "bench.job": job})
    tracker.log_metrics(numeric_figures(part), step=0)
    tracker.finish("FINISHED")
    log(f"{job}: {part_name} logged as MLflow run {tracker.run_id} ({name}) in experiment {EXPERIMENT}")
    return tracker.run_id
