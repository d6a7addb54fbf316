"""Ending a run, whatever happened to it: the `done` marker, the final status, the summary, the registered model,
the MLflow run's end.

`finalize` (the pipeline's exit step, `asyncrl.cluster.finalize`):
1. writes the run's `done` marker (if absent), so every long-lived role exits by itself and frees its GPUs;
2. records `final_status.json` (the pipeline's status as given, the outcome: "succeeded", "cancelled" or "failed"
   by `asyncrl.run.documents.run_outcome`, with the MLflow status it maps to and the role stop that made it a
   cancel, if any; the last committed checkpoint version, the time) and, when the trainer published a version,
   `run_summary.json` (`asyncrl.run.summary.training_summary`);
3. with MLflow tracking: logs every committed checkpoint not logged yet as an MLflow model that references its S3
   folder, and registers the best-by-eval (else the last) one as a version of `tracking.registered_model`
   (default `<experiment>-<config name>`; `asyncrl.run.checkpoint_models`, docs/models_in_mlflow.md), then ends the
   MLflow run as FINISHED, KILLED (cancelled) or FAILED, and its role instances' child runs with it
   (`asyncrl.tracking.child_runs`), after replaying the run's tracking spool (`asyncrl.tracking.spooling_log`); with
   MLflow unavailable, `final_status.json` says so (`tracking_error`, `tracking_spool_left`) and is written all the
   same.
Idempotent: a retried finalize finds the marker, rewrites the status and registers nothing twice. `owns_run` says
whether a pipeline run may end a run at all (a resumed run: only the pipeline run that resumed it last).
`finish_tracking` ends an embedded run's MLflow run and its child runs with the same status rule
(`asyncrl.run.documents`).
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import TYPE_CHECKING, Any

from asyncrl.config.load import config_from_json
from asyncrl.run.checkpoint_models import publish_models, registered_model_name
from asyncrl.run.documents import FINAL_STATUS, OUTCOMES, current_attempt, mlflow_status, run_outcome
from asyncrl.run.stop import read_stop
from asyncrl.run.summary import SUMMARY, TRACKING_DEADLINE_S, training_summary
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import ObjectExists, S3Store

if TYPE_CHECKING:
    from asyncrl.tracking.mlflow_tracker import Tracker

log = logging.getLogger(__name__)


def owns_run(store: S3Store, paths: RunPaths, kfp_run_id: str) -> bool:
    """True when pipeline run `kfp_run_id` may end run `paths.run_id`: it is that run (a new run), or the run's
    last resume was made by it."""
    return kfp_run_id == paths.run_id or current_attempt(store, paths) == kfp_run_id


def finalize(store: S3Store, paths: RunPaths, status: str) -> dict[str, Any]:
    """Mark the run done, record its final status and summary, register its model; returns the status document."""
    from asyncrl.storage.checkpoints import latest_committed_version  # imports torch: only when finalizing

    with contextlib.suppress(ObjectExists):  # the trainer (or an earlier finalize) may have ended the run already
        store.put_json(paths.done(), {"time": time.time(), "by": "finalize"}, if_absent=True)
    version = latest_committed_version(store, paths)
    stopped = read_stop(store, paths)
    trainer = store.get_json(paths.heartbeat("training", "0"))
    outcome = run_outcome(status, stopped, trainer.get("state") if isinstance(trainer, dict) else None)
    doc: dict[str, Any] = {"status": status, "outcome": outcome, "mlflow_status": OUTCOMES[outcome],
                           "final_version": version, "time": time.time()}
    if outcome == "cancelled" and stopped is not None:
        doc["stopped"] = stopped
    raw = store.get_bytes(paths.config())
    cfg = config_from_json(raw.decode(), paths.config()) if raw is not None else None
    tracking = store.get_json(paths.tracking())
    if cfg is not None and isinstance(tracking, dict) and tracking.get("mlflow_run_id"):
        registered = registered_model_name(cfg.tracking.registered_model, cfg.tracking.experiment, cfg.name)
        doc.update(_end_tracking(store, paths, tracking, registered, OUTCOMES[outcome]))
    store.put_json(paths.file(FINAL_STATUS), doc)
    latest = store.get_json(paths.versions_latest())
    if cfg is not None and isinstance(latest, dict):
        url = run_url(store.bucket, paths.prefix, paths.run_id)
        store.put_json(paths.file(SUMMARY),
                       {**training_summary(store, paths, url, cfg.training.steps, latest), "status": status,
                        "outcome": outcome})
    return doc


def _end_tracking(store: S3Store, paths: RunPaths, tracking: dict[str, Any], registered_name: str,
                  mlflow_run_status: str) -> dict[str, Any]:
    """The tracking spool replayed, the model registered, the MLflow run ended: what goes into final_status.json.
    MLflow unavailable: `tracking_error` says so and the spool stays in S3 (`tracking_spool_left` entries)."""
    from asyncrl.tracking.child_runs import end_with_children
    from asyncrl.tracking.mlflow_calls import bound_http_requests, retry_until
    from asyncrl.tracking.mlflow_tracker import Tracker
    from asyncrl.tracking.spooling_log import replay_run_spool

    bound_http_requests()
    out: dict[str, Any] = {"tracking_spool_left": replay_run_spool(store, paths, tracking, TRACKING_DEADLINE_S)["left"]}
    # the checkpoints as models referencing their S3 folders, the chosen one registered (never raises); ending the
    # run shares the same deadline (MLflow down: one more try, not another full wait)
    deadline = time.monotonic() + TRACKING_DEADLINE_S
    out.update(publish_models(store, paths, tracking, registered_name, by_reference=True,
                              deadline_s=TRACKING_DEADLINE_S))
    try:
        tracker = Tracker.for_run(str(tracking["tracking_uri"]), str(tracking["mlflow_run_id"]))
        out["children_ended"] = retry_until(lambda: end_with_children(tracker, mlflow_run_status), deadline,
                                            "MLflow: ending the run and its child runs")
    except Exception as err:  # MLflow down (or refusing) must not lose the final status
        log.warning("MLflow unavailable at the run's end (%s): MLflow run not ended", err)
        out["tracking_error"] = str(err).splitlines()[0][:500]
    return out


def finish_tracking(tracker: Tracker | None, succeeded: bool) -> None:
    """End a run's MLflow run and its child runs (embedded: the launcher's own tracker) as FINISHED or FAILED,
    retried until TRACKING_DEADLINE_S; MLflow still unavailable: a warning (the run stays RUNNING in MLflow;
    `asyncrl tracking replay --end STATUS` ends it later), never an error."""
    if tracker is None:
        return
    from asyncrl.tracking.child_runs import end_with_children
    from asyncrl.tracking.mlflow_calls import retry_until

    try:
        retry_until(lambda: end_with_children(tracker, mlflow_status(succeeded)),
                    time.monotonic() + TRACKING_DEADLINE_S, "MLflow: ending the run")
    except Exception as err:  # the run's end goes on: its status is in S3
        log.warning("MLflow run %s not ended (%s): end it later with `asyncrl tracking replay --end %s`",
                    tracker.run_id, err, mlflow_status(succeeded))
