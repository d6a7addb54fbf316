"""The run documents that `asyncrl.run.resume` writes and `asyncrl.run.finalize` reads (and the other way round):
`resumes.json` (which pipeline run resumed the run last) and `final_status.json` (how the pipeline ended it)."""

from __future__ import annotations

from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

RESUMES = "resumes.json"
FINAL_STATUS = "final_status.json"
SUCCEEDED = ("succeeded", "SUCCEEDED")


def current_attempt(store: S3Store, paths: RunPaths) -> str | None:
    """The KFP run id that last resumed the run (resumes.json `current`), or None if it was never resumed."""
    doc = store.get_json(paths.file(RESUMES))
    return str(doc["current"]) if isinstance(doc, dict) and doc.get("current") else None


def mlflow_status(succeeded: bool) -> str:
    """The MLflow status a run ends with: FINISHED when it succeeded, FAILED otherwise."""
    return "FINISHED" if succeeded else "FAILED"
