"""A run's lineage in MLflow: the code it ran, its configuration's digest, the datasets it trained and evaluated on.

`lineage_tags` gives the tags a new MLflow run gets: `mlflow.source.git.commit` (MLflow's standard tag, shown in the
run's page: `ASYNCRL_GIT_REVISION`, baked into the images by `make images`, else the commit of the checkout the
package runs from, with `asyncrl.git.dirty` when it has uncommitted changes) and `asyncrl.config_digest` (sha256
of the configuration without what names this run: two runs with the same digest ran the same job).
`dataset_inputs` describes the task's train and eval splits as MLflow dataset inputs (name, digest, size,
source), logged with `mlflow.data.context` = train / eval; an agentic task's episodes come from its environment
and its seeds, recorded as the environment's name and parameters.

Lineage never blocks a run: a split that cannot be read here (a file only the role pods can reach) is left out with
a warning, and no git at all means no commit tag.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import subprocess
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig

log = logging.getLogger(__name__)
PACKAGE_ROOT = Path(__file__).resolve().parents[2]
# fields that name one run or where it keeps its files, not what job it runs
RUN_IDENTITY_FIELDS = ("run_id", "runs_dir", "cache_dir")
RUN_IDENTITY_SECTIONS = ("storage", "tracking")


def config_digest(cfg: RunConfig) -> str:
    """sha256 (hex) of the configuration as canonical JSON, without the fields that name the run or its places."""
    doc = cfg.model_dump(mode="json")
    for key in (*RUN_IDENTITY_FIELDS, *RUN_IDENTITY_SECTIONS):
        doc.pop(key, None)
    return hashlib.sha256(json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def git_commit(root: Path = PACKAGE_ROOT) -> tuple[str, bool] | None:
    """(commit, dirty) of the checkout at `root`, or None when it is not one (an installed wheel) or git is absent."""
    try:
        head = subprocess.run(["git", "-C", str(root), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=10)
        if head.returncode != 0:
            return None
        status = subprocess.run(["git", "-C", str(root), "status", "--porcelain", "--untracked-files=no"],
                                capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return head.stdout.strip(), bool(status.stdout.strip())


def lineage_tags(cfg: RunConfig) -> dict[str, str]:
    tags = {"asyncrl.config_digest": config_digest(cfg)}
    revision = os.environ.get("ASYNCRL_GIT_REVISION", "")
    if revision:
        tags["mlflow.source.git.commit"] = revision
    elif (found := git_commit()) is not None:
        tags["mlflow.source.git.commit"] = found[0]
        tags["asyncrl.git.dirty"] = str(found[1]).lower()
    return tags


def _digest(rows: list[Any]) -> str:
    return hashlib.sha256(json.dumps(rows, sort_keys=True, separators=(",", ":")).encode()).hexdigest()[:16]


def dataset_inputs(cfg: RunConfig) -> list[dict[str, Any]]:
    """Each split as {"name", "digest", "size", "source_type", "source", "context"} (train and eval)."""
    if cfg.env is not None:
        params = cfg.env.params
        source = json.dumps({"env": cfg.env.name, "params": params}, sort_keys=True, default=str)
        return [{"name": f"{cfg.env.name}-episodes", "digest": _digest([source]), "size": None,
                 "source_type": "environment", "source": source, "context": "train"}]
    from asyncrl.tasks.datasets import load_split

    out = []
    for split in ("train", "eval"):
        try:
            problems = load_split(cfg.task, split)
        except Exception as err:  # noqa: BLE001 - lineage is best effort; the roles check the data themselves
            log.warning("lineage: the %s split of task %s is not readable here (%s); not logged as an input",
                        split, cfg.task.name, err)
            continue
        path = cfg.task.train_path if split == "train" else cfg.task.eval_path
        local = cfg.task.name in ("jsonl", "file")
        source = (path if local else f"reasoning-gym:{cfg.task.dataset}" if cfg.task.name == "reasoning_gym"
                  else f"asyncrl:{cfg.task.name}")
        out.append({"name": f"{cfg.task.name}-{split}", "digest": _digest([[p.prompt, p.answer] for p in problems]),
                    "size": len(problems), "source_type": "local" if local else "code",
                    "source": source, "context": split})
    return out


def log_dataset_inputs(client: Any, run_id: str, cfg: RunConfig) -> list[dict[str, Any]]:
    """Log `dataset_inputs(cfg)` to the MLflow run through `client.log_inputs`; returns what was logged."""
    from mlflow.entities import Dataset, DatasetInput, InputTag

    inputs = dataset_inputs(cfg)
    if inputs:
        client.log_inputs(run_id, datasets=[
            DatasetInput(Dataset(name=d["name"], digest=d["digest"], source_type=d["source_type"], source=d["source"],
                                 profile=json.dumps({"num_rows": d["size"]}) if d["size"] is not None else None),
                         tags=[InputTag("mlflow.data.context", d["context"])])
            for d in inputs])
    return inputs
