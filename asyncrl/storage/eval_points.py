"""The run's held-out evaluation points in S3: `eval/<version:08d>.json`, one per evaluated weight version.

The first environment writer's periodic evaluation (`asyncrl.roles.periodic_eval`) writes each point once, by
conditional PUT: `{"version": v, "metrics": {"eval/accuracy": ..., ...}, "time": ...}`. The trainer's report logs
them as `eval/*` metrics at their step (`unseen_points`); the run summary (`eval_accuracy_before/after`, `eval_curve`)
and the choice of the checkpoint to register read them all (`eval_figures`). Plain S3 reads, no MLflow, no model.
"""

from __future__ import annotations

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

EVAL_PREFIX = "eval/"


def eval_key(paths: RunPaths, version: int) -> str:
    return paths.file(f"{EVAL_PREFIX}{version:08d}.json")


def eval_figures(store: S3Store, paths: RunPaths, skip: set[int] | frozenset[int] = frozenset()
                 ) -> dict[int, dict[str, float]]:
    """{version: its point's numeric `eval/*` figures} for every point of the run not in `skip`, oldest first; a
    document that is not a point (no `metrics` object) or a key that is not `<digits>.json` is skipped."""
    out: dict[int, dict[str, float]] = {}
    for key in sorted(store.list_keys(paths.file(EVAL_PREFIX))):
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        if not name.isdigit() or int(name) in skip:
            continue
        doc = store.get_json(key)
        if not isinstance(doc, dict) or not isinstance(doc.get("metrics"), dict):
            continue
        out[int(name)] = {k: float(v) for k, v in doc["metrics"].items()
                          if isinstance(v, int | float) and not isinstance(v, bool)}
    return out


def eval_times(store: S3Store, paths: RunPaths) -> dict[int, float]:
    """{version: the wall-clock time (Unix seconds) its point was recorded} for every point of the run."""
    out: dict[int, float] = {}
    for key in sorted(store.list_keys(paths.file(EVAL_PREFIX))):
        name = key.rsplit("/", 1)[-1].removesuffix(".json")
        doc = store.get_json(key) if name.isdigit() else None
        if isinstance(doc, dict) and isinstance(doc.get("time"), int | float):
            out[int(name)] = float(doc["time"])
    return out


def unseen_points(store: S3Store, paths: RunPaths, seen: set[int]) -> list[tuple[dict[str, float], int]]:
    """The points not in `seen` (added to it), as (metrics, version), oldest first: each is handed on once."""
    out = [(metrics, version) for version, metrics in eval_figures(store, paths, seen).items()]
    seen.update(version for _, version in out)
    return out


def eval_summary(store: S3Store, paths: RunPaths, final_version: int) -> dict[str, object]:
    """The run summary's evaluation figures: accuracy at the warm start (version 0) and at `final_version` (None
    where that point is missing: evaluation off, or the final point did not land), and the whole curve."""
    figures = eval_figures(store, paths)
    curve = {v: f["eval/accuracy"] for v, f in figures.items() if "eval/accuracy" in f}
    return {"eval_accuracy_before": curve.get(0), "eval_accuracy_after": curve.get(final_version),
            "eval_curve": {str(v): a for v, a in curve.items()}}
