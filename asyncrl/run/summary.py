"""What a finished run reports: `run_summary.json`.

`training_summary` reads it from the trainer's last `versions/latest.json` (samples trained and dropped, staleness,
throughput, where every group object went, the held-out evaluation's first and last points and its curve from
`asyncrl.storage.eval_points`); the embedded launcher adds wall times and the
servers' weight checksums, and `publish_summary` writes it to the run folder, S3 (`<run>/run_summary.json`) and
MLflow (its numbers as metrics at the final version, the document as an artifact; MLflow gets the run's tracking
spool first, and what it cannot take stays spooled: `asyncrl.tracking.spooling_log`). The pipeline's `finalize` step
writes the same training summary for a cluster run. `final_group` and `weights_in_sync` read the trainer's last
weight group: the servers that hold the final weights, and whether they match the trainer's checksum.
"""

from __future__ import annotations

import json
import logging
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from asyncrl.storage.eval_points import eval_summary
from asyncrl.storage.groups import GroupReader, GroupWriter
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.weights.buckets import checksums_match

if TYPE_CHECKING:
    from asyncrl.tracking.mlflow_tracker import Tracker

log = logging.getLogger(__name__)
SUMMARY = "run_summary.json"
TRACKING_DEADLINE_S = 60.0  # the run's end: MLflow's retries for the spool's replay and the summary


def _log_summary(store: S3Store, paths: RunPaths, summary: dict[str, Any], tracker: Tracker, deadline_s: float) -> None:
    """The summary's numbers (after the spool) and the document to MLflow; `tracking_spool_left` added to it."""
    from asyncrl.tracking.child_runs import ChildRuns
    from asyncrl.tracking.mlflow_calls import retry_until
    from asyncrl.tracking.spool import MetricSpool
    from asyncrl.tracking.spooling_log import SpoolingLog

    spool = MetricSpool(store, paths)
    numbers = {k: float(v) for k, v in summary.items() if isinstance(v, int | float) and not isinstance(v, bool)}
    SpoolingLog(ChildRuns(tracker, store, paths).send, spool, deadline_s)(  # the spool may hold child runs' steps
        [(numbers, summary["final_version"], int(time.time() * 1000))])
    summary["tracking_spool_left"] = len(spool.keys())
    try:  # MLflow just failed for a whole deadline (entries left): one try, not another deadline
        retry_until(lambda: tracker.log_dict(summary, SUMMARY),
                    time.monotonic() + (0.0 if summary["tracking_spool_left"] else deadline_s), "MLflow: summary")
    except Exception as err:  # the document is in S3 (and the run folder) all the same
        log.warning("MLflow did not take %s as an artifact (%s); it is in S3 under the run", SUMMARY, err)
    if summary["tracking_spool_left"]:
        log.warning("MLflow unavailable: %d tracking spool entr%s left in S3 under %s; `asyncrl tracking replay "
                    "--run-url %s` logs them later", summary["tracking_spool_left"],
                    "y" if summary["tracking_spool_left"] == 1 else "ies", spool.prefix, summary.get("run_url", ""))


def group_accounting(store: S3Store, paths: RunPaths, latest: dict[str, Any]) -> dict[str, int]:
    """Where every group object went: written to S3 = consumed by the trainer (trained, dropped as stale, or
    quarantined as unreadable) + left unconsumed at the end; plus the groups the writers had in flight when a crash
    stopped them."""
    counters, metrics = latest.get("counters", {}), latest.get("metrics", {})
    written = sum(GroupWriter(store, paths, w).next_seq  # the groups of each writer's stream
                  for w in GroupReader(store, paths).discover_writers())
    consumed = sum(int(v) for v in latest.get("consumed", {}).values())
    return {"groups_written": written, "groups_consumed": consumed,
            "groups_trained": int(counters.get("groups_trained", 0)),
            "groups_dropped_stale": int(counters.get("groups_dropped_stale", 0)),
            "groups_quarantined": int(counters.get("quarantined_groups", counters.get("quarantined_objects", 0))),
            "objects_quarantined": int(counters.get("quarantined_objects", 0)),
            "groups_gaps_skipped": int(counters.get("gaps_skipped", 0)),
            "groups_left_unconsumed": written - consumed,
            "groups_lost_at_restart": int(metrics.get("rollout/lost_at_restart_groups", 0))}


