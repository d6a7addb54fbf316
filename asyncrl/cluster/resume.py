"""Resuming a crashed run on the cluster: the pipeline parameter `resume_run_id` (used by `asyncrl.cluster.setup`).

A pipeline run whose `resume_run_id` names an earlier run does not create a run: its setup step checks that run
can go on and rewinds it, and every role then drives that run's S3 folder. The checks, all made before anything is
written (a refused resume changes nothing stored):
1. the run exists under the same bucket/prefix (its `config.json`);
2. its trainer has not finished it: a `done` marker the trainer wrote refuses the resume; one that the pipeline's
   `finalize` exit step wrote (the pipeline failed or was cancelled: it ends a run so that no role keeps its GPUs)
   does not, unless the recorded final status is a success;
3. the configuration given now (config YAML, the UI's fields, overrides) equals the stored one, field by field after
   both are parsed (so defaults added by a newer image count as equal); the only field that may differ is
   `training.steps`, which may grow (to continue a run) when that leaves the derived
   `training.critic_warmup_steps` unchanged (AsyPPO derives its warm-up from the step count: a different warm-up
   would retrain the critics alone in the middle of the run). Every other difference is named in the error.
Then, as `asyncrl run --resume` does (`asyncrl.local.resume.rewind_run`): the crashed attempt's heartbeats are
deleted, its rendezvous documents withdrawn (their epoch kept), `versions/latest.json` rewound to the newest
committed checkpoint (cursors, counters); the finalize-written `done` and `final_status.json` are removed; a grown
`training.steps` is written to `config.json`; the attempt is recorded in `resumes.json`
(`{"current": <KFP run id>, "attempts": [...]}`), which `finalize` reads to know that this pipeline run owns the
run now.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass
from typing import Any

from asyncrl.config import ConfigError, RunConfig
from asyncrl.config.load import config_from_dict
from asyncrl.local.resume import ResumeError, ResumePoint, rewind_run
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

RESUMES = "resumes.json"
FINAL_STATUS = "final_status.json"
GROWABLE = "training.steps"
SUCCEEDED = ("succeeded", "SUCCEEDED")
_ABSENT = object()


def flatten(doc: Any, prefix: str = "") -> dict[str, Any]:
    """Dotted leaf paths of a JSON document ({"a": {"b": 1}} -> {"a.b": 1}); lists are leaves."""
    if not isinstance(doc, dict) or (prefix and not doc):
        return {prefix: doc}
    out: dict[str, Any] = {}
    for k, v in doc.items():
        out.update(flatten(v, f"{prefix}.{k}" if prefix else str(k)))
    return out


def config_differences(stored: dict[str, Any], given: dict[str, Any]) -> list[str]:
    """Sorted dotted fields whose values differ between two configuration documents (a field in one only counts)."""
    a, b = flatten(stored), flatten(given)
    return sorted(k for k in set(a) | set(b) if a.get(k, _ABSENT) != b.get(k, _ABSENT))


def _value(doc: dict[str, Any], field: str) -> Any:
    return flatten(doc).get(field, "(absent)")


def resumable_config(stored_doc: dict[str, Any], cfg: RunConfig, source: str) -> tuple[RunConfig, bool]:
    """(the configuration the resumed run goes on with, whether `training.steps` grew); see the module docstring.
    ResumeError names every refused field with its stored and given values."""
    try:
        stored = config_from_dict(stored_doc, source)
    except ConfigError as err:
        raise ResumeError(f"run {cfg.run_id}: the stored configuration no longer parses: {err}") from None
    old, new = stored.model_dump(mode="json"), cfg.model_dump(mode="json")
    diff = config_differences(old, new)
    refused = [f for f in diff if f != GROWABLE]
    reasons = [f"{f} (stored {_value(old, f)!r}, given {_value(new, f)!r})" for f in refused]
    grew = GROWABLE in diff
    if grew and cfg.training.steps < stored.training.steps:
        reasons.append(f"training.steps (stored {stored.training.steps}, given {cfg.training.steps}: it may only grow)")
    elif grew and cfg.training.critic_warmup_steps != stored.training.critic_warmup_steps:
        reasons.append(f"training.steps (stored {stored.training.steps}, given {cfg.training.steps}: it would change "
                       f"the critics' warm-up from {stored.training.critic_warmup_steps} to "
                       f"{cfg.training.critic_warmup_steps} steps; set training.critic.warmup_steps to keep it)")
    if reasons:
        raise ResumeError(f"run {cfg.run_id}: the configuration given differs from the stored {source} in "
                          f"{len(reasons)} field(s): {'; '.join(reasons)}. A run's configuration never changes (only "
                          f"training.steps may grow): give the parameters of the run being resumed")
    return cfg, grew


def check_not_finished(store: S3Store, paths: RunPaths, run_id: str) -> dict[str, Any] | None:
    """None when the run has no `done` marker; the finalize-written marker and final status when the pipeline ended
    it without success (resumable); ResumeError when the trainer finished it or the pipeline succeeded."""
    if not store.exists(paths.done()):
        return None
    done = store.get_json(paths.done())
    if not (isinstance(done, dict) and done.get("by") == "finalize"):
        raise ResumeError(f"run {run_id} is already done: its trainer finished it ({paths.done()} exists): nothing "
                          f"to resume")
    final = store.get_json(paths.file(FINAL_STATUS))
    status = final.get("status") if isinstance(final, dict) else None
    if status in SUCCEEDED:
        raise ResumeError(f"run {run_id} is already done: its pipeline ended with status {status} "
                          f"({paths.file(FINAL_STATUS)}): nothing to resume")
    return {"done": done, "final_status": final}


@dataclass(frozen=True)
class ClusterResume:
    """What `resume_run` did: the checkpoint the run goes on from, and the attempt record written to resumes.json."""

    point: ResumePoint
    record: dict[str, Any]


def resume_run(store: S3Store, paths: RunPaths, cfg: RunConfig, kfp_run_id: str,
               tags: dict[str, str] | None = None) -> ClusterResume:
    """Check run `cfg.run_id` can go on under pipeline run `kfp_run_id`, then rewind it and record the attempt.
    Every check comes first: a ResumeError leaves everything stored as it was."""
    stored = store.get_json(paths.config())
    if not isinstance(stored, dict):
        raise ResumeError(f"resume_run_id {cfg.run_id}: no such run: {paths.config()} does not exist in bucket "
                          f"{store.bucket}; expected the id of a run this pipeline started under the same bucket and "
                          f"prefix (the KFP run id of its first pipeline run)")
    ended = check_not_finished(store, paths, cfg.run_id)
    cfg, grew = resumable_config(stored, cfg, paths.config())
    # ---- every check passed: from here on the run is changed ----
    if grew:
        store.put_json(paths.config(), cfg.model_dump(mode="json"))
    point = rewind_run(store, paths, cfg.run_id)
    if ended is not None:
        store.delete(paths.file(FINAL_STATUS))
        store.delete(paths.done())
    record: dict[str, Any] = {"kfp_run_id": kfp_run_id, "resumed_from": point.version,
                              "lost_steps": point.lost_steps, "cursors": point.cursors, "time": time.time(),
                              "tags": dict(tags or {}), "previous_end": ended}
    if grew:
        record["training_steps"] = {"stored": stored.get("training", {}).get("steps"), "now": cfg.training.steps}
    doc = store.get_json(paths.file(RESUMES))
    attempts = [a for a in (doc.get("attempts", []) if isinstance(doc, dict) else [])
                if isinstance(a, dict) and a.get("kfp_run_id") != kfp_run_id]  # a retried setup replaces its own
    store.put_json(paths.file(RESUMES), {"current": kfp_run_id, "attempts": [*attempts, record]})
    log.info("run %s resumed by pipeline run %s from checkpoint %d", cfg.run_id, kfp_run_id, point.version)
    return ClusterResume(point, record)


def current_attempt(store: S3Store, paths: RunPaths) -> str | None:
    """The KFP run id that last resumed the run (resumes.json `current`), or None if it was never resumed."""
    doc = store.get_json(paths.file(RESUMES))
    return str(doc["current"]) if isinstance(doc, dict) and doc.get("current") else None


def reattach_tracking(store: S3Store, paths: RunPaths, resume: ClusterResume) -> str | None:
    """Set the run's MLflow run (from tracking.json) back to RUNNING and tag it `asyncrl.resumed_from` (the
    checkpoint version) and `kfp.resume_run` (this pipeline run); None when the run is not tracked."""
    tracking = store.get_json(paths.tracking())
    if not isinstance(tracking, dict) or not tracking.get("mlflow_run_id"):
        return None
    from asyncrl.tracking.mlflow_tracker import Tracker

    tracker = Tracker.attach(tracking["tracking_uri"], str(tracking["mlflow_run_id"]))
    tracker.client.update_run(tracker.run_id, status="RUNNING")
    tags: dict[str, Any] = {"asyncrl.resumed_from": resume.point.version,
                            "kfp.resume_run": resume.record["kfp_run_id"]}
    if "training_steps" in resume.record:  # MLflow params never change: the grown step count is a tag
        tags["asyncrl.training_steps"] = resume.record["training_steps"]["now"]
    tracker.set_tags(tags)
    return str(tracker.run_id)
