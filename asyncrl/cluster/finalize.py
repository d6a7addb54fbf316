"""The pipeline's `finalize` step (under `dsl.ExitHandler`): end the run whatever happened to it.

    python -m asyncrl.cluster.finalize --run-url s3://B/P/RUN --status Succeeded

1. writes the run's `done` marker (if absent), so every long-lived role exits by itself and frees its GPUs;
2. records `final_status.json` (the pipeline's status, the last committed checkpoint version, the time);
3. with MLflow tracking: registers the last committed checkpoint as a new version of the registered model
   `<experiment>-<config name>` (source: its S3 folder) and ends the MLflow run as FINISHED or FAILED.
Idempotent: a retried finalize finds the marker, rewrites the status and registers nothing twice.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import time
from typing import Any

from asyncrl.config.load import config_from_json
from asyncrl.transport.checkpoints import latest_committed_version
from asyncrl.transport.run_layout import RunPaths, parse_run_url, run_url
from asyncrl.transport.s3 import ObjectExists, S3Store

log = logging.getLogger(__name__)
SUCCEEDED = ("succeeded", "SUCCEEDED")


def finalize(store: S3Store, paths: RunPaths, status: str) -> dict[str, Any]:
    """Mark the run done, record its final status, register its model; returns the recorded status document."""
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
        existing = [v for v in client.search_model_versions(f"name='{model}'") if v.run_id == run_id]
        mv = existing[0] if existing else client.create_model_version(model, source, run_id=run_id)
        registered = {"name": model, "version": str(mv.version), "source": source}
    client.set_terminated(run_id, status="FINISHED" if status in SUCCEEDED else "FAILED")
    return registered


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.finalize", description=__doc__.splitlines()[0])
    p.add_argument("--run-url", required=True)
    p.add_argument("--status", default="Unknown", help="the pipeline's final status (KFP PipelineTaskFinalStatus)")
    args = p.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s finalize %(name)s: %(message)s")
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        raise SystemExit("finalize: AWS_ENDPOINT_URL is not set: expected the S3 endpoint")
    bucket, prefix, run_id = parse_run_url(args.run_url)
    store = S3Store(endpoint, bucket, timeout_s=30.0)
    doc = finalize(store, RunPaths(prefix, run_id), args.status)
    print(json.dumps({"run_url": run_url(bucket, prefix, run_id), **doc}))


if __name__ == "__main__":
    main()
