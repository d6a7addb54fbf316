"""The pipeline's `setup` step: argument parsing, then `asyncrl.run.create` (a new run) or `asyncrl.run.resume`.

    python -m asyncrl.cluster.setup --bucket B --prefix P --run-id RUN --config-yaml "..." [--set k=v ...]
        [--generation-ids-json J] [--training-processes N] [--mlflow-uri U] [--overrides-json J]
        [--resume-run-id OLD] [--run-id-output FILE] [--mlflow-link-output FILE]

The configuration follows the pipeline's one precedence rule (`asyncrl.cluster.setup_config`): the YAML text (may
be empty: the defaults) < the run form's config fields that were given (`--set`, `--model-path`, `--env-name`) <
`--overrides-json`; the replica ids, `--training-processes`, the bucket, prefix and `--mlflow-uri` are authoritative
(a configuration that contradicts one exits 2 naming the field and both values); every value applied over what the
configuration said is logged (`setup: field: config value -> new value (source)`). `run_id` is forced to the KFP
run id so every role finds it at `s3://B/P/RUN/config.json`. The run is then created by `asyncrl.run.create.create_run` (config.json once by
conditional PUT, model.json with the built-in tiny model built here and uploaded under the run when `model.path` is
empty, the MLflow run tagged with the KFP run id, the `tags` given (image tags) and the git revision the image was
built from (`ASYNCRL_GIT_REVISION`); a `MLFLOW_RUN_ID` that KFP injects is joined).
With `--resume-run-id OLD` (the pipeline parameter `resume_run_id`) no run is created: run OLD under the same
bucket/prefix is checked and rewound by `asyncrl.run.resume.resume_run` and its MLflow run re-attached, tagged
`kfp.resume_run`; the configuration given must be OLD's (only `training.steps` may grow).
The run id the roles drive (RUN, or OLD when resuming) is written to `--run-id-output` (the KFP output parameter
`run_id`, which every role task reads), and a Markdown link to its MLflow run to `--mlflow-link-output` (the KFP
output artifact `mlflow_run`, shown in the run's page).
Exits 2 with a message naming the bad field on an invalid configuration or a refused resume; nothing is written then.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from asyncrl.cluster.mlflow_link import write_mlflow_link
from asyncrl.cluster.setup_config import Authoritative, ResolvedConfig, resolve_run_config
from asyncrl.config import ConfigError, RunConfig
from asyncrl.run.create import RunExists, check_cluster_config, create_run, record_model
from asyncrl.run.resume import ResumeError, reattach_tracking, resume_run
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store

MISSING_RUN_HINT = ("expected the id of a run this pipeline started under the same bucket and prefix (the KFP run "
                    "id of its first pipeline run)")


def resolve_config(config_yaml: str, overrides: list[str], run_id: str) -> RunConfig:
    """The validated configuration of YAML text plus overrides (no pipeline parameters); ConfigError names the
    bad field."""
    return resolve_run_config(config_yaml, [], overrides, [], [], run_id).cfg


def replica_counts(generation_ids_json: str, environment_ids_json: str) -> list[tuple[str, int, str, str]]:
    """(config field, count, pipeline parameter, ids as given) for each replica list given: generation ids
    "0".."N-1" -> generation.num_servers=N; environment ids "env0".."envM-1" -> rollout.num_writers=M (the ids the
    pipeline's replicas use, so every role finds its peers)."""
    out = []
    for text, field, parameter, expected in (
            (generation_ids_json, "generation.num_servers", "generation_replica_ids", "{i}"),
            (environment_ids_json, "rollout.num_writers", "environment_replica_ids", "env{i}")):
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
        out.append((field, len(ids), parameter, text))
    return out


def role_count_overrides(generation_ids_json: str, environment_ids_json: str) -> list[str]:
    """The replica counts as `field=N` overrides."""
    return [f"{field}={n}" for field, n, _, _ in replica_counts(generation_ids_json, environment_ids_json)]


def authoritative_parameters(args: argparse.Namespace) -> list[Authoritative]:
    """The config fields the pipeline's parameters decide (they shape the pods or say where the run lives)."""
    out = [Authoritative(field, n, parameter, text)
           for field, n, parameter, text in replica_counts(args.generation_ids_json, args.environment_ids_json)]
    if args.training_processes is not None:
        out.append(Authoritative("training.num_processes", args.training_processes, "training_gpus",
                                 str(args.training_processes)))
    out += [Authoritative("storage.bucket", args.bucket, "s3_bucket", args.bucket),
            Authoritative("storage.prefix", args.prefix, "s3_prefix", args.prefix)]
    if args.mlflow_uri is not None:
        out.append(Authoritative("tracking.tracking_uri", args.mlflow_uri, "mlflow_uri", args.mlflow_uri))
    return out


def form_assignments(args: argparse.Namespace) -> list[str]:
    """The run form's config fields that were given, as `section.key=value` (model path and environment first)."""
    out = [f"model.path={args.model_path}"] if args.model_path else []
    out += [f"env.name={args.env_name}"] if args.env_name else []
    return [*out, *args.overrides]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.setup", description=__doc__.splitlines()[0])
    p.add_argument("--bucket", required=True)
    p.add_argument("--prefix", default="runs")
    p.add_argument("--run-id", required=True, help="the KFP run id")
    p.add_argument("--config-yaml", default="", help="the run configuration as YAML text (empty: defaults)")
    p.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                   help="a config field of the run form (only those given); before --overrides-json")
    p.add_argument("--tag", action="append", default=[], metavar="KEY=VALUE", help="MLflow tag; repeatable")
    p.add_argument("--model-path", default="", help="model folder or S3 URI (empty: the config's)")
    p.add_argument("--env-name", default="", help="an agentic environment (empty: the config's task)")
    p.add_argument("--generation-ids-json", default="", help="the generation role ids as a JSON list: sets "
                   "generation.num_servers")
    p.add_argument("--environment-ids-json", default="", help="the environment role ids as a JSON list: sets "
                   "rollout.num_writers")
    p.add_argument("--training-processes", type=int, default=None, help="training_gpus: sets "
                   "training.num_processes (authoritative)")
    p.add_argument("--mlflow-uri", default=None, help="mlflow_uri: sets tracking.tracking_uri (authoritative)")
    p.add_argument("--mlflow-link-output", default="", help="file to write a Markdown link to the MLflow run to "
                   "(the KFP output artifact mlflow_run)")
    p.add_argument("--overrides-json", default="[]", help="more overrides as a JSON list (a KFP list parameter)")
    p.add_argument("--tags-json", default="[]", help="more tags as a JSON list of KEY=VALUE")
    p.add_argument("--resume-run-id", default="", help="resume this run instead of creating one (empty: a new run "
                   "under the KFP run id)")
    p.add_argument("--run-id-output", default="", help="file to write the run id the roles drive to (the KFP "
                   "output parameter run_id)")
    return p.parse_args(argv)


