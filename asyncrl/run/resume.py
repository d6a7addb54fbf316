"""Resuming a run after a crash, for `asyncrl run --resume RUN_ID` and the pipeline parameter `resume_run_id`.

`resume_run` makes every check before anything is written (a refused resume changes nothing stored):
1. the run exists (its `config.json` under the same bucket/prefix);
2. it is not finished: a `done` marker its trainer wrote refuses the resume; one that the pipeline's `finalize`
   exit step wrote (the pipeline failed or was cancelled: it ends a run so that no role keeps its GPUs) does not,
   unless the recorded final status is a success (`asyncrl.run.documents.ended_successfully`); a cancelled run
   whose exit step never ran has no `done` marker at all;
3. the configuration given equals the stored one, field by field after both are parsed (so defaults added by a
   newer asyncrl count as equal); only `training.steps` may differ, and only grow, and only when that leaves the
   derived `training.critic_warmup_steps` unchanged (AsyPPO derives its warm-up from the step count: a different
   warm-up would retrain the critics alone in the middle of the run); `cache_dir` is the machine's (a pod's cache
   volume: ASYNCRL_CACHE_DIR) and `storage.endpoint_url` the deployment's (the S3 address the pods are given; the
   stored configuration was just read from it), so both may differ too. Every other difference is named.
Then `rewind_run`: the crashed attempt's heartbeats are deleted (a "failed" one would stop the new roles at once),
its rendezvous documents withdrawn (their epoch kept: peers wait for the new addresses), and `versions/latest.json`
rewound to the newest committed checkpoint (its version, per-writer consumption cursors and counters; version 0
with empty cursors without one) before any role starts, so no role follows a version the crash lost. The trainer
then loads that checkpoint and reads groups from exactly those cursors on: a group consumed in a lost step is
trained on again once, none written before the crash is skipped. A finalize-written `done` and
`final_status.json` are removed, and so is the `stopped.json` of a cancelled attempt (`asyncrl.run.stop`; kept in
the attempt's record as `previous_stop`), a grown `training.steps` is written to `config.json`, and a pipeline run's
attempt is recorded in `resumes.json` (`{"current": <KFP run id>, "attempts": [...]}`), which `finalize` reads to
know which pipeline run owns the run now. `reattach_tracking` sets the MLflow run (and its child runs) back to RUNNING and tags it
`asyncrl.resumed_from`; steps after the checkpoint are logged again.

An embedded run's folder keeps its configuration (`runs/<run_id>/config.json`, `load_run_config`) and its S3 data.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import ConfigError, RunConfig, config_from_json
from asyncrl.config.load import config_from_dict
from asyncrl.run.documents import FINAL_STATUS, RESUMES, STOPPED, ended_successfully
from asyncrl.run.stop import read_stop
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

if TYPE_CHECKING:
    from asyncrl.tracking.mlflow_tracker import Tracker

log = logging.getLogger(__name__)

LOCAL_CONFIG = "config.json"  # in an embedded run's folder: the configuration `asyncrl run --resume` reads
GROWABLE = "training.steps"
# Where the run is reached, not what it is: a pod's cache volume, and the S3 address the deployment gives the pods
# (a restarted or moved S3 service; the run's data is found by bucket, prefix and run id at the address given).
DEPLOYMENT_LOCAL = ("cache_dir", "storage.endpoint_url")
_ABSENT = object()


class ResumeError(RuntimeError):
    pass


def load_run_config(runs_dir: Path | str, run_id: str) -> RunConfig:
    """The configuration an embedded run was launched with, from its folder; ResumeError naming what is missing."""
    path = Path(runs_dir) / run_id / LOCAL_CONFIG
    if not path.is_file():
        raise ResumeError(f"--resume {run_id}: {path} does not exist: expected the folder of a run started by "
                          f"`asyncrl run` under runs_dir={runs_dir}")
    return config_from_json(path.read_text(), str(path))


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
    refused = [f for f in diff if f != GROWABLE and f not in DEPLOYMENT_LOCAL]
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
    if ended_successfully(final):
        raise ResumeError(f"run {run_id} is already done: its pipeline ended with status {status} "
                          f"({paths.file(FINAL_STATUS)}): nothing to resume")
    return {"done": done, "final_status": final}


@dataclass(frozen=True)
class ResumePoint:
    version: int  # the committed checkpoint the trainer resumes from (0: none)
    lost_steps: int  # steps published before the crash but not checkpointed (trained again)
    cursors: dict[str, int]


@dataclass(frozen=True)
class RunResume:
    """What `resume_run` did: the configuration the run goes on with, the checkpoint it goes on from, and the
    attempt record (written to resumes.json for a pipeline run)."""

    cfg: RunConfig
    point: ResumePoint
    record: dict[str, Any]


def resume_run(store: S3Store, paths: RunPaths, cfg: RunConfig, *, asked_as: str, missing_hint: str,
               attempt: str = "", tags: dict[str, str] | None = None) -> RunResume:
    """Check run `cfg.run_id` can go on with `cfg`, then rewind it (see the module docstring). Every check comes
    first: a ResumeError leaves everything stored as it was. `asked_as` and `missing_hint` name, in the error for a
    run that does not exist, how the caller was asked for it; `attempt`: the pipeline run resuming it (recorded in
    resumes.json; empty: an embedded resume, nothing recorded)."""
    stored = store.get_json(paths.config())
    if not isinstance(stored, dict):
        raise ResumeError(f"{asked_as} {cfg.run_id}: no such run: {paths.config()} does not exist in bucket "
                          f"{store.bucket}; {missing_hint}")
    ended = check_not_finished(store, paths, cfg.run_id)
    cfg, grew = resumable_config(stored, cfg, paths.config())
    # ---- every check passed: from here on the run is changed ----
    if grew:
        store.put_json(paths.config(), cfg.model_dump(mode="json"))
    point = rewind_run(store, paths, cfg.run_id)
    if ended is not None:
        store.delete(paths.file(FINAL_STATUS))
        store.delete(paths.done())
    stopped = read_stop(store, paths)  # the last attempt was cancelled (or a role evicted): kept in the record
    if stopped is not None:
        store.delete(paths.file(STOPPED))
    record: dict[str, Any] = {"kfp_run_id": attempt, "resumed_from": point.version,
                              "lost_steps": point.lost_steps, "cursors": point.cursors, "time": time.time(),
                              "tags": dict(tags or {}), "previous_end": ended, "previous_stop": stopped}
    if grew:
        record["training_steps"] = {"stored": stored.get("training", {}).get("steps"), "now": cfg.training.steps}
    if attempt:
        doc = store.get_json(paths.file(RESUMES))
        attempts = [a for a in (doc.get("attempts", []) if isinstance(doc, dict) else [])
                    if isinstance(a, dict) and a.get("kfp_run_id") != attempt]  # a retried setup replaces its own
        store.put_json(paths.file(RESUMES), {"current": attempt, "attempts": [*attempts, record]})
        log.info("run %s resumed by pipeline run %s from checkpoint %d", cfg.run_id, attempt, point.version)
    return RunResume(cfg, point, record)


def rewind_run(store: S3Store, paths: RunPaths, run_id: str) -> ResumePoint:
    """Reset the crashed attempt's control documents (heartbeats deleted, rendezvous withdrawn with their epoch
    kept) and rewind `versions/latest.json` to the newest committed checkpoint (version 0 without one). Call it only
    after every check passed: it changes the run."""
    from asyncrl.storage.checkpoints import (  # torch: load it late
        latest_committed_version,
        load_checkpoint_meta,
    )

    for key in store.list_keys(paths.heartbeats_prefix()):  # the crashed attempt's last words ("failed", or silent)
        store.delete(key)  # would stop the new attempt's roles: control documents, overwritten by design anyway
    for key in store.list_keys(paths.file("rendezvous/")):  # dead addresses: withdrawn, their epoch kept, so every
        old = store.get_json(key)  # role's next publication has a higher epoch than any address of the crashed one
        epoch = int(old.get("epoch", 0)) if isinstance(old, dict) else 0
        store.put_json(key, {"epoch": epoch, "withdrawn": "the run was resumed"})
    before: dict[str, Any] = store.get_json(paths.versions_latest()) or {}
    version = latest_committed_version(store, paths)
    meta = load_checkpoint_meta(store, paths, version) if version is not None else {}
    counters = meta.get("counters", {})
    cursors = {str(k): int(v) for k, v in meta.get("cursors", {}).items()}
    store.put_json(paths.versions_latest(), {
        "version": version or 0, "consumed": cursors, "trained": counters.get("trained_by_writer", {}),
        "counters": counters, "checksum": {}, "metrics": {}, "time": time.time(), "resumed_from": version or 0,
    })
    point = ResumePoint(version or 0, max(0, int(before.get("version", 0)) - (version or 0)), cursors)
    log.info("resuming %s from checkpoint %d (%d published steps after it are trained again); cursors %s",
             run_id, point.version, point.lost_steps, json.dumps(cursors))
    return point


def reattach_tracking(store: S3Store, paths: RunPaths, resume: RunResume,
                      tags: dict[str, Any] | None = None) -> Tracker | None:
    """Set the run's MLflow run (from tracking.json) and its child runs back to RUNNING and tag it
    `asyncrl.resumed_from` (the checkpoint version), `asyncrl.training_steps` when the step count grew (MLflow params
    never change) and the caller's `tags`; None when the run is not tracked."""
    tracking = store.get_json(paths.tracking())
    if not isinstance(tracking, dict) or not tracking.get("mlflow_run_id"):
        return None
    from asyncrl.tracking.child_runs import reopen_children
    from asyncrl.tracking.mlflow_tracker import Tracker

    tracker = Tracker.attach(tracking["tracking_uri"], str(tracking["mlflow_run_id"]))
    tracker.client.update_run(tracker.run_id, status="RUNNING")
    reopen_children(tracker.client, tracker.run_id)  # the role instances' child runs, ended with it
    all_tags: dict[str, Any] = {"asyncrl.resumed_from": resume.point.version, **(tags or {})}
    if "training_steps" in resume.record:
        all_tags["asyncrl.training_steps"] = resume.record["training_steps"]["now"]
    tracker.set_tags(all_tags)
    return tracker
