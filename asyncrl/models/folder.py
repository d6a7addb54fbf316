"""The model folder a run starts from: what a complete one holds, and how a role finds the run's.

Roles never build or choose a model. Before any role starts, the launcher (embedded mode) or the pipeline's setup
step (cluster) decides the run's model (`model.path`, or the built-in tiny model built by `asyncrl.tiny_model`) and
records where it is in the run document `model.json` (`RunPaths.model()`): {"path": a local folder or an s3:// URI,
"source": "model.path" or "built-in tiny model"}. `run_model_folder` reads that document and returns a local, complete
folder (an s3:// location is fetched once into the cache by `asyncrl.models.fetch`, data formats only).

Invariant: a folder this module returns holds config.json (a JSON object), tokenizer.json and safetensors weights
(every shard its index names); otherwise `ModelFolderError` names the field or document, the folder and every
missing file.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from asyncrl.models.fetch import fetch_model
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

SOURCE_PATH = "model.path"
SOURCE_BUILT = "built-in tiny model"


class ModelFolderError(FileNotFoundError):
    """A model folder is missing, is a file, or lacks what a run loads; the message names the folder, the field and
    every missing file."""


PICKLED_WEIGHTS = (".bin", ".pt", ".pth", ".ckpt", ".pkl")


def model_folder_problems(folder: Path) -> list[str]:
    """What a run needs from a Hugging Face model folder and `folder` lacks (empty: complete): config.json (a JSON
    object), tokenizer.json (the tokenizer is loaded from it), and safetensors weights (every shard an index names).
    Reads only the folder listing, config.json and the shard index."""
    problems: list[str] = []
    config = folder / "config.json"
    if not config.is_file():
        problems.append("config.json is missing")
    else:
        try:
            doc = json.loads(config.read_text(encoding="utf-8"))
            if not isinstance(doc, dict):
                problems.append(f"config.json is not a JSON object (got {type(doc).__name__})")
        except (OSError, UnicodeDecodeError, ValueError) as err:
            problems.append(f"config.json is not readable JSON ({err})")
    if not (folder / "tokenizer.json").is_file():
        problems.append("tokenizer.json is missing (the tokenizer is loaded from it)")
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            shards = sorted(set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values()))
        except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
            problems.append(f"{index.name} is not a readable shard index ({type(err).__name__}: {err})")
        else:
            missing = [s for s in shards if not (folder / str(s)).is_file()]
            if missing:
                problems.append(f"weight shard(s) named in {index.name} are missing: {missing[:5]}")
    elif not any(folder.glob("*.safetensors")):
        pickled = sorted(p.name for p in folder.iterdir() if p.suffix.lower() in PICKLED_WEIGHTS)
        found = f" (found {pickled[:3]}: pickled checkpoints are never loaded; convert them to safetensors)" \
            if pickled else ""
        problems.append(f"no *.safetensors weights{found}")
    return problems


def check_model_folder(folder: Path, field: str = "model.path") -> Path:
    """`folder` if it is a complete model folder, else `ModelFolderError` naming `field`, the folder and what is
    missing."""
    if not folder.exists():
        raise ModelFolderError(f"{field}: {folder} does not exist; expected a Hugging Face model folder")
    if not folder.is_dir():
        raise ModelFolderError(f"{field}: {folder} is a file; expected a Hugging Face model folder")
    problems = model_folder_problems(folder)
    if problems:
        raise ModelFolderError(f"{field}: {folder} is not a complete Hugging Face model folder: {'; '.join(problems)}")
    return folder



def model_document(location: str, source: str, **extra: Any) -> dict[str, Any]:
    """The `model.json` document of a run whose model is at `location` (a local folder or an s3:// URI)."""
    if source not in (SOURCE_PATH, SOURCE_BUILT):
        raise ValueError(f"model.json source: expected {SOURCE_PATH!r} or {SOURCE_BUILT!r}, got {source!r}")
    return {"path": location, "source": source, **extra}


def run_model_folder(store: S3Store, paths: RunPaths, cache_dir: Path | str, endpoint_url: str,
                     region: str = "us-east-1") -> Path:
    """The local, complete model folder of the run under `paths`, from its `model.json`. ModelFolderError when the
    document is missing or malformed (the run was not started by `asyncrl run` or the pipeline's setup), or the
    folder it names is incomplete."""
    key = paths.model()
    doc = store.get_json(key)
    if not isinstance(doc, dict) or not isinstance(doc.get("path"), str) or not doc["path"]:
        found = "missing" if doc is None else f"got {json.dumps(doc)[:200]}"
        raise ModelFolderError(f"{key}: expected {{\"path\": <model folder or s3:// URI>, ...}} written by the "
                               f"launcher or the pipeline's setup step before the roles start; {found}")
    location = doc["path"]
    if location.startswith("s3://"):
        folder = fetch_model(location, cache_dir, endpoint_url, region)
        return check_model_folder(folder, f"{key} ({location}, fetched into)")
    return check_model_folder(Path(location), key)
