"""`asyncrl pipeline compile|upload|run|rehearse`: the user's commands for Kubeflow Pipelines, through `kfp`.

    asyncrl pipeline compile [--out asyncrl/cluster/pipeline/asyncrl.yaml] [--pod-layout layout.yaml]
    asyncrl pipeline upload --host URL [--name asyncrl] [--version V]      # a new pipeline, or a new version of it
    asyncrl pipeline run --host URL [--experiment asyncrl] [--config run.yaml] [--param k=v ...] [--set s.k=v ...]
    asyncrl pipeline rehearse [--pipeline asyncrl/cluster/pipeline/asyncrl.yaml] [--param k=v ...] [--set s.k=v ...]
                              [--workdir D]
                              # the compiled tasks' exact commands as local processes (asyncrl.cluster.rehearsal)

The host is the KFP API endpoint (e.g. http://localhost:8080 after `kubectl port-forward svc/ml-pipeline-ui`).
Credentials: a bearer token from the file named by KF_PIPELINES_SA_TOKEN_PATH or the variable KFP_TOKEN (never a
command-line value, so it stays out of shell history and process lists). An unreachable host, missing or rejected
credentials, or an unknown parameter is a clear error (exit 2); nothing is uploaded or started then.
"""

import argparse
import json
import os
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from asyncrl.cluster.pipeline import COMPILED

DEFAULT_YAML = COMPILED  # asyncrl/cluster/pipeline/asyncrl.yaml


def compile_pipeline(out: Path = DEFAULT_YAML, pod_layout: Path | None = None) -> Path:
    """Compile asyncrl/cluster/pipeline/definition.py to `out` (KFP IR YAML); with `pod_layout`, a YAML file of
    `asyncrl.cluster.pipeline.pods.PodLayout` fields (cache volume, /dev/shm size, Kueue queue and pod group)."""
    from kfp import compiler

    from asyncrl.cluster.pipeline import pods
    from asyncrl.cluster.pipeline.definition import asyncrl_pipeline

    pipeline = asyncrl_pipeline if pod_layout is None else pods.with_layout(asyncrl_pipeline,
                                                                             pods.load_layout(pod_layout))
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, str(out))
    return out


def _fail(message: str) -> None:
    print(f"asyncrl pipeline: {message}", file=sys.stderr)
    sys.exit(2)


