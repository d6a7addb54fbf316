"""A role told to stop before its run was done: the run's `stopped.json`, written once, first role wins.

Kubernetes stops a pod with SIGTERM (then SIGKILL after the pod's grace period): when a run is terminated from the
Kubeflow UI (KFP sets the Argo workflow's `activeDeadlineSeconds` to 0: every running pod is stopped, and the exit
task may never run), when a pod is evicted, or when a node drains; torchrun forwards it to the training ranks.
The role handling it (`asyncrl.roles.stop_signal`) calls `record_stop`: when the run has no `done` marker yet, it
writes `stopped.json` {role, id, signal, pid, time} by conditional PUT, so the
first role stopped is the one recorded and nothing is ever overwritten. A stop after the `done` marker is the
normal end of a run (the embedded launcher stops its serving roles that way) and records nothing.

`end_tracking_killed` ends the run's MLflow run and its child runs as KILLED (the training role calls it when stopped before the run
was done: the exit task may never run). `finalize` reads the record (`asyncrl.run.documents.run_outcome`: a stop before the end, without a trainer failure, is a
cancel → MLflow KILLED) and `resume` moves it into the attempt's record and deletes it, so that a resumed run
starts with none.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

from asyncrl.run.documents import OUTCOMES, STOPPED
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store

log = logging.getLogger(__name__)


def record_stop(store: S3Store, paths: RunPaths, role: str, role_id: str, signal_name: str) -> dict[str, Any] | None:
    """Record that `role`/`role_id` was stopped by `signal_name` before the run was done; returns the document
    written, or None when the run was already done or another role's stop was recorded first."""
    if store.exists(paths.done()):
        return None
    doc: dict[str, Any] = {"role": role, "id": role_id, "signal": signal_name, "pid": os.getpid(),
                           "time": time.time()}
    try:
        store.put_json(paths.file(STOPPED), doc, if_absent=True)
    except ObjectExists:
        return None
    log.info("recorded the stop of %s[%s] by %s before the run was done", role, role_id, signal_name)
    return doc


def end_tracking_killed(store: S3Store, paths: RunPaths) -> str | None:
    """End the run's MLflow run (from `tracking.json`) and its child runs (`asyncrl.tracking.child_runs`) as KILLED;
    its id, or None when the run is not tracked. The training role calls it when stopped before the run was done,
    since the pipeline's exit step may never run."""
    tracking = store.get_json(paths.tracking())
    if not isinstance(tracking, dict) or not tracking.get("mlflow_run_id"):
        return None
    # only a run that is tracked pays for MLflow's import
    from asyncrl.tracking.child_runs import end_with_children
    from asyncrl.tracking.mlflow_tracker import Tracker

    run_id = str(tracking["mlflow_run_id"])
    end_with_children(Tracker.for_run(str(tracking["tracking_uri"]), run_id), OUTCOMES["cancelled"])
    log.info("MLflow run %s ended as KILLED", run_id)
    return run_id


def read_stop(store: S3Store, paths: RunPaths) -> dict[str, Any] | None:
    """The run's `stopped.json`, or None."""
    doc = store.get_json(paths.file(STOPPED))
    return doc if isinstance(doc, dict) else None
