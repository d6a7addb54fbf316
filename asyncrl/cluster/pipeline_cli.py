"""`asyncrl pipeline compile|export|upload|run|rehearse`: the user's commands for Kubeflow Pipelines, through `kfp`.

    asyncrl pipeline compile                                   # the committed YAML (images asyncrl-*:dev)
    asyncrl pipeline export [--out-dir .]                      # pipelines/ and components/ (asyncrl.cluster.kfp_files)
    asyncrl pipeline compile --registry R [--tag T] [--out F]  # image defaults R/asyncrl-*:T (T: the git revision)
    asyncrl pipeline compile ... --pod-layout layout.yaml     # the pods' compile-time settings (pods.PodLayout)
    asyncrl pipeline upload --host URL --registry R [--tag T] [--name asyncrl] [--version V] [--namespace NS]
                              # compiles with those images, uploads version V (default git-<sha>[-dirty])
    asyncrl pipeline run --host URL [--name asyncrl] [--version V | --upload --registry R [--tag T]]
                         [--experiment asyncrl] [--namespace NS] [--config run.yaml] [--param k=v ...] [--set s.k=v]
    asyncrl pipeline rehearse [--pipeline asyncrl/cluster/pipeline/asyncrl.yaml] [--config run.yaml]
                              [--param k=v ...] [--set s.k=v ...] [--workdir D]
                              # the compiled tasks' exact commands as local processes (asyncrl.cluster.rehearsal)

The images: `make push-images REGISTRY=R [TAG=T]` pushes `R/asyncrl-<name>:T`, T defaulting to
`git rev-parse --short HEAD`, exactly what `--registry R [--tag T]` writes as the image parameters' defaults
(`asyncrl.cluster.pipeline.images`). The host is the KFP API endpoint (e.g. http://localhost:8080 after
`kubectl port-forward svc/ml-pipeline-ui`). Credentials: a bearer token from the file named by
KF_PIPELINES_SA_TOKEN_PATH or the variable KFP_TOKEN (never a command-line value). An unreachable host, missing or
rejected credentials, an unknown pipeline, version or parameter is a clear error (exit 2); nothing is uploaded or
started then. `--config` passes the YAML as `config_yaml` and nothing else: the form's config fields stay empty,
so the configuration's values stand (docs/pipeline_form.md).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.pipeline.images import (
    COMMITTED_REGISTRY,
    COMMITTED_TAG,
    RevisionError,
    git_is_dirty,
    git_short_revision,
    image_refs,
    version_name,
)

DEFAULT_YAML = COMPILED  # asyncrl/cluster/pipeline/asyncrl.yaml, compiled with the committed image flags
BUILD_DIR = Path("build")


def compile_pipeline(out: Path = DEFAULT_YAML, registry: str = COMMITTED_REGISTRY,
                     tag: str = COMMITTED_TAG, pod_layout: Path | None = None) -> Path:
    """Compile asyncrl/cluster/pipeline/definition.py to `out` (KFP IR YAML), the image parameters defaulting
    to `<registry>/asyncrl-<name>:<tag>`; with `pod_layout`, a YAML file of `asyncrl.cluster.pipeline.pods.PodLayout`
    fields (cache volume, /dev/shm size, Kueue queue and pod group)."""
    from asyncrl.cluster.kfp_files import compile_layout
    from asyncrl.cluster.pipeline import pods

    return compile_layout(out, None if pod_layout is None else pods.load_layout(pod_layout), registry, tag)


def _fail(message: str) -> None:
    print(f"asyncrl pipeline: {message}", file=sys.stderr)
    sys.exit(2)


def _images(args: argparse.Namespace) -> tuple[str, str]:
    """(registry, tag) from --registry/--tag: the tag defaults to the git revision, as `make push-images`'s."""
    registry = args.registry if args.registry is not None else COMMITTED_REGISTRY
    if args.tag:
        return registry, args.tag
    try:
        return registry, git_short_revision()
    except RevisionError as err:
        _fail(f"--tag: not given and no git revision to default to ({err}); pass the tag `make push-images` used")
    raise AssertionError  # unreachable: _fail exits