def _json_strings(text: str, flag: str) -> list[str]:
    try:
        items = json.loads(text)
    except json.JSONDecodeError as err:
        raise SystemExit(f"setup: {flag}: expected a JSON list of strings: {err}") from err
    if not isinstance(items, list) or not all(isinstance(x, str) for x in items):
        raise SystemExit(f"setup: {flag}: expected a JSON list of strings, got {text[:200]!r}")
    return items


def configuration(args: argparse.Namespace, endpoint: str, run_id: str) -> ResolvedConfig:
    """The run's configuration from setup's arguments, by the one precedence rule; ConfigError names the field."""
    return resolve_run_config(args.config_yaml, form_assignments(args), _json_strings(args.overrides_json,
                              "--overrides-json"), authoritative_parameters(args),
                              [f"storage.endpoint_url={endpoint}"], run_id)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        raise SystemExit("setup: AWS_ENDPOINT_URL is not set: expected the S3 endpoint (from the asyncrl-s3 secret)")
    extra_tags = _json_strings(args.tags_json, "--tags-json")
    run_id = args.resume_run_id or args.run_id
    try:
        RunPaths(args.prefix, run_id)
    except ValueError as err:
        print(f"setup: {'--resume-run-id' if args.resume_run_id else '--run-id'}: {err}", file=sys.stderr)
        sys.exit(2)
    try:
        resolved = configuration(args, endpoint, run_id)
        cfg = resolved.cfg
        check_cluster_config(cfg)
    except ConfigError as err:
        print(f"setup: {err}", file=sys.stderr)
        sys.exit(2)
    for line in resolved.changes:  # every value that differs from what the configuration said, and why
        print(f"setup: {line}", file=sys.stderr)
    store = S3Store(endpoint, cfg.storage.bucket, region=cfg.storage.region, timeout_s=30.0)
    paths = RunPaths(cfg.storage.prefix, cfg.run_id)
    url = run_url(cfg.storage.bucket, cfg.storage.prefix, cfg.run_id)
    tags = dict(t.split("=", 1) for t in [*args.tag, *extra_tags] if "=" in t)
    if os.environ.get("ASYNCRL_GIT_REVISION"):  # baked into the images by `make images`
        tags.setdefault("git.revision", os.environ["ASYNCRL_GIT_REVISION"])
    summary: dict[str, Any] = {"run_id": cfg.run_id, "run_url": url}
    if args.resume_run_id:
        try:
            resumed = resume_run(store, paths, cfg, asked_as="resume_run_id", missing_hint=MISSING_RUN_HINT,
                                 attempt=args.run_id, tags=tags)
        except ResumeError as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary["model"] = record_model(store, paths, resumed.cfg)["path"]  # a run from before model.json gets one
        tracker = reattach_tracking(store, paths, resumed, {"kfp.resume_run": args.run_id})
        summary.update(resumed_from=resumed.point.version, lost_steps=resumed.point.lost_steps)
    else:
        try:
            created = create_run(store, paths, cfg, tracking_uri=cfg.tracking.tracking_uri, mode="cluster",
                                 tags={"kfp.run_id": cfg.run_id, **tags},
                                 join_run_id=os.environ.get("MLFLOW_RUN_ID", ""))
        except RunExists as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary.update(model=created.model["path"], written=created.written)
        tracker = created.tracker
    summary["mlflow_run_id"] = tracker.run_id if tracker else None
    print(json.dumps(summary))
    if args.mlflow_link_output:  # always written: KFP fails a task whose declared output artifact is missing
        write_mlflow_link(Path(args.mlflow_link_output), tracker, cfg.run_id)
    if args.run_id_output:
        Path(args.run_id_output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.run_id_output).write_text(cfg.run_id)

if __name__ == "__main__":
    main()
