"""The pipeline's `setup` step: argument parsing, then `asyncrl.run.create` (a new run) or `asyncrl.run.resume`.

    python -m asyncrl.cluster.setup --bucket B --prefix P --run-id RUN --config-yaml "..." [--set k=v ...]
        [--generation-ids-json J] [--training-processes G [--training-nodes N]] [--generation-gpus T]
        [--mlflow-uri U] [--overrides-json J] [--gang-pods K] [--resume-run-id OLD] [--run-id-output FILE]
        [--mlflow-link-output FILE]

The configuration follows the pipeline's one precedence rule (`asyncrl.cluster.setup_config`): the YAML text (may
be empty: the defaults) < the run form's config fields that were given (`--set`, `--model-path`, `--env-name`) <
`--overrides-json`; the replica ids, `--training-processes` × `--training-nodes` (training.num_processes),
`--generation-gpus` (generation.tensor_parallel_size), the bucket, prefix and `--mlflow-uri` are authoritative
(a configuration that contradicts one exits 2 naming the field and both values); every value applied over what the
configuration said is logged (`setup: field: config value -> new value (source)`). `run_id` is forced to the KFP
run id so every role finds it at `s3://B/P/RUN/config.json`. The run is then created by `asyncrl.run.create.create_run` (config.json once by
conditional PUT, model.json with the built-in tiny model built here and uploaded under the run when `model.path` is
empty, a reasoning_gym or file task's rows materialised under the run's `data/` (`asyncrl.tasks.run_copy`: the
roles read that copy; exits 2 naming the field when they cannot be made), the MLflow run tagged with the KFP run id, the `tags` given (image tags) and the git revision the image was
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
from asyncrl.config import ConfigError, RunConfig, with_cache_dir_from_env
from asyncrl.run.create import RunExists, check_cluster_config, create_run, record_model
from asyncrl.run.resume import ResumeError, reattach_tracking, resume_run
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store
from asyncrl.tasks.jsonl import DatasetError

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


def training_processes(nodes: int, per_node: int | None) -> int | None:
    """N nodes x G ranks -> training.num_processes = N*G (the trainer checks its world size against it); None when
    the ranks per node are not given (one node: the configuration's value stands)."""
    if nodes < 1:
        raise SystemExit(f"setup: --training-nodes: expected at least 1 node, got {nodes}")
    if per_node is not None and per_node < 0:
        raise SystemExit(f"setup: --training-processes: expected 0 (unset) or more, got {per_node}")
    if not per_node:
        if nodes > 1:
            raise SystemExit("setup: --training-nodes > 1 needs --training-processes (GPUs per node)")
        return None
    return nodes * per_node


def check_gang_size(gang_pods: int, generation_ids_json: str, environment_ids_json: str) -> None:
    """With a Kueue pod group compiled in (`gang_pods` > 0, asyncrl/cluster/pipeline/pods.py), the run's long-lived
    pods (generation and environment replicas, training, reward) must be exactly that many: Kueue admits the group
    only when all of its pods exist, so a mismatch would wait forever. SystemExit naming both counts otherwise."""
    if gang_pods <= 0:
        return
    counts = [len(json.loads(text)) if text else 1 for text in (generation_ids_json, environment_ids_json)]
    if sum(counts) + 2 != gang_pods:
        raise SystemExit(f"setup: generation_replica_ids/environment_replica_ids: the pipeline was compiled with a "
                         f"Kueue pod group of {gang_pods} pods, but this run has {counts[0]} generation + {counts[1]} "
                         f"environment replicas + training + reward = {sum(counts) + 2}; give {gang_pods - 2} replicas "
                         f"in all, or compile with gang_pods: {sum(counts) + 2} (asyncrl pipeline compile --pod-layout)")


def authoritative_parameters(args: argparse.Namespace) -> list[Authoritative]:
    """The config fields the pipeline's parameters decide (they shape the pods or say where the run lives)."""
    out = [Authoritative(field, n, parameter, text)
           for field, n, parameter, text in replica_counts(args.generation_ids_json, args.environment_ids_json)]
    processes = training_processes(args.training_nodes, args.training_processes)
    if processes is not None:
        shown = (str(args.training_processes) if args.training_nodes == 1
                 else f"{args.training_processes} (x training_nodes = {args.training_nodes})")
        out.append(Authoritative("training.num_processes", processes, "training_gpus", shown))
    if args.generation_gpus is not None and args.generation_gpus > 0:  # one engine, tensor-parallel across them
        out.append(Authoritative("generation.tensor_parallel_size", args.generation_gpus, "generation_gpus",
                                 str(args.generation_gpus)))
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
    p.add_argument("--training-processes", "--training-processes-per-node", dest="training_processes", type=int,
                   default=None, help="training_gpus, the ranks per node: with --training-nodes, sets "
                   "training.num_processes to their product (authoritative)")
    p.add_argument("--training-nodes", type=int, default=1, help="training_nodes (default 1)")
    p.add_argument("--generation-gpus", type=int, default=None, help="generation_gpus: sets "
                   "generation.tensor_parallel_size (authoritative; 0 or unset: the configuration's)")
    p.add_argument("--gang-pods", type=int, default=0, help="the size of the Kueue pod group the pipeline was "
                   "compiled with (0: none); checked against the replicas")
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
    check_gang_size(args.gang_pods, args.generation_ids_json, args.environment_ids_json)
    try:
        resolved = configuration(args, endpoint, run_id)
        cfg = with_cache_dir_from_env(resolved.cfg, os.environ)
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
        except (RunExists, DatasetError) as err:  # DatasetError: the task's rows cannot be made here
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