def training_summary(store: S3Store, paths: RunPaths, run_url: str, steps: int,
                     latest: dict[str, Any]) -> dict[str, Any]:
    """The run's summary from the trainer's last `versions/latest.json` (`latest`)."""
    counters = latest.get("counters", {})
    trained = int(counters.get("samples_trained", 0))
    # the steps' wait + train + sync summed (the bookkeeping between steps left out); the steady figures below are
    # wall-clock time from the end of the first step of each (re)start
    loop_s = float(counters.get("train_wall_s", 0.0))
    return {
        "run_id": paths.run_id,
        "run_url": run_url,
        "steps": steps,
        "final_version": int(latest.get("version", 0)),
        "samples_trained": trained,
        "response_tokens_trained": int(counters.get("tokens_trained", 0)),
        "samples_dropped_stale": int(counters.get("samples_dropped_stale", 0)),
        "staleness_mean": counters.get("staleness_sum", 0.0) / max(1, trained),
        "staleness_max": int(counters.get("staleness_max", 0)),
        "train_loop_s": loop_s,
        "samples_per_s": trained / loop_s if loop_s > 0 else 0.0,
        "steady_samples_per_s": counters.get("steady_samples", 0) / max(1e-9, counters.get("steady_wall_s", 0.0)),
        "steady_step_s": counters.get("steady_wall_s", 0.0) / max(1, counters.get("steady_steps", 0)),
        **group_accounting(store, paths, latest),
        "weight_group_epoch": int(latest.get("weight_group", {}).get("epoch", 0)),
        **eval_summary(store, paths, int(latest.get("version", 0))),
    }


def final_group(latest: dict[str, Any]) -> list[dict[str, Any]]:
    """The generation servers of the trainer's last weight group (`weight_group` of versions/latest.json), as
    rendezvous-like documents: the servers that hold the final weights. A server that restarted after the last push
    is not among them (it serves the last committed checkpoint)."""
    out = []
    for s in latest.get("weight_group", {}).get("servers", []):
        url = urlsplit(str(s["url"]))
        out.append({"id": s["id"], "host": url.hostname, "port": url.port, "epoch": s.get("epoch", 0)})
    return out


def weights_in_sync(checksums: list[dict[str, Any]], latest: dict[str, Any]) -> bool:
    """True when every server's weights (`/weights/checksum`) are the trainer's last version, checksum included."""
    return all(c.get("version") == latest.get("version") and c.get("checksum") is not None
               and checksums_match(c["checksum"], latest["checksum"]) for c in checksums)


def publish_summary(store: S3Store, paths: RunPaths, summary: dict[str, Any], tracker: Tracker | None,
                    folder: Path | None = None, tracking_deadline_s: float = TRACKING_DEADLINE_S) -> None:
    """Write `summary` to MLflow (numbers as metrics at its final version, the document as an artifact), to
    `folder/run_summary.json` when given, and to S3 (`<run>/run_summary.json`). MLflow first gets what the run's
    tracking spool still holds; whatever it does not take within `tracking_deadline_s` stays spooled (the summary's
    numbers too), the count in `tracking_spool_left` (0: MLflow has everything)."""
    if tracker is not None:
        _log_summary(store, paths, summary, tracker, tracking_deadline_s)
    if folder is not None:
        (folder / SUMMARY).write_text(json.dumps(summary, indent=2) + "\n")
    store.put_json(paths.file(SUMMARY), summary)
