"""The model a run starts from, decided once by whoever prepares the run (never by a role).

`resolve_model_path(cfg)`: `model.path` if set (a complete folder, or an s3:// URI fetched into the cache), else the
built-in tiny model, built once into the cache (`asyncrl.tiny_model.build`). `model_document_for(cfg, folder)` is
what the launcher records in the run's `model.json` for the roles (`asyncrl.models.folder`).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from asyncrl.config.schema import RunConfig
from asyncrl.models.fetch import fetch_model
from asyncrl.models.folder import SOURCE_BUILT, SOURCE_PATH, check_model_folder, model_document
from asyncrl.tiny_model.build import build_tiny_model, cache_key


def resolve_model_path(cfg: RunConfig) -> Path:
    """model.path if set (a complete model folder, or an s3:// URI fetched into the cache), else the built-in
    tiny model (built if not cached yet). `ModelFolderError` (a `FileNotFoundError`) names the folder and every
    missing file."""
    if cfg.model.path.startswith("s3://"):
        endpoint = cfg.storage.endpoint_url or os.environ.get("AWS_ENDPOINT_URL", "")
        folder = fetch_model(cfg.model.path, cfg.cache_dir, endpoint, cfg.storage.region)
        return check_model_folder(folder, f"model.path ({cfg.model.path}, fetched into)")
    if cfg.model.path:
        return check_model_folder(Path(cfg.model.path))
    return build_tiny_model(cfg)


def model_document_for(cfg: RunConfig, folder: Path) -> dict[str, Any]:
    """`model.json` for a run on this machine whose model `resolve_model_path` gave as `folder`."""
    if cfg.model.path:
        return model_document(str(folder.resolve()), SOURCE_PATH, model_path=cfg.model.path)
    return model_document(str(folder.resolve()), SOURCE_BUILT, build_key=cache_key(cfg))
