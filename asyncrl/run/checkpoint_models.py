"""Every committed checkpoint as an MLflow LoggedModel of the run, and the run's registered model version.

`publish_models` runs at a run's end (embedded: `asyncrl run`, while its S3 server is still up; cluster: the
pipeline's `finalize`), never on a training step's path. For each committed checkpoint not logged yet it creates a
LoggedModel named `checkpoint-<version>`, linked to the MLflow run as an output at step `<version>`, with the
version's evaluation figures as parameters (`eval/accuracy`, ... when the version has an evaluation point) and tags
naming the checkpoint's S3 folder. How the weights get there depends on who ends the run, that is on the store:
- embedded (`by_reference=False`): the embedded S3 server stops with the run, so the checkpoint's Hugging Face
  folder (weights, config, tokenizer) is copied into the model's artifacts, with an `MLmodel` file;
- cluster (`by_reference=True`): the checkpoints stay in a durable S3 bucket, so the model is an external one
  (`mlflow.model.isExternal`): MLflow stores only its `MLmodel` description, the weights stay in the S3 folder,
  whose `s3://` URI is the model's `asyncrl.checkpoint_uri` tag and the registered version's source.
Then it registers the checkpoint `asyncrl.run.model_choice.choose_checkpoint` picks (best by eval accuracy, else
the last) as a version of `registered_name`.

What it did is kept in S3 under the run: `models/<version:08d>.json` per logged checkpoint (its model id; a
later call skips it), `models/not_logged.json` (the versions MLflow did not take, with the error; removed once
none is left) and `models/registered.json` (the registered version, the checkpoint, why). A resumed run, or a
retried finalize, logs only the new checkpoints and registers nothing twice: a checkpoint's model already
registered under the name is found again (`models/registered.json`, else the registry's versions of the run).
Every MLflow call is retried until one deadline (`deadline_s`); MLflow unavailable: a warning, the record in S3,
and the result says so; never an exception.
"""

from __future__ import annotations

import contextlib
import logging
import tempfile
import time
from pathlib import Path
from typing import Any

from asyncrl.run.model_choice import Choice, choose_checkpoint
from asyncrl.storage.checkpoints import (
    MODEL_FILE,
    checkpoint_file_names,
    committed_versions,
    read_checkpoint_file,
)
from asyncrl.storage.eval_points import eval_figures
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

NOT_LOGGED = "models/not_logged.json"
REGISTERED = "models/registered.json"
PUBLISHED = "models/published.json"  # embedded mode: what `publish_embedded_models` did (cluster: final_status.json)
EXTERNAL_TAG = "mlflow.model.isExternal"  # mlflow.utils.mlflow_tags.MLFLOW_MODEL_IS_EXTERNAL
NOT_FOLDER_FILES = ("optimizer.safetensors", "meta.json")


def model_record_key(paths: RunPaths, version: int) -> str:
    """`models/<version:08d>.json`: checkpoint `version`'s LoggedModel, once logged."""
    return paths.file(f"models/{version:08d}.json")


def checkpoint_uri(store: S3Store, paths: RunPaths, version: int) -> str:
    return f"s3://{store.bucket}/{paths.checkpoint_prefix(version).rstrip('/')}"


def model_folder_files(names: list[str]) -> list[str]:
    """Of a checkpoint's files, those of its Hugging Face folder: the weights and the config and tokenizer files
    (not the optimizer, the critics or the trainer's meta)."""
    return [n for n in names
            if n == MODEL_FILE or (n not in NOT_FOLDER_FILES and not n.endswith(".safetensors"))]


def _log_checkpoint(client: Any, store: S3Store, paths: RunPaths, run_id: str, experiment_id: str, version: int,
                    figures: dict[str, float], by_reference: bool) -> dict[str, Any]:
    """Create, fill and finalize checkpoint `version`'s LoggedModel; its record (`model_record_key`)."""
    from mlflow.entities import LoggedModelOutput
    from mlflow.models import Model

    uri = checkpoint_uri(store, paths, version)
    tags = {"asyncrl.run_id": paths.run_id, "asyncrl.checkpoint_version": str(version), "asyncrl.checkpoint_uri": uri}
    if by_reference:
        tags[EXTERNAL_TAG] = "true"
    params = {"checkpoint_version": str(version), **{k: repr(v) for k, v in figures.items()}}
    model = client.create_logged_model(experiment_id, name=f"checkpoint-{version}", source_run_id=run_id, tags=tags,
                                       params=params)
    try:
        with tempfile.TemporaryDirectory(prefix="asyncrl-model-") as tmp:
            folder = Path(tmp)
            if not by_reference:  # embedded: the Hugging Face folder itself, verified against COMMITTED
                for name in model_folder_files(checkpoint_file_names(store, paths, version)):
                    (folder / name).write_bytes(read_checkpoint_file(store, paths, version, name))
            description = Model(artifact_path=model.artifact_location, model_id=model.model_id,
                                metadata={"asyncrl_checkpoint_uri": uri, "asyncrl_checkpoint_version": version})
            description.save(str(folder / "MLmodel"))
            client.log_model_artifacts(model.model_id, str(folder))
        client.finalize_logged_model(model.model_id, "READY")
        client.log_outputs(run_id, [LoggedModelOutput(model.model_id, step=version)])
    except BaseException:
        with contextlib.suppress(Exception):  # a retry creates a new one; this one is marked as failed if possible
            client.finalize_logged_model(model.model_id, "FAILED")
        raise
    return {"version": version, "model_id": model.model_id, "model_uri": f"models:/{model.model_id}",
            "by_reference": by_reference, "checkpoint_uri": uri,
            "source": uri if by_reference else model.artifact_location, "mlflow_run_id": run_id}


