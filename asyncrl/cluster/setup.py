"""The pipeline's `setup` step: validate the run configuration and write it to S3 under the KFP run id, or resume.

    python -m asyncrl.cluster.setup --bucket B --prefix P --run-id RUN --config-yaml "..." [--set k=v ...]
        [--resume-run-id OLD] [--run-id-output FILE]

The configuration is the YAML text (may be empty: the defaults) plus `--set` overrides, exactly as
`asyncrl run` reads it; `run_id` is forced to the KFP run id so every role finds it at
`s3://B/P/RUN/config.json`. It then records the run's model in `model.json`: `model.path` as given, or the built-in
tiny model, built here and uploaded under the run (`asyncrl.models.folder`; the roles never build one). The document is written with a conditional PUT: a retried setup step that finds the
same configuration already there succeeds, a different one is an error (a run's configuration never changes).
With a tracking URI configured, it also opens the run's MLflow run, tagged with the KFP run id, the `tags` given
(image tags) and the git revision the image was built from (`ASYNCRL_GIT_REVISION`); a `MLFLOW_RUN_ID` that KFP
injects is reused. The run is recorded in `tracking.json`.
With `--resume-run-id OLD` (the pipeline parameter `resume_run_id`) no run is created: run OLD under the same
bucket/prefix is checked and rewound to its last committed checkpoint and its MLflow run re-attached
(`asyncrl.cluster.resume`); the configuration given must be OLD's (only `training.steps` may grow).
The run id the roles drive (RUN, or OLD when resuming) is written to `--run-id-output` (the KFP output parameter
`run_id`, which every role task reads).
Exits 2 with a message naming the bad field on an invalid configuration or a refused resume; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

from asyncrl.cluster.resume import reattach_tracking, resume_run
from asyncrl.config import ConfigError, RunConfig, load_config
from asyncrl.local.resume import ResumeError
from asyncrl.models.folder import SOURCE_BUILT, SOURCE_PATH, model_document
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import ObjectExists, S3Store


def resolve_config(config_yaml: str, overrides: list[str], run_id: str) -> RunConfig:
    """The validated configuration of the run; ConfigError names the bad field."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_yaml or "{}\n")
        return load_config(path, [*overrides, f"run_id={run_id}"])


def check_tool_sandbox(cfg: RunConfig) -> None:
    """On a cluster, model-written code runs in the sandbox pool (manifests/sandbox/), never in the environment pod
    (which holds the run's S3 keys and role token, and whose default seccomp profile refuses user namespaces):
    a tool-use task that may run Python must name the pool in `env.params.sandbox_url`. ConfigError otherwise."""
    if cfg.env is None or cfg.env.name != "tool_use":
        return
    if cfg.env.params.get("allow_python", True) and not cfg.env.params.get("sandbox_url"):
        raise ConfigError(
            "env.params.sandbox_url: expected the tool sandbox service's URL for env tool_use on a cluster (for "
            "example http://asyncrl-sandbox.asyncrl-sandbox.svc.cluster.local:8080, manifests/sandbox/), or "
            "env.params.allow_python: false; tools are not run inside the environment pod")


def role_count_overrides(generation_ids_json: str, environment_ids_json: str) -> list[str]:
    """generation ids "0".."N-1" -> generation.num_servers=N; environment ids "env0".."envM-1" ->
    rollout.num_writers=M (the ids the pipeline's replicas use, so every role finds its peers)."""
    out = []
    for text, field, expected in ((generation_ids_json, "generation.num_servers", "{i}"),
                                  (environment_ids_json, "rollout.num_writers", "env{i}")):
        if not text:
            continue
        try:
            ids = json.loads(text)
        except json.JSONDecodeError as err:
            raise SystemExit(f"setup: {field}: expected the replica ids as a JSON list, got {text!r}") from err
        want = [expected.format(i=i) for i in range(len(ids) if isinstance(ids, list) else 0)]
        if not isinstance(ids, list) or not ids or [str(x) for x in ids] != want:
            raise SystemExit(f"setup: {field}: expected replica ids {want or [expected.format(i=0)]} (0 up, in "
                             f"order), got {text}")
        out.append(f"{field}={len(ids)}")
    return out