def _compile_for(args: argparse.Namespace, out: Path) -> tuple[Path, dict[str, str]]:
    registry, tag = _images(args)
    try:
        refs = image_refs(registry, tag)
    except ValueError as err:
        _fail(str(err))
    layout = Path(args.pod_layout) if getattr(args, "pod_layout", "") else None
    try:
        return compile_pipeline(out, registry, tag, layout), refs
    except ValueError as err:
        _fail(f"--pod-layout {err}")
    raise AssertionError  # unreachable: _fail exits


def _version(args: argparse.Namespace) -> str:
    if args.version:
        return args.version
    try:
        return version_name()
    except RevisionError as err:
        _fail(f"--version: not given and no git revision to name it by ({err}); pass --version")
    raise AssertionError  # unreachable


def _pipeline_inputs(path: Path = DEFAULT_YAML) -> dict[str, str]:
    import yaml

    doc = next(yaml.safe_load_all(path.read_text()))  # the pipeline spec; the platform spec follows
    return {k: v["parameterType"] for k, v in doc["root"]["inputDefinitions"]["parameters"].items()}


def _params(args: argparse.Namespace, pipeline: Path) -> dict[str, Any]:
    """Pipeline arguments: --config (YAML text as config_yaml), --param k=v (JSON-decoded when possible), --set.
    Only what is given: a form field not given stays empty, so the configuration's value stands."""
    known = _pipeline_inputs(pipeline)
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


def _describe(refs: dict[str, str], version: str) -> str:
    return f"asyncrl {version}; images: " + ", ".join(f"{k}={v}" for k, v in sorted(refs.items()))


def _upload(api: Any, args: argparse.Namespace) -> dict[str, Any]:
    """Compile with --registry/--tag into a temporary file and upload it as a version of --name."""
    from asyncrl.cluster.pipeline_api import upload_version

    version = _version(args)
    with tempfile.TemporaryDirectory(prefix="asyncrl-pipeline-") as tmp:
        package, refs = _compile_for(args, Path(tmp) / "asyncrl.yaml")
        clean = not args.version and not git_is_dirty()
        out = upload_version(api, package, args.name, version, _describe(refs, version), reuse_same=clean)
    return {**out, "name": args.name, "images": refs}


def main(args: argparse.Namespace) -> None:
    if args.action == "compile":
        committed = args.registry is None and not args.tag
        out = Path(args.out) if args.out else DEFAULT_YAML if committed and not args.pod_layout \
            else BUILD_DIR / "asyncrl.yaml"
        path, refs = (compile_pipeline(out), image_refs(COMMITTED_REGISTRY, COMMITTED_TAG)) if committed \
            and not args.pod_layout else _compile_for(args, out)
        print(json.dumps({"wrote": str(path), "images": refs}))
        return
    if args.action == "export":
        from asyncrl.cluster.kfp_files import export

        print(json.dumps({"wrote": [str(p) for p in export(Path(args.out_dir))]}))
        return
    if args.action == "rehearse":
        _rehearse(args)
        return
    from asyncrl.cluster.pipeline_api import ApiError, connect, resolve_version, start_run

    try:
        if args.action == "upload":
            print(json.dumps(_upload(connect(args.host, args.api_timeout, args.namespace), args)))
            return
        params = _params(args, DEFAULT_YAML)
        api = connect(args.host, args.api_timeout, args.namespace)
        if args.upload:
            uploaded = _upload(api, args)
            pid, vid, version = uploaded["pipeline_id"], uploaded["version_id"], uploaded["version"]
        else:
            version = _version(args)
            pid, vid = resolve_version(api, args.name, version)
        run_name = args.run_name or f"{args.name} {version} {time.strftime('%Y-%m-%d %H:%M:%S', time.gmtime())}"
        out = start_run(api, pid, vid, experiment=args.experiment, run_name=run_name, params=params,
                        service_account=args.service_account)
        print(json.dumps({**out, "name": args.name, "version": version}))
    except ApiError as err:
        _fail(str(err))


