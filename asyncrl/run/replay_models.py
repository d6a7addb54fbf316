"""`asyncrl tracking replay`'s model step: the checkpoints MLflow missed at a run's end, logged as models later.

`replay_models` does what the run's end would have done (`asyncrl.run.checkpoint_models`): each committed
checkpoint without a model record is logged as a LoggedModel of the run and the chosen one registered under the
run's registered model name (from `config.json`, as `finalize` names it). How the weights go depends on the mode
the run ran in, `models_mode` (`--models auto`):
- `tracking.json`'s `mode` (written by `asyncrl.run.create` since this command logs models): `cluster` → by
  reference (the weights stay in the durable `s3://` bucket), `embedded` → copied as the model's artifacts (the
  embedded S3 server, started again over the run's data folder for the replay, is not a durable store);
- a run recorded before that: a checkpoint's model record (`by_reference`), else `models/published.json` (only the
  embedded launcher writes it) → artifacts, else `final_status.json` (only the pipeline's `finalize` writes it) →
  reference;
- none of these (the run's end never ran): nothing is logged and the result says why (`models_skipped`); pass
  `--models reference|artifacts` to choose.
An embedded run's result is kept in `models/published.json` again, a cluster run's merged into `final_status.json`
when it exists, as at the run's end.
"""

from __future__ import annotations

import logging
from typing import Any

from asyncrl.run.checkpoint_models import (
    PUBLISHED,
    model_record_key,
    publish_embedded_models,
    publish_models,
    registered_model_name,
)
from asyncrl.run.documents import FINAL_STATUS
from asyncrl.storage.checkpoints import committed_versions
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

MODES = ("auto", "reference", "artifacts", "skip")  # --models (the CLI's parser lists them: replay_command.MODES)
RUN_MODES = {"cluster": "reference", "embedded": "artifacts"}  # tracking.json's `mode` → how models are logged
MODEL_KEYS = ("models_logged", "models_not_logged", "registered_model", "models_error")


def models_mode(store: S3Store, paths: RunPaths, tracking: dict[str, Any]) -> tuple[str, str]:
    """`--models auto`: ("reference" | "artifacts" | "skip", why), from what the run recorded in S3."""
    recorded = tracking.get("mode")
    if recorded in RUN_MODES:
        return RUN_MODES[str(recorded)], f"tracking.json: mode {recorded}"
    if recorded:
        raise ValueError(f"{paths.tracking()}: mode: expected one of {sorted(RUN_MODES)}, got {recorded!r}")
    for version in committed_versions(store, paths):
        record = store.get_json(model_record_key(paths, version))
        if isinstance(record, dict) and isinstance(record.get("by_reference"), bool):
            return ("reference" if record["by_reference"] else "artifacts"), f"checkpoint {version}'s model record"
    if store.exists(paths.file(PUBLISHED)):
        return "artifacts", f"{PUBLISHED} (written by the embedded launcher)"
    if store.exists(paths.file(FINAL_STATUS)):
        return "reference", f"{FINAL_STATUS} (written by the pipeline's finalize)"
    return "skip", ("the run records neither its mode nor the end of a run; pass --models reference (cluster) or "
                    "--models artifacts (embedded)")


def replay_models(store: S3Store, paths: RunPaths, tracking: dict[str, Any], mode: str,
                  deadline_s: float) -> dict[str, Any]:
    """Log the checkpoints not logged yet and register the chosen one (module docstring); what goes into the
    command's JSON: `models` (the mode used) and `publish_models`' fields, or `models_skipped` (why not)."""
    from asyncrl.config.load import config_from_json

    if mode not in MODES:
        raise ValueError(f"--models: expected one of {', '.join(MODES)}, got {mode!r}")
    why = "--models"
    if mode == "auto":
        mode, why = models_mode(store, paths, tracking)
    if mode == "skip":
        return {"models": "skip", "models_skipped": why}
    raw = store.get_bytes(paths.config())
    if raw is None:
        return {"models": "skip", "models_skipped": f"{paths.config()}: no configuration (the registered model's name)"}
    cfg = config_from_json(raw.decode(), paths.config())
    name = registered_model_name(cfg.tracking.registered_model, cfg.tracking.experiment, cfg.name)
    log.info("logging the run's checkpoints as models (%s, from %s), registered model %s", mode, why, name)
    if mode == "artifacts":
        out = publish_embedded_models(store, paths, str(tracking["tracking_uri"]), str(tracking["mlflow_run_id"]),
                                      name, deadline_s)
    else:
        out = publish_models(store, paths, tracking, name, by_reference=True, deadline_s=deadline_s)
        _update_final_status(store, paths, out)
    return {"models": mode, **out}


def _update_final_status(store: S3Store, paths: RunPaths, out: dict[str, Any]) -> None:
    """A cluster run's `final_status.json` (when finalize wrote one) gets the models' new outcome."""
    doc = store.get_json(paths.file(FINAL_STATUS))
    if not isinstance(doc, dict):
        return
    doc = {k: v for k, v in doc.items() if k not in MODEL_KEYS}
    store.put_json(paths.file(FINAL_STATUS), {**doc, **{k: out[k] for k in MODEL_KEYS if k in out}})
