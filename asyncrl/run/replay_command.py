"""`asyncrl tracking replay --run-url s3://BUCKET/PREFIX/RUN_ID [--models MODE] [--end STATUS]`: what MLflow missed.

When MLflow was still unavailable at a run's end, the metrics it did not take stay in S3 under the run
(`tracking/spool/`, `asyncrl.tracking.spool`); this command replays them, oldest first, into the MLflow run the
run's `tracking.json` names (and its role instances' child runs: each entry names its run), deleting each entry once
MLflow took it. Then, once the spool is empty, it logs the committed checkpoints that are not MLflow models yet
(`models/not_logged.json`, or a run whose end never logged them) and registers the chosen one, as a later
`finalize` does (`asyncrl.run.replay_models`): `--models auto` (default) takes the run's mode from S3
(`tracking.json`'s `mode`; cluster: by reference to the `s3://` folders, embedded: copied as artifacts, for which
the run's embedded S3 server must be running again); `reference`, `artifacts` or `skip` choose. `--end
FINISHED|FAILED|KILLED` then ends the MLflow run and its child runs (a run whose end MLflow missed stays RUNNING
there). The S3 endpoint and credentials come from the environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`), as for every role. Prints one JSON line ({"replayed": steps, "left": entries, "failures":
failed attempts, "models": the mode used, "models_logged": versions, "models_not_logged": versions,
"registered_model": `models/registered.json`, "models_error" or "models_skipped" when so}); exit status 1 when
spool entries or checkpoints not logged are left.
"""

from __future__ import annotations

import argparse
import json
import os
import time

STATUSES = ("FINISHED", "FAILED", "KILLED")
MODES = ("auto", "reference", "artifacts", "skip")  # --models: asyncrl.run.replay_models.MODES (imported lazily)


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("tracking", help="the runs' MLflow tracking: replay what MLflow missed of a run")
    actions = p.add_subparsers(dest="tracking_command", required=True)
    r = actions.add_parser("replay", help="log the metrics a run kept in S3 while MLflow was unavailable, "
                                             "and the checkpoints it did not take as models")
    r.add_argument("--run-url", required=True, help="s3://BUCKET/PREFIX/RUN_ID of the run")
    r.add_argument("--deadline-s", type=float, default=120.0,
                   help="how long MLflow calls are retried before giving up (default 120)")
    r.add_argument("--models", choices=MODES, default="auto",
                   help="log the checkpoints MLflow missed as models: by reference to their s3:// folders (cluster "
                        "runs), copied as artifacts (embedded runs), or not; auto (default): the run's mode as "
                        "recorded in S3")
    r.add_argument("--end", choices=STATUSES, default="", help="then end the MLflow run with this status")
    r.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "INFO"))


def main(args: argparse.Namespace) -> int:
    """Run `asyncrl tracking replay`; the exit status. (Imports here: building the CLI's parser imports no MLflow.)"""
    from asyncrl.run.replay_models import replay_models
    from asyncrl.storage.run_store import open_run
    from asyncrl.tracking.mlflow_calls import retry_until
    from asyncrl.tracking.spooling_log import replay_run_spool

    if args.deadline_s <= 0:
        raise ValueError(f"--deadline-s: expected a positive number of seconds, got {args.deadline_s}")
    store, paths = open_run(args.run_url)
    tracking = store.get_json(paths.tracking())
    if not isinstance(tracking, dict) or not tracking.get("mlflow_run_id"):
        raise ValueError(f"{args.run_url}/tracking.json: expected the run's MLflow tracking document "
                         "(tracking_uri, mlflow_run_id); the run is not tracked or does not exist")
    result = replay_run_spool(store, paths, tracking, args.deadline_s)
    if not result["left"]:  # MLflow took the spool: the models too (while it is down, not another full wait)
        result.update(replay_models(store, paths, tracking, args.models, args.deadline_s))
    else:
        result["models_skipped"] = "tracking spool entries left (MLflow unavailable)"
    if args.end and not result["left"]:
        from asyncrl.tracking.child_runs import end_with_children
        from asyncrl.tracking.mlflow_tracker import Tracker

        tracker = Tracker.for_run(str(tracking["tracking_uri"]), str(tracking["mlflow_run_id"]))
        retry_until(lambda: end_with_children(tracker, args.end), time.monotonic() + args.deadline_s,
                    "MLflow: ending the run")
        result["ended"] = args.end
    print(json.dumps(result))
    return 1 if result["left"] or result.get("models_not_logged") else 0