def write_config(store: S3Store, paths: RunPaths, cfg: RunConfig) -> bool:
    """Write config.json once; True if written now, False if this same configuration was already there."""
    doc = cfg.model_dump(mode="json")
    store.ensure_bucket()
    try:
        store.put_json(paths.config(), doc, if_absent=True)
        return True
    except ObjectExists:
        existing = store.get_json(paths.config())
        if existing != doc:
            raise ValueError(f"{paths.config()}: a different configuration is already stored for run "
                             f"{cfg.run_id}; a run's configuration never changes") from None
        return False


def publish_model(store: S3Store, paths: RunPaths, cfg: RunConfig) -> dict[str, Any]:
    """Record the run's model in `model.json` for the roles (a role never builds or chooses one), once: a retried or
    resumed setup keeps the document already there. `model.path` set: recorded as given (the roles fetch or check
    it). Empty: the built-in tiny model is built here (cached under `cache_dir`) and uploaded under the run
    (`<run>/model/`), and the document names that S3 folder; it is written after the last file, so a setup that dies
    mid-upload leaves no document and its retry uploads again."""
    existing = store.get_json(paths.model())
    if isinstance(existing, dict) and existing.get("path"):
        return existing
    if cfg.model.path:
        doc = model_document(cfg.model.path, SOURCE_PATH, model_path=cfg.model.path)
    else:
        from asyncrl.tiny_model.build import build_tiny_model, cache_key  # torch and the SFT build: only here

        folder = build_tiny_model(cfg)
        prefix = paths.model_prefix()
        for f in sorted(folder.iterdir()):
            if f.is_file():
                store.put_bytes(prefix + f.name, f.read_bytes())
        doc = model_document(f"s3://{store.bucket}/{prefix.rstrip('/')}", SOURCE_BUILT, build_key=cache_key(cfg))
    store.put_json(paths.model(), doc)
    return doc