def _with_deadline(what: str, host: str, timeout_s: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with a deadline: the kfp client has none of its own (its HTTP calls wait forever on a
    host that accepts connections but never answers, and its health check retries). The call runs in a daemon
    thread; past the deadline the command fails clearly and the thread is abandoned with the process."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            result["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = err

    worker = threading.Thread(target=target, name=f"kfp-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        _fail(f"{what}: no answer from the Kubeflow Pipelines API at {host} within {timeout_s:g}s (--api-timeout)")
    if "error" in result:
        raise result["error"]
    return result.get("value")


def _client(host: str, timeout_s: float) -> Any:
    import kfp

    token = os.environ.get("KFP_TOKEN", "")
    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "")
    if not token and path:
        if not Path(path).is_file():
            _fail(f"KF_PIPELINES_SA_TOKEN_PATH={path}: no such token file")
        token = Path(path).read_text().strip()

    def connect() -> Any:
        client = kfp.Client(host=host, existing_token=token or None)
        client.get_kfp_healthz(sleep_duration=1)
        return client

    try:
        return _with_deadline("connect", host, timeout_s, connect)
    except Exception as err:  # noqa: BLE001 - every way of not reaching the API ends in the same clear error
        text = str(err)
        if any(code in text for code in ("401", "403", "Unauthorized", "Forbidden")):
            _fail(f"the Kubeflow Pipelines API at {host} rejected the credentials: set KFP_TOKEN or "
                  f"KF_PIPELINES_SA_TOKEN_PATH to a valid token ({text.splitlines()[0][:200]})")
        _fail(f"cannot reach the Kubeflow Pipelines API at {host}: {text.splitlines()[0][:300] if text else err!r}")


def _params(args: argparse.Namespace) -> dict[str, Any]:
    """Pipeline arguments: --config (YAML text as config_yaml), --param k=v (JSON-decoded when possible), --set."""
    known = _pipeline_inputs(Path(args.pipeline) if args.action == "rehearse" else DEFAULT_YAML)
    params: dict[str, Any] = {}
    if args.config:
        path = Path(args.config)
        if not path.is_file():
            _fail(f"--config {path}: no such file")
        from asyncrl.config import ConfigError, load_config

        try:
            load_config(path, args.overrides)  # validate here: a bad config never reaches the cluster
        except ConfigError as err:
            _fail(str(err))
        params["config_yaml"] = path.read_text()
    for item in args.param:
        key, sep, value = item.partition("=")
        if not sep or key not in known:
            _fail(f"--param {item!r}: expected NAME=VALUE with NAME one of {sorted(known)}")
        try:
            params[key] = json.loads(value) if known[key] != "STRING" else value
        except json.JSONDecodeError:
            _fail(f"--param {key}: expected a {known[key].lower()} value, got {value!r}")
    if args.overrides:
        params["overrides"] = list(args.overrides)
    return params


def _pipeline_inputs(path: Path = DEFAULT_YAML) -> dict[str, str]:
    import yaml

    doc = next(yaml.safe_load_all(path.read_text()))  # the pipeline spec; the platform spec follows
    return {k: v["parameterType"] for k, v in doc["root"]["inputDefinitions"]["parameters"].items()}


def main(args: argparse.Namespace) -> None:
    if args.action == "compile":
        try:
            out = compile_pipeline(Path(args.out), Path(args.pod_layout) if args.pod_layout else None)
        except ValueError as err:
            _fail(f"--pod-layout {err}")
        print(f"wrote {out}")
        return
    if args.action == "rehearse":
        _rehearse(args)
        return
    if not DEFAULT_YAML.is_file():
        _fail(f"{DEFAULT_YAML}: not compiled yet; run `asyncrl pipeline compile`")
    host, deadline = args.host, args.api_timeout
    if args.action == "upload":
        client = _client(host, deadline)
        existing = _with_deadline("get_pipeline_id", host, deadline, client.get_pipeline_id, args.name)
        if existing is None:
            p = _with_deadline("upload_pipeline", host, deadline, client.upload_pipeline, str(DEFAULT_YAML),
                               pipeline_name=args.name)
            print(json.dumps({"pipeline_id": p.pipeline_id, "name": args.name, "new": True}))
        else:
            version = args.version or time.strftime("v%Y%m%d-%H%M%S", time.gmtime())
            v = _with_deadline("upload_pipeline_version", host, deadline, client.upload_pipeline_version,
                               str(DEFAULT_YAML), pipeline_version_name=version, pipeline_id=existing)
            print(json.dumps({"pipeline_id": existing, "version_id": v.pipeline_version_id, "new": False}))
        return
    params = _params(args)
    client = _client(host, deadline)
    run = _with_deadline("create_run", host, deadline, client.create_run_from_pipeline_package, str(DEFAULT_YAML),
                         arguments=params, experiment_name=args.experiment, run_name=args.run_name or None,
                         enable_caching=False, service_account=args.service_account)
    print(json.dumps({"run_id": run.run_id, "experiment": args.experiment}))


def _rehearse(args: argparse.Namespace) -> None:
    """Run the compiled pipeline's task commands locally (embedded S3); print each command and a summary."""
    from asyncrl.cluster.rehearsal import RehearsalError
    from asyncrl.cluster.rehearsal_runner import RehearsalFailed, rehearse

    path = Path(args.pipeline)
    if not path.is_file():
        _fail(f"--pipeline {path}: no such file; run `asyncrl pipeline compile`")
    params = _params(args)
    workdir = Path(args.workdir or time.strftime("rehearsals/%Y%m%d-%H%M%S", time.gmtime()))
    try:
        result = rehearse(path, params, workdir=workdir, timeout_s=args.timeout, exit_grace_s=args.exit_grace,
                          echo=lambda msg: print(msg, flush=True))
    except RehearsalError as err:
        _fail(str(err))
    except RehearsalFailed as err:
        print(f"asyncrl pipeline rehearse: FAILED: {err}", file=sys.stderr)
        sys.exit(1)
    print(json.dumps({"run_id": result.run_id, "run_url": result.run_url, "workdir": str(result.workdir),
                      "wall_s": round(result.wall_s, 1), "done_s": result.done_s, "exit_codes": result.exit_codes,
                      "ended_s": {k: round(v, 1) for k, v in result.ended_s.items()}}, indent=2))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="compile, upload and run the Kubeflow pipeline")
    p.add_argument("action", choices=["compile", "upload", "run", "rehearse"])
    p.add_argument("--out", default=str(DEFAULT_YAML), help="compile: where to write the YAML")
    p.add_argument("--pod-layout", default="", help="compile: a YAML file of the pods' compile-time settings "
                   "(cache volume, /dev/shm size, Kueue queue and pod group; README \"Sizing and scheduling\")")
    p.add_argument("--host", default=os.environ.get("KFP_HOST", "http://localhost:8080"),
                   help="the KFP API endpoint (default $KFP_HOST or http://localhost:8080)")
    p.add_argument("--name", default="asyncrl", help="upload: the pipeline's name")
    p.add_argument("--version", default="", help="upload: the new version's name (default: the time)")
    p.add_argument("--experiment", default="asyncrl", help="run: the KFP experiment")
    p.add_argument("--run-name", default="", help="run: the run's display name")
    p.add_argument("--service-account", default="asyncrl-runner", help="run: the pods' service account (manifests/)")
    p.add_argument("--config", default="", help="run: a RunConfig YAML passed as config_yaml (validated here)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE",
                   help="run, rehearse: a pipeline parameter")
    p.add_argument("--pipeline", default=str(DEFAULT_YAML), help="rehearse: the compiled pipeline YAML")
    p.add_argument("--workdir", default="", help="rehearse: logs, S3 data, pods' folders (default rehearsals/<time>)")
    p.add_argument("--api-timeout", type=float, default=60.0,
                   help="upload, run: seconds each call to the KFP API may take (connect included)")
    p.add_argument("--timeout", type=float, default=1800.0, help="rehearse: seconds for the whole run")
    p.add_argument("--exit-grace", type=float, default=120.0,
                   help="rehearse: seconds every role has to exit by itself once the run is done")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="run, rehearse: a config override, passed as the `overrides` parameter")
    p.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))
