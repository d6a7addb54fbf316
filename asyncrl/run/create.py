"""Creating a run: validate its configuration, write its documents once, record its model, open its tracking.

Both the embedded launcher (`asyncrl run`) and the pipeline's `setup` step call `create_run`; the rules live here:
- `config.json` is written with a conditional PUT: a retried creation that finds the same configuration already
  there succeeds (`written` False), a different one is `RunExists` (a run's configuration never changes) and
  nothing is overwritten;
- `model.json` records the run's model for the roles (they never build or choose one): a folder this machine
  resolved (embedded: `asyncrl.tiny_model.prepare`), or, for a run whose roles run elsewhere, `model.path` as given
  or the built-in tiny model built here and uploaded under the run's `model/` (written once: a retry keeps it);
- a reasoning_gym or file task's rows are materialised into the run once (`data/train.jsonl`, `data/eval.jsonl`,
  `data/dataset.json`: `asyncrl.tasks.run_copy`), so every role reads the same rows; a retry keeps them;
- the MLflow run is created (or joined: `join_run_id`, the run KFP's MLflow integration injects as `MLFLOW_RUN_ID`:
  that is the setup task's own run, nested under KFP's run of the whole pipeline run, so the job's run is the root
  of its chain of `mlflow.parentRunId` tags, `kfp_pipeline_run`; docs/mlflow_runs.md) with the
  configuration as parameters, the tags `asyncrl.run_url`, `asyncrl.mode`, the lineage tags (git commit, config
  digest: `asyncrl.run.lineage`) plus the caller's, and the task's train and eval splits as dataset inputs; it is
  recorded in
  `tracking.json`; a retried creation reuses the run `tracking.json` names. No secret is ever a parameter or tag:
  the configuration holds none (credentials and tokens come from the environment only).
`check_cluster_config` holds what a run on a cluster needs beyond a valid configuration.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from asyncrl.config import ConfigError, RunConfig
from asyncrl.models.folder import SOURCE_BUILT, SOURCE_PATH, model_document
from asyncrl.run.lineage import lineage_tags, log_dataset_inputs
from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import ObjectExists, S3Store
from asyncrl.tasks.run_copy import record_task_data

if TYPE_CHECKING:
    from asyncrl.tracking.mlflow_tracker import Tracker


class RunExists(ValueError):
    """A different configuration is already stored under the run id."""


def check_cluster_config(cfg: RunConfig) -> None:
    """On a cluster, model-written code runs in the sandbox pool (manifests/sandbox/), never in the environment pod
    (which holds the run's S3 keys and role token, and whose default seccomp profile refuses user namespaces):
    a tool-use task that may run Python must name the pool in `env.params.sandbox_url`. A judge the run would serve
    itself (`task.judge.model_path`) has no pipeline step: name a judge server in `task.judge.url`. ConfigError
    otherwise."""
    if cfg.task.judge is not None and cfg.task.judge.model_path is not None:
        raise ConfigError(
            "task.judge.model_path: the pipeline has no judge step yet; on a cluster serve the judge yourself (any "
            "OpenAI-compatible server, e.g. vLLM's) and name it in task.judge.url")
    if cfg.env is None or cfg.env.name != "tool_use":
        return
    if cfg.env.params.get("allow_python", True) and not cfg.env.params.get("sandbox_url"):
        raise ConfigError(
            "env.params.sandbox_url: expected the tool sandbox service's URL for env tool_use on a cluster (for "
            "example http://asyncrl-sandbox.asyncrl-sandbox.svc.cluster.local:8080, manifests/sandbox/), or "
            "env.params.allow_python: false; tools are not run inside the environment pod")


def write_config(store: S3Store, paths: RunPaths, cfg: RunConfig) -> bool:
    """Write config.json once; True if written now, False if this same configuration was already there;
    RunExists (nothing written) if a different one is."""
    doc = cfg.model_dump(mode="json")
    store.ensure_bucket()
    try:
        store.put_json(paths.config(), doc, if_absent=True)
        return True
    except ObjectExists:
        existing = store.get_json(paths.config())
        if existing != doc:
            raise RunExists(f"{paths.config()}: a different configuration is already stored for run "
                            f"{cfg.run_id}; a run's configuration never changes") from None
        return False


def record_model(store: S3Store, paths: RunPaths, cfg: RunConfig, folder: Path | None = None) -> dict[str, Any]:
    """Record the run's model in `model.json` for the roles; returns the document.

    `folder` given (the roles run on this machine): that resolved folder, written every time (a resumed run's
    roles load what this machine has). Otherwise once (a retried or resumed creation keeps the document already
    there): `model.path` as given (the roles fetch or check it), or, empty, the built-in tiny model built here
    (cached under `cache_dir`) and uploaded under the run (`<run>/model/`); the document is written after the last
    file, so a creation that dies mid-upload leaves no document and its retry uploads again."""
    if folder is not None:
        from asyncrl.tiny_model.prepare import model_document_for

        doc = model_document_for(cfg, folder)
        store.put_json(paths.model(), doc)
        return doc
    existing = store.get_json(paths.model())
    if isinstance(existing, dict) and existing.get("path"):
        return existing
    if cfg.model.path:
        doc = model_document(cfg.model.path, SOURCE_PATH, model_path=cfg.model.path)
    else:
        from asyncrl.tiny_model.build import build_tiny_model, cache_key  # torch and the SFT build: only here

        built = build_tiny_model(cfg)
        prefix = paths.model_prefix()
        for f in sorted(built.iterdir()):
            if f.is_file():
                store.put_bytes(prefix + f.name, f.read_bytes())
        doc = model_document(f"s3://{store.bucket}/{prefix.rstrip('/')}", SOURCE_BUILT, build_key=cache_key(cfg))
    store.put_json(paths.model(), doc)
    return doc


KFP_TASK_RUN_TAG = "kfp.mlflow_task_run_id"  # on the joined run: the setup task's own MLflow run
_MAX_NESTING = 16


def kfp_pipeline_run(client: Any, task_run_id: str) -> str:
    """The root of the chain of runs `task_run_id` is nested in (following `mlflow.parentRunId`): KFP's MLflow run
    of the pipeline run when `task_run_id` is a task's nested run; `task_run_id` itself when it has no parent."""
    run_id = task_run_id
    for _ in range(_MAX_NESTING):
        parent = client.get_run(run_id).data.tags.get("mlflow.parentRunId")
        if not parent:
            return run_id
        run_id = parent
    raise ValueError(f"MLFLOW_RUN_ID {task_run_id}: expected a chain of at most {_MAX_NESTING} nested MLflow runs "
                     "(mlflow.parentRunId), found a longer one")


def open_tracking(store: S3Store, paths: RunPaths, cfg: RunConfig, tracking_uri: str, mode: str,
                  tags: dict[str, str] | None = None, join_run_id: str = "") -> Tracker | None:
    """Create (or join `join_run_id`) the run's MLflow run and record it in tracking.json; None without a URI.
    A retried creation reuses the run tracking.json already names (nothing is logged again)."""
    if not tracking_uri:
        return None
    from mlflow import MlflowClient

    from asyncrl.tracking.mlflow_tracker import Tracker, flatten_params

    existing = store.get_json(paths.tracking())
    if isinstance(existing, dict) and existing.get("mlflow_run_id"):  # a retry: the run already has one
        uri = str(existing.get("tracking_uri") or tracking_uri)
        return Tracker(MlflowClient(tracking_uri=uri), str(existing["mlflow_run_id"]), uri)
    params = flatten_params(cfg.model_dump(mode="json"))
    all_tags = {"asyncrl.run_url": run_url(cfg.storage.bucket, cfg.storage.prefix, cfg.run_id),
                "asyncrl.mode": mode, **lineage_tags(cfg), **(tags or {})}
    if join_run_id:  # KFP made the run: log into its run of the whole pipeline run
        task = Tracker.attach(tracking_uri, join_run_id)
        tracker = Tracker(task.client, kfp_pipeline_run(task.client, join_run_id), tracking_uri)
        if tracker.run_id != join_run_id:
            all_tags[KFP_TASK_RUN_TAG] = join_run_id
        tracker.log_params(params)
        for k, v in all_tags.items():
            tracker.client.set_tag(tracker.run_id, k, v)
    else:
        tracker = Tracker.create(tracking_uri, cfg.tracking.experiment, cfg.run_id, params=params, tags=all_tags)
    log_dataset_inputs(tracker.client, tracker.run_id, cfg)
    # mode: how a later `asyncrl tracking replay` logs the checkpoints as models (asyncrl.run.replay_models)
    store.put_json(paths.tracking(), {"tracking_uri": tracking_uri, "mlflow_run_id": tracker.run_id, "mode": mode})
    return tracker


@dataclass
class CreatedRun:
    """What `create_run` did: whether config.json was written now, the model document, the MLflow run (or None),
    and the task rows' document (`data/dataset.json`, None for a task without one)."""

    written: bool
    model: dict[str, Any]
    tracker: Tracker | None
    task_data: dict[str, Any] | None = None


def create_run(store: S3Store, paths: RunPaths, cfg: RunConfig, *, tracking_uri: str, mode: str,
               tags: dict[str, str] | None = None, join_run_id: str = "",
               model_folder: Path | None = None) -> CreatedRun:
    """Write a new run's documents (config.json, model.json, the task's rows, tracking.json) and open its MLflow run;
    see the module docstring. RunExists (nothing written) when a different configuration is stored under the run id."""
    written = write_config(store, paths, cfg)
    model = record_model(store, paths, cfg, model_folder)
    task_data = record_task_data(store, paths, cfg)
    tracker = open_tracking(store, paths, cfg, tracking_uri, mode, tags, join_run_id)
    return CreatedRun(written, model, tracker, task_data)
