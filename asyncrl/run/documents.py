"""The run documents that `asyncrl.run.resume` writes and `asyncrl.run.finalize` reads (and the other way round):
`resumes.json` (which pipeline run resumed the run last), `final_status.json` (how the pipeline ended it) and
`stopped.json` (the first role stopped by a signal before the run was done, `asyncrl.run.stop`); and the rule that
turns how a run ended into its outcome and its MLflow status.

The status rule (`run_outcome`), from the exit task's `PipelineTaskFinalStatus.state` (exact strings):
- a success, "SUCCEEDED" (KFP's local runner, Vertex AI), "COMPLETE" (the KFP backend on Argo: the exit handler's
  DAG execution state), "succeeded" (the embedded launcher) → "succeeded", MLflow FINISHED;
- a cancel, "CANCELED" (the KFP backend's state), "CANCELLED" (Vertex AI), "CANCELING"/"CANCELLING" (a cancel still
  under way) → "cancelled", MLflow KILLED;
- anything else ("FAILED", "RUNNING", "UNKNOWN", ...) → "cancelled" when a role was stopped by a signal before the
  run was done (`stopped.json`) and the trainer did not fail by itself (its heartbeat does not say "failed"): a run
  terminated from the Kubeflow UI reaches the exit task, if at all, as a failed or unfinished DAG; else "failed",
  MLflow FAILED.
"""

from __future__ import annotations

from typing import Any

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

RESUMES = "resumes.json"
FINAL_STATUS = "final_status.json"
STOPPED = "stopped.json"
SUCCEEDED = ("succeeded", "SUCCEEDED", "COMPLETE")
CANCELLED = ("CANCELED", "CANCELLED", "CANCELING", "CANCELLING")
OUTCOMES = {"succeeded": "FINISHED", "cancelled": "KILLED", "failed": "FAILED"}  # outcome → MLflow run status


def current_attempt(store: S3Store, paths: RunPaths) -> str | None:
    """The KFP run id that last resumed the run (resumes.json `current`), or None if it was never resumed."""
    doc = store.get_json(paths.file(RESUMES))
    return str(doc["current"]) if isinstance(doc, dict) and doc.get("current") else None


def mlflow_status(succeeded: bool) -> str:
    """The MLflow status a run ends with: FINISHED when it succeeded, FAILED otherwise."""
    return "FINISHED" if succeeded else "FAILED"


def run_outcome(state: str, stopped: dict[str, Any] | None, trainer_state: str | None) -> str:
    """"succeeded", "cancelled" or "failed" (see the module docstring): `state` is the pipeline's final state,
    `stopped` the run's `stopped.json` (None: absent), `trainer_state` the trainer's last heartbeat state."""
    if state in SUCCEEDED:
        return "succeeded"
    if state in CANCELLED:
        return "cancelled"
    if stopped is not None and trainer_state != "failed":
        return "cancelled"
    return "failed"


def ended_successfully(final_status: dict[str, Any] | None) -> bool:
    """Whether a `final_status.json` records a success (its `outcome`, else, as older runs wrote it, its status)."""
    if not isinstance(final_status, dict):
        return False
    if "outcome" in final_status:
        return final_status["outcome"] == "succeeded"
    return final_status.get("status") in SUCCEEDED