def _register(client: Any, store: S3Store, paths: RunPaths, name: str, run_id: str, choice: Choice,
              record: dict[str, Any]) -> dict[str, Any]:
    """Register `record`'s model under `name` unless it already is; the `models/registered.json` document."""
    from mlflow.exceptions import MlflowException

    prior = store.get_json(paths.file(REGISTERED))
    if isinstance(prior, dict) and prior.get("name") == name and prior.get("model_id") == record["model_id"]:
        return prior
    with contextlib.suppress(MlflowException):  # it exists: add a version
        client.create_registered_model(name)
    quoted = name.replace("'", "\\'")
    existing = [v for v in client.search_model_versions(f"name='{quoted}'")
                if v.run_id == run_id and v.source == record["source"]]
    mv = existing[0] if existing else client.create_model_version(name, record["source"], run_id=run_id,
                                                                  model_id=record["model_id"])
    doc = {"name": name, "version": str(mv.version), "model_uri": f"models:/{name}/{mv.version}",
           "source": record["source"], "model_id": record["model_id"], "checkpoint_uri": record["checkpoint_uri"],
           **choice.as_dict()}
    store.put_json(paths.file(REGISTERED), doc)
    return doc


def publish_models(store: S3Store, paths: RunPaths, tracking: dict[str, Any], registered_name: str,
                   by_reference: bool, deadline_s: float) -> dict[str, Any]:
    """Log the run's committed checkpoints not logged yet and register the chosen one (module docstring). Returns
    what goes into `final_status.json`: `models_logged` (versions), `models_not_logged` (versions),
    `registered_model` (the `models/registered.json` document; absent when none is) and, when MLflow failed,
    `models_error`."""
    from mlflow import MlflowClient

    from asyncrl.tracking.mlflow_calls import bound_http_requests, retry_until

    bound_http_requests()
    deadline = time.monotonic() + deadline_s
    uri, run_id = tracking["tracking_uri"], tracking["mlflow_run_id"]
    client = MlflowClient(tracking_uri=uri, registry_uri=uri)
    committed = committed_versions(store, paths)
    figures = eval_figures(store, paths)
    out: dict[str, Any] = {"models_logged": [], "models_not_logged": []}
    records: dict[int, dict[str, Any]] = {}
    experiment_id: str | None = None
    for version in committed:
        record = store.get_json(model_record_key(paths, version))
        if not (isinstance(record, dict) and record.get("model_id")):
            try:
                if experiment_id is None:
                    experiment_id = retry_until(lambda: client.get_run(run_id).info.experiment_id, deadline,
                                                "MLflow: the run's experiment")
                record = retry_until(
                    lambda v=version, e=experiment_id: _log_checkpoint(client, store, paths, run_id, e, v,
                                                                       figures.get(v, {}), by_reference),
                    deadline, f"MLflow: logging checkpoint {version} as a model")
            except Exception as err:  # MLflow down or refusing: recorded, done by a later finalize or replay
                out["models_not_logged"].append(version)
                out["models_error"] = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
                continue
            store.put_json(model_record_key(paths, version), record)
        records[version] = record
        out["models_logged"].append(version)
    if out["models_not_logged"]:
        log.warning("MLflow did not take checkpoint(s) %s as models (%s); recorded in %s, logged by a later "
                    "finalize or `asyncrl tracking replay`", out["models_not_logged"], out["models_error"], paths.file(NOT_LOGGED))
        store.put_json(paths.file(NOT_LOGGED), {"versions": out["models_not_logged"], "error": out["models_error"],
                                                "time": time.time()})
    elif store.exists(paths.file(NOT_LOGGED)):
        store.delete(paths.file(NOT_LOGGED))
    choice = choose_checkpoint(committed, figures)
    if choice is None:
        return out
    if choice.version not in records:
        out["models_error"] = out.get("models_error") or f"checkpoint {choice.version} is not logged"
        log.warning("model not registered: checkpoint %d (%s) is not logged as a model", choice.version, choice.reason)
        return out
    try:
        out["registered_model"] = retry_until(
            lambda: _register(client, store, paths, registered_name, run_id, choice, records[choice.version]),
            deadline, f"MLflow: registering checkpoint {choice.version} as {registered_name}")
    except Exception as err:
        out["models_error"] = str(err).splitlines()[0][:500] if str(err) else type(err).__name__
        log.warning("model not registered (%s): a later finalize or `asyncrl tracking replay` registers it", out["models_error"])
    return out


def registered_model_name(configured: str, experiment: str, run_name: str) -> str:
    """`tracking.registered_model`, or `<experiment>-<config name>` when it is empty."""
    return configured or f"{experiment}-{run_name}"


def publish_embedded_models(store: S3Store, paths: RunPaths, tracking_uri: str, mlflow_run_id: str,
                            registered_name: str, deadline_s: float) -> dict[str, Any]:
    """Embedded mode, at the end of `asyncrl run` while its S3 server still runs: `publish_models` with the
    checkpoints' folders copied into MLflow (the server and its data folder are the run's, not a durable store);
    the result is also kept as `models/published.json` under the run. Never raises: a failure is a warning."""
    try:
        out = publish_models(store, paths, {"tracking_uri": tracking_uri, "mlflow_run_id": mlflow_run_id},
                             registered_name, by_reference=False, deadline_s=deadline_s)
        store.put_json(paths.file(PUBLISHED), out)
    except Exception as err:  # S3 itself failing at the run's end: the run's outcome stands
        log.warning("checkpoints not logged as MLflow models (%s)", err)
        out = {"models_error": str(err).splitlines()[0][:500] if str(err) else type(err).__name__}
    return out
