"""`asyncrl pipeline compile|upload|run`: the user's commands for Kubeflow Pipelines, through the `kfp` client.

    asyncrl pipeline compile [--out pipelines/asyncrl.yaml]
    asyncrl pipeline upload --host URL [--name asyncrl] [--version V]      # a new pipeline, or a new version of it
    asyncrl pipeline run --host URL [--experiment asyncrl] [--config run.yaml] [--param k=v ...] [--set s.k=v ...]

The host is the KFP API endpoint (e.g. http://localhost:8080 after `kubectl port-forward svc/ml-pipeline-ui`).
Credentials: a bearer token from the file named by KF_PIPELINES_SA_TOKEN_PATH or the variable KFP_TOKEN (never a
command-line value, so it stays out of shell history and process lists). An unreachable host, missing or rejected
credentials, or an unknown parameter is a clear error (exit 2); nothing is uploaded or started then.
"""

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[2]
DEFAULT_YAML = REPO / "pipelines" / "asyncrl.yaml"


def compile_pipeline(out: Path = DEFAULT_YAML) -> Path:
    """Compile pipelines/asyncrl_pipeline.py to `out` (KFP IR YAML)."""
    if str(REPO) not in sys.path:
        sys.path.insert(0, str(REPO))  # pipelines/ and components/ live beside the package
    from kfp import compiler

    from pipelines.asyncrl_pipeline import asyncrl_pipeline

    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(asyncrl_pipeline, str(out))
    return out


def _fail(message: str) -> None:
    print(f"asyncrl pipeline: {message}", file=sys.stderr)
    sys.exit(2)


def _client(host: str) -> Any:
    import kfp

    token = os.environ.get("KFP_TOKEN", "")
    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "")
    if not token and path:
        if not Path(path).is_file():
            _fail(f"KF_PIPELINES_SA_TOKEN_PATH={path}: no such token file")
        token = Path(path).read_text().strip()
    try:
        client = kfp.Client(host=host, existing_token=token or None)
        client.get_kfp_healthz()
    except Exception as err:  # noqa: BLE001 - every way of not reaching the API ends in the same clear error
        text = str(err)
        if any(code in text for code in ("401", "403", "Unauthorized", "Forbidden")):
            _fail(f"the Kubeflow Pipelines API at {host} rejected the credentials: set KFP_TOKEN or "
                  f"KF_PIPELINES_SA_TOKEN_PATH to a valid token ({text.splitlines()[0][:200]})")
        _fail(f"cannot reach the Kubeflow Pipelines API at {host}: {text.splitlines()[0][:300] if text else err!r}")
    return client


def _params(args: argparse.Namespace) -> dict[str, Any]:
    """Pipeline arguments: --config (YAML text as config_yaml), --param k=v (JSON-decoded when possible), --set."""
    known = _pipeline_inputs()
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


def _pipeline_inputs() -> dict[str, str]:
    import yaml

    doc = next(yaml.safe_load_all(DEFAULT_YAML.read_text()))  # the pipeline spec; the platform spec follows
    return {k: v["parameterType"] for k, v in doc["root"]["inputDefinitions"]["parameters"].items()}


def main(args: argparse.Namespace) -> None:
    if args.action == "compile":
        out = compile_pipeline(Path(args.out))
        print(f"wrote {out}")
        return
    if not DEFAULT_YAML.is_file():
        _fail(f"{DEFAULT_YAML}: not compiled yet; run `asyncrl pipeline compile`")
    if args.action == "upload":
        client = _client(args.host)
        existing = client.get_pipeline_id(args.name)
        if existing is None:
            p = client.upload_pipeline(str(DEFAULT_YAML), pipeline_name=args.name)
            print(json.dumps({"pipeline_id": p.pipeline_id, "name": args.name, "new": True}))
        else:
            version = args.version or time.strftime("v%Y%m%d-%H%M%S", time.gmtime())
            v = client.upload_pipeline_version(str(DEFAULT_YAML), pipeline_version_name=version,
                                               pipeline_id=existing)
            print(json.dumps({"pipeline_id": existing, "version_id": v.pipeline_version_id, "new": False}))
        return
    params = _params(args)
    client = _client(args.host)
    run = client.create_run_from_pipeline_package(str(DEFAULT_YAML), arguments=params,
                                                  experiment_name=args.experiment, run_name=args.run_name or None,
                                                  enable_caching=False, service_account=args.service_account)
    print(json.dumps({"run_id": run.run_id, "experiment": args.experiment}))


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="compile, upload and run the Kubeflow pipeline")
    p.add_argument("action", choices=["compile", "upload", "run"])
    p.add_argument("--out", default=str(DEFAULT_YAML), help="compile: where to write the YAML")
    p.add_argument("--host", default=os.environ.get("KFP_HOST", "http://localhost:8080"),
                   help="the KFP API endpoint (default $KFP_HOST or http://localhost:8080)")
    p.add_argument("--name", default="asyncrl", help="upload: the pipeline's name")
    p.add_argument("--version", default="", help="upload: the new version's name (default: the time)")
    p.add_argument("--experiment", default="asyncrl", help="run: the KFP experiment")
    p.add_argument("--run-name", default="", help="run: the run's display name")
    p.add_argument("--service-account", default="asyncrl-runner", help="run: the pods' service account (manifests/)")
    p.add_argument("--config", default="", help="run: a RunConfig YAML passed as config_yaml (validated here)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="run: a pipeline parameter")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="run: a config override, passed as the `overrides` parameter")
    p.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))