def _rehearse(args: argparse.Namespace) -> None:
    """Run the compiled pipeline's task commands locally (embedded S3); print each command and a summary."""
    from asyncrl.cluster.rehearsal import RehearsalError
    from asyncrl.cluster.rehearsal_runner import RehearsalFailed, rehearse

    path = Path(args.pipeline)
    if not path.is_file():
        _fail(f"--pipeline {path}: no such file; run `asyncrl pipeline compile`")
    params = _params(args, path)
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


def _image_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--registry", default=None, help="the registry `make push-images REGISTRY=` pushed to, e.g. "
                   "registry.example.com/team (the image defaults become <registry>/asyncrl-<name>:<tag>)")
    p.add_argument("--tag", default="", help="the images' tag (default: the git revision, `git rev-parse --short "
                   "HEAD`, as `make push-images`)")
    p.add_argument("--pod-layout", default="", help="a YAML file of the pods' compile-time settings (cache "
                   "volume, /dev/shm size, Kueue queue and pod group; README \"Sizing and scheduling\")")


def _api_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--host", default=os.environ.get("KFP_HOST", "http://localhost:8080"),
                   help="the KFP API endpoint (default $KFP_HOST or http://localhost:8080)")
    p.add_argument("--namespace", default=None, help="the Kubernetes namespace (multi-user Kubeflow; default: "
                   "the client's)")
    p.add_argument("--name", default="asyncrl", help="the pipeline's name")
    p.add_argument("--version", default="", help="the version's name (default git-<short sha>[-dirty])")
    p.add_argument("--api-timeout", type=float, default=60.0,
                   help="seconds each call to the KFP API may take (connect included)")


def _param_flags(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", default="", help="a RunConfig YAML passed as config_yaml (validated here)")
    p.add_argument("--param", action="append", default=[], metavar="NAME=VALUE", help="a pipeline parameter")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config override, passed in the `overrides` parameter (wins over every form field)")


def add_parser(sub: Any) -> None:
    p = sub.add_parser("pipeline", help="compile, export, upload, run or rehearse the Kubeflow pipeline")
    actions = p.add_subparsers(dest="action", required=True, metavar="{compile,export,upload,run,rehearse}")
    log = argparse.ArgumentParser(add_help=False)
    log.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))

    c = actions.add_parser("compile", parents=[log], help="compile the pipeline to YAML")
    _image_flags(c)
    c.add_argument("--out", default="", help=f"where to write the YAML (default {DEFAULT_YAML.name} in the "
                   f"package without --registry/--tag, else {BUILD_DIR}/asyncrl.yaml)")

    e = actions.add_parser("export", parents=[log], help="write pipelines/ (the compiled pipelines to upload) and "
                           "components/ (one component spec per step), as committed (`make kfp-files`)")
    e.add_argument("--out-dir", default=".", help="the folder to write pipelines/ and components/ in (default: .)")

    u = actions.add_parser("upload", parents=[log], help="upload a new version of the pipeline, named by the git "
                           "revision, with image defaults from --registry/--tag")
    _api_flags(u)
    _image_flags(u)

    r = actions.add_parser("run", parents=[log], help="start a run of an uploaded version (or --upload first)")
    _api_flags(r)
    _image_flags(r)
    r.add_argument("--upload", action="store_true", help="upload the version first (as `pipeline upload`)")
    r.add_argument("--experiment", default="asyncrl", help="the KFP experiment (created if missing)")
    r.add_argument("--run-name", default="", help="the run's display name (default: pipeline, version, time)")
    r.add_argument("--service-account", default="asyncrl-runner", help="the pods' service account (manifests/)")
    _param_flags(r)

    h = actions.add_parser("rehearse", parents=[log], help="run the compiled tasks' commands as local processes")
    h.add_argument("--pipeline", default=str(DEFAULT_YAML), help="the compiled pipeline YAML")
    _param_flags(h)
    h.add_argument("--workdir", default="", help="logs, S3 data, pods' folders (default rehearsals/<time>)")
    h.add_argument("--timeout", type=float, default=1800.0, help="seconds for the whole run")
    h.add_argument("--exit-grace", type=float, default=120.0,
                   help="seconds every role has to exit by itself once the run is done")
