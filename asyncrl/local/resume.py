"""Resuming a run after a crash: `asyncrl run --resume RUN_ID`.

A run folder keeps everything a resume needs: `runs/<run_id>/config.json` (the resolved configuration, written at
launch) and the S3 data (embedded: `runs/<run_id>/s3/`, which SeaweedFS persists). Resuming:
1. refuses a run that is done, one whose S3 data is gone, or whose stored configuration differs;
2. deletes the crashed attempt's heartbeats (a "failed" one would stop the new roles at once), withdraws its
   rendezvous addresses (a document without host and port, its epoch kept: peers wait for the new ones), and
   rewinds the run's control document `versions/latest.json` to the newest committed checkpoint (its version,
   per-writer consumption cursors and counters) before any role starts, so no role ever follows a version that
   the crash lost; with no checkpoint, to version 0 with empty cursors;
3. then the roles start as in a fresh run: the trainer loads that checkpoint (model, optimizer, critics, cursors,
   counters) and reads groups from exactly those cursors on, so a group consumed in a lost step is read again and
   trained on once in the run's surviving history, and no group written before the crash is skipped; each
   environment writer counts the groups it had written toward its α bound and counts the ones it had in flight
   as lost (`rollout/lost_at_restart_groups`).
The MLflow run is the same (re-attached from `tracking.json`); steps after the checkpoint are logged again.
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig, config_from_json
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

LOCAL_CONFIG = "config.json"


class ResumeError(RuntimeError):
    pass


def load_run_config(runs_dir: Path | str, run_id: str) -> RunConfig:
    """The configuration a run was launched with, from its folder; ResumeError naming what is missing."""
    path = Path(runs_dir) / run_id / LOCAL_CONFIG
    if not path.is_file():
        raise ResumeError(f"--resume {run_id}: {path} does not exist: expected the folder of a run started by "
                          f"`asyncrl run` under runs_dir={runs_dir}")
    return config_from_json(path.read_text(), str(path))


@dataclass(frozen=True)
class ResumePoint:
    version: int  # the committed checkpoint the trainer resumes from (0: none)
    lost_steps: int  # steps published before the crash but not checkpointed (trained again)
    cursors: dict[str, int]


def check_config_stored(store: S3Store, paths: RunPaths, run_id: str) -> dict[str, Any]:
    """The run's stored configuration document; ResumeError when its S3 data is gone."""
    stored = store.get_json(paths.config())
    if not isinstance(stored, dict):
        raise ResumeError(f"run {run_id}: {paths.config()} is missing from the object store: its S3 data is gone")
    return stored


def prepare_resume(store: S3Store, paths: RunPaths, cfg: RunConfig) -> ResumePoint:
    """Check the run can resume and rewind `versions/latest.json` to its newest committed checkpoint."""
    if store.exists(paths.done()):
        raise ResumeError(f"run {cfg.run_id} is already done ({paths.done()} exists): nothing to resume")
    stored = check_config_stored(store, paths, cfg.run_id)
    try:  # parsed, so fields a newer asyncrl added (at their defaults) do not count as differences
        stored = RunConfig.model_validate(stored).model_dump(mode="json")
    except ValueError as err:
        raise ResumeError(f"run {cfg.run_id}: {paths.config()} no longer parses: {err}") from None
    if stored != cfg.model_dump(mode="json"):
        raise ResumeError(f"run {cfg.run_id}: the configuration in the run folder differs from {paths.config()}")
    return rewind_run(store, paths, cfg.run_id)


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
