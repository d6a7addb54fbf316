"""The pipeline's `setup` step: argument parsing, then `asyncrl.run.create` (a new run) or `asyncrl.run.resume`.

    python -m asyncrl.cluster.setup --bucket B --prefix P --run-id RUN --config-yaml "..." [--set k=v ...]
        [--training-nodes N --training-processes-per-node G] [--resume-run-id OLD] [--run-id-output FILE]

The configuration is the YAML text (may be empty: the defaults) plus `--set` overrides, exactly as
`asyncrl run` reads it; `run_id` is forced to the KFP run id so every role finds it at
`s3://B/P/RUN/config.json`. The run is then created by `asyncrl.run.create.create_run` (config.json once by
conditional PUT, model.json with the built-in tiny model built here and uploaded under the run when `model.path` is
empty, the MLflow run tagged with the KFP run id, the `tags` given (image tags) and the git revision the image was
built from (`ASYNCRL_GIT_REVISION`); a `MLFLOW_RUN_ID` that KFP injects is joined).
With `--resume-run-id OLD` (the pipeline parameter `resume_run_id`) no run is created: run OLD under the same
bucket/prefix is checked and rewound by `asyncrl.run.resume.resume_run` and its MLflow run re-attached, tagged
`kfp.resume_run`; the configuration given must be OLD's (only `training.steps` may grow).
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

from asyncrl.config import ConfigError, RunConfig, load_config, with_cache_dir_from_env
from asyncrl.run.create import RunExists, check_cluster_config, create_run, record_model
from asyncrl.run.resume import ResumeError, reattach_tracking, resume_run
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store

MISSING_RUN_HINT = ("expected the id of a run this pipeline started under the same bucket and prefix (the KFP run "
                    "id of its first pipeline run)")


def resolve_config(config_yaml: str, overrides: list[str], run_id: str) -> RunConfig:
    """The validated configuration of the run; ConfigError names the bad field."""
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "config.yaml"
        path.write_text(config_yaml or "{}\n")
        return load_config(path, [*overrides, f"run_id={run_id}"])


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


def training_processes_overrides(nodes: int, per_node: int) -> list[str]:
    """N nodes x G ranks -> training.num_processes=N*G (the trainer checks its world size against it)."""
    if nodes < 1:
        raise SystemExit(f"setup: --training-nodes: expected at least 1 node, got {nodes}")
    if per_node < 0:
        raise SystemExit(f"setup: --training-processes-per-node: expected 0 (unset) or more, got {per_node}")
    if per_node == 0:
        if nodes > 1:
            raise SystemExit("setup: --training-nodes > 1 needs --training-processes-per-node (GPUs per node)")
        return []
    return [f"training.num_processes={nodes * per_node}"]


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
    p.add_argument("--training-nodes", type=int, default=1, help="training nodes: with "
                   "--training-processes-per-node, sets training.num_processes to their product")
    p.add_argument("--training-processes-per-node", type=int, default=0, help="training ranks (GPUs) per node "
                   "(0: training.num_processes as the configuration says)")
    p.add_argument("--overrides-json", default="[]", help="more overrides as a JSON list (a KFP list parameter)")
    p.add_argument("--tags-json", default="[]", help="more tags as a JSON list of KEY=VALUE")
    p.add_argument("--resume-run-id", default="", help="resume this run instead of creating one (empty: a new run "
                   "under the KFP run id)")
    p.add_argument("--gang-pods", type=int, default=0, help="the size of the Kueue pod group the pipeline was compiled "
                   "with (0: none); checked against the replicas")
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
    overrides += training_processes_overrides(args.training_nodes, args.training_processes_per_node)
    check_gang_size(args.gang_pods, args.generation_ids_json, args.environment_ids_json)
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
        cfg = with_cache_dir_from_env(resolve_config(args.config_yaml, overrides, run_id), os.environ)
        check_cluster_config(cfg)
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
            resumed = resume_run(store, paths, cfg, asked_as="resume_run_id", missing_hint=MISSING_RUN_HINT,
                                 attempt=args.run_id, tags=tags)
        except ResumeError as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary["model"] = record_model(store, paths, resumed.cfg)["path"]  # a run from before model.json gets one
        tracker = reattach_tracking(store, paths, resumed, {"kfp.resume_run": args.run_id})
        summary.update(resumed_from=resumed.point.version, lost_steps=resumed.point.lost_steps,
                       mlflow_run_id=tracker.run_id if tracker else None)
    else:
        try:
            created = create_run(store, paths, cfg, tracking_uri=cfg.tracking.tracking_uri, mode="cluster",
                                 tags={"kfp.run_id": cfg.run_id, **tags},
                                 join_run_id=os.environ.get("MLFLOW_RUN_ID", ""))
        except RunExists as err:
            print(f"setup: {err}", file=sys.stderr)
            sys.exit(2)
        summary.update(model=created.model["path"], written=created.written,
                       mlflow_run_id=created.tracker.run_id if created.tracker else None)
    print(json.dumps(summary))
    if args.run_id_output:
        Path(args.run_id_output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.run_id_output).write_text(cfg.run_id)

if __name__ == "__main__":
    main()
