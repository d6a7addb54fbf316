"""The pipeline's `finalize` step (under `dsl.ExitHandler`): end the run whatever happened to it.

    python -m asyncrl.cluster.finalize --run-url s3://B/P/RUN --status Succeeded

1. writes the run's `done` marker (if absent), so every long-lived role exits by itself and frees its GPUs;
2. records `final_status.json` (the pipeline's status, the last committed checkpoint version, the time);
3. with MLflow tracking: registers the last committed checkpoint as a new version of the registered model
   `<experiment>-<config name>` (source: its S3 folder) and ends the MLflow run as FINISHED or FAILED.
Idempotent: a retried finalize finds the marker, rewrites the status and registers nothing twice.

A resumed run (the pipeline parameter `resume_run_id`, see `asyncrl.cluster.resume`): the exit task cannot read the
setup task's output (KFP forbids an exit task any upstream task), so it gets the run id from the parameter and
`--kfp-run-id`, the pipeline run it ends; it finalizes the run only if that pipeline run is the one that resumed it
last (`resumes.json` `current`, written by setup once every resume check passed). Otherwise (the resume was
refused, or setup never got that far, or a later pipeline run resumed it since) the run is left exactly as it is.
A resumed run's last checkpoint is registered as a new model version (one per checkpoint source).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from typing import Any

from asyncrl.cluster.resume import SUCCEEDED, current_attempt
from asyncrl.config.load import config_from_json
from asyncrl.storage.run_layout import RunPaths, parse_run_url, run_url
from asyncrl.storage.s3 import ObjectExists, S3Store

log = logging.getLogger(__name__)


def owns_run(store: S3Store, paths: RunPaths, kfp_run_id: str) -> bool:
    """True when pipeline run `kfp_run_id` may end run `paths.run_id`: it is that run (a new run), or the run's
    last resume was made by it."""
    return kfp_run_id == paths.run_id or current_attempt(store, paths) == kfp_run_id


def finalize(store: S3Store, paths: RunPaths, status: str) -> dict[str, Any]:
    """Mark the run done, record its final status, register its model; returns the recorded status document."""
    from asyncrl.storage.checkpoints import latest_committed_version  # imports torch: only when finalizing

    with contextlib.suppress(ObjectExists):  # the trainer (or an earlier finalize) may have ended the run already
        store.put_json(paths.done(), {"time": time.time(), "by": "finalize"}, if_absent=True)
    version = latest_committed_version(store, paths)
    doc: dict[str, Any] = {"status": status, "final_version": version, "time": time.time()}
    raw = store.get_bytes(paths.config())
    tracking = store.get_json(paths.tracking())
    if raw is not None and isinstance(tracking, dict) and tracking.get("mlflow_run_id"):
        cfg = config_from_json(raw.decode(), paths.config())
        doc["registered_model"] = _register(tracking, cfg.tracking.experiment, cfg.name, store.bucket, paths,
                                            version, status)
    store.put_json(paths.file("final_status.json"), doc)
    return doc


def _register(tracking: dict[str, Any], experiment: str, name: str, bucket: str, paths: RunPaths,
              version: int | None, status: str) -> dict[str, Any] | None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    client = MlflowClient(tracking_uri=tracking["tracking_uri"])
    run_id = tracking["mlflow_run_id"]
    registered = None
    if version is not None:
        model = f"{experiment}-{name}"
        source = f"s3://{bucket}/{paths.checkpoint_prefix(version).rstrip('/')}"
        with contextlib.suppress(MlflowException):  # it exists: add a version
            client.create_registered_model(model)
        existing = [v for v in client.search_model_versions(f"name='{model}'")
                    if v.run_id == run_id and v.source == source]  # a resumed run registers its new final one
        mv = existing[0] if existing else client.create_model_version(model, source, run_id=run_id)
        registered = {"name": model, "version": str(mv.version), "source": source}
    client.set_terminated(run_id, status="FINISHED" if status in SUCCEEDED else "FAILED")
    return registered


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.finalize", description=__doc__.splitlines()[0])
    p.add_argument("--run-url", required=True)
    p.add_argument("--status", default="Unknown", help="the pipeline's final status (KFP PipelineTaskFinalStatus)")
    p.add_argument("--kfp-run-id", default="", help="the pipeline run ending now; when it differs from the run id "
                   "of --run-url (a resume), the run is finalized only if this pipeline run resumed it")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s finalize %(name)s: %(message)s")
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        raise SystemExit("finalize: AWS_ENDPOINT_URL is not set: expected the S3 endpoint")
    bucket, prefix, run_id = parse_run_url(args.run_url)
    store = S3Store(endpoint, bucket, timeout_s=30.0)
    paths = RunPaths(prefix, run_id)
    if args.kfp_run_id and not owns_run(store, paths, args.kfp_run_id):
        log.info("run %s was not resumed by pipeline run %s (the resume was refused or never made): left as it is",
                 run_id, args.kfp_run_id)
        print(json.dumps({"run_url": run_url(bucket, prefix, run_id), "finalized": False}))
        return
    doc = finalize(store, paths, args.status)
    print(json.dumps({"run_url": run_url(bucket, prefix, run_id), **doc}))


if __name__ == "__main__":
    main()