def open_tracking(store: S3Store, paths: RunPaths, cfg: RunConfig, url: str, tags: dict[str, str]) -> str | None:
    """Create (or join, with MLFLOW_RUN_ID) the MLflow run and record it in tracking.json; None without a URI.
    A retried setup reuses the run tracking.json already names."""
    if not cfg.tracking.tracking_uri:
        return None
    existing = store.get_json(paths.tracking())
    if isinstance(existing, dict) and existing.get("mlflow_run_id"):  # a retried setup: the run already has one
        return str(existing["mlflow_run_id"])
    from asyncrl.tracking.mlflow_tracker import Tracker, flatten_params

    params = flatten_params(cfg.model_dump(mode="json"))
    all_tags = {"asyncrl.run_url": url, "asyncrl.mode": "cluster", **tags}
    injected = os.environ.get("MLFLOW_RUN_ID", "")
    if injected:  # KFP made the run: log into it
        tracker = Tracker.attach(cfg.tracking.tracking_uri, injected)
        tracker.log_params(params)
        for k, v in all_tags.items():
            tracker.client.set_tag(tracker.run_id, k, v)
    else:
        tracker = Tracker.create(cfg.tracking.tracking_uri, cfg.tracking.experiment, cfg.run_id, params=params,
                                 tags=all_tags)
    store.put_json(paths.tracking(), {"tracking_uri": cfg.tracking.tracking_uri, "mlflow_run_id": tracker.run_id})
    return str(tracker.run_id)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.setup", description=__doc__.splitlines()[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default="runs")
    p.add_argument("--run-id", required=True, help="the KFP run id")
    p.add_argument("--config-yaml", default="", help="the run configuration as YAML text (empty: defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="MLflow tag; repeatable")
    p.add_argument("--model-path", default="", help="model folder or S3 URI (empty: the config's)")
    p.add_argument("--env-name", default="", help="an agentic environment (empty: the config's task)")
    p.add_argument("--generation-ids-json", default="", help="the generation role ids as a JSON list: sets "
                   "generation.num_servers")
    p.add_argument("--environment-ids-json", default="", help="the environment role ids as a JSON list: sets "
                   "rollout.num_writers")
    p.add_argument("--overrides-json", default="[]", help="more overrides as a JSON list (a KFP list parameter)")
    p.add_argument("--tags-json", default="[]", help="more tags as a JSON list of KEY=VALUE")
    p.add_argument("--resume-run-id", default="", help="resume this run instead of creating one (empty: a new run "
                   "under the KFP run id)")
    p.add_argument("--run-id-output", default="", help="file to write the run id the roles drive to (the KFP "
                   "output parameter run_id)")
    args = p.parse_args(argv)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        raise SystemExit("setup: AWS_ENDPOINT_URL is not set: expected the S3 endpoint (from the asyncrl-s3 secret)")
    try:
        extra_overrides, extra_tags = json.loads(args.overrides_json), json.loads(args.tags_json)
    except json.JSONDecodeError as err:
        raise SystemExit(f"setup: --overrides-json/--tags-json: expected JSON lists of strings: {err}") from err
    if not all(isinstance(x, str) for x in [*extra_overrides, *extra_tags]):
        raise SystemExit("setup: --overrides-json/--tags-json: expected JSON lists of strings")
    overrides = [*role_count_overrides(args.generation_ids_json, args.environment_ids_json), *args.overrides]
    if args.model_path:
        overrides.append(f"model.path={args.model_path}")
    if args.env_name:
        overrides.append(f"env.name={args.env_name}")
    overrides = [*overrides, *extra_overrides, f"storage.bucket={args.bucket}", f"storage.prefix={args.prefix}",
                 f"storage.endpoint_url={endpoint}"]
    run_id = args.resume_run_id or args.run_id
    try:
        RunPaths(args.prefix, run_id)
    except ValueError as err:
        print(f"setup: {'--resume-run-id' if args.resume_run_id else '--run-id'}: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        cfg = resolve_config(args.config_yaml, overrides, run_id)
        check_tool_sandbox(cfg)
    except ConfigError as err:
        print(f"setup: {err}", file=sys.stderr)
        sys.exit(2)
    store = S3Store(endpoint, cfg.storage.bucket, region=cfg.storage.region, timeout_s=30.0)
    paths = RunPaths(cfg.storage.prefix, cfg.run_id)
    url = run_url(cfg.storage.bucket, cfg.storage.prefix, cfg.run_id)
    tags = dict(t.split("=", 1) for t in [*args.tag, *extra_tags] if "=" in t)
    if os.environ.get("ASYNCRL_GIT_REVISION"):  # baked into the images by `make images`
        tags.setdefault("git.revision", os.environ["ASYNCRL_GIT_REVISION"])
    summary: dict[str, Any] = {"run_id": cfg.run_id, "run_url": url}
    if args.resume_run_id:
        try:
            resumed = resume_run(store, paths, cfg, args.run_id, tags)
        except ResumeError as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary["model"] = publish_model(store, paths, cfg)["path"]  # a run from before model.json gets one
        summary.update(resumed_from=resumed.point.version, lost_steps=resumed.point.lost_steps,
                       mlflow_run_id=reattach_tracking(store, paths, resumed))
    else:
        try:
            written = write_config(store, paths, cfg)
        except ValueError as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary["model"] = publish_model(store, paths, cfg)["path"]
        mlflow_run = open_tracking(store, paths, cfg, url, {"kfp.run_id": cfg.run_id, **tags})
        summary.update(written=written, mlflow_run_id=mlflow_run)
    print(json.dumps(summary))
    if args.run_id_output:
        Path(args.run_id_output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.run_id_output).write_text(cfg.run_id)

if __name__ == "__main__":
    main()
