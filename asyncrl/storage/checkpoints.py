"""Checkpoints on S3: `checkpoints/<version>/{model.safetensors, optimizer.safetensors, meta.json, COMMITTED}` and
the files that make the folder a complete Hugging Face model folder (`config.json`, the tokenizer's files, a
`generation_config.json` when the run's model has one: `folder_files` of `save_checkpoint`, see
`asyncrl.models.checkpoint_folder`); `model.safetensors` holds the weights under their Hugging Face names, so
`AutoModelForCausalLM.from_pretrained(<a copy of the folder>)` loads it.

Invariants:
- `COMMITTED` is written last, so a checkpoint is either committed and complete or ignored; it holds
  the size and sha256 of every file, and `load_checkpoint` verifies them;
- only committed versions count for `latest_committed_version`; loading an uncommitted one is an error;
- tensors are stored with safetensors and read with `safetensors.torch.load`: nothing is unpickled;
- a committed version is never rewritten (saving it again raises `ObjectExists`);
- the model folder's files are listed in `COMMITTED` like the tensors, and `load_checkpoint` verifies them too.

A torch optimizer `state_dict()` (nested dicts/lists of tensors and numbers) is stored as flat named
tensors plus a JSON skeleton (`flatten_optimizer_state` / `unflatten_optimizer_state`); keep the
skeleton in `meta` (e.g. `meta["optimizer_skeleton"]`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
from typing import Any

import torch
from safetensors.torch import load as st_load
from safetensors.torch import save as st_save

from asyncrl.storage.run_layout import COMMITTED, RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store

log = logging.getLogger(__name__)

MODEL_FILE = "model.safetensors"
OPTIMIZER_FILE = "optimizer.safetensors"
META_FILE = "meta.json"
FORMAT = "asyncrl-checkpoint-v1"


class CheckpointError(RuntimeError):
    """A checkpoint is missing, uncommitted or corrupt; the message names the version and file."""


def _tensors_to_bytes(tensors: dict[str, torch.Tensor], what: str) -> bytes:
    """safetensors bytes; tensors sharing storage (tied weights) are cloned so each is saved once. The header says
    `format: pt`, as Hugging Face's own files do (transformers refuses a file whose format is something else)."""
    out: dict[str, torch.Tensor] = {}
    seen: set[int] = set()
    for name, t in tensors.items():
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"{what}[{name!r}]: expected a torch.Tensor, got {type(t).__name__}")
        t = t.detach().to("cpu").contiguous()
        ptr = t.untyped_storage().data_ptr()
        if ptr in seen and t.numel() > 0:
            t = t.clone()
        seen.add(ptr)
        out[name] = t
    return st_save(out, metadata={"format": "pt"})


def save_checkpoint(
    store: S3Store,
    paths: RunPaths,
    version: int,
    model_state: dict[str, torch.Tensor],
    optimizer_state: dict[str, torch.Tensor],
    meta: dict[str, Any],
    extra: dict[str, dict[str, torch.Tensor]] | None = None,
    folder_files: dict[str, bytes] | None = None,
) -> str:
    """Write the checkpoint of `version` and commit it; return its prefix key.

    `extra` adds more tensor files, `<name>.safetensors` each (the critics and their optimizers), listed and
    verified like the others; read them back with `load_checkpoint_tensors`. `folder_files` adds the model
    folder's other files (name -> bytes: config.json, the tokenizer's, ...), written as they are, listed and
    verified like the others.

    `meta` must be JSON-serialisable (cursors, step, counters, optimizer skeleton...). Files of an
    earlier, uncommitted attempt at the same version are overwritten; a committed version is not.
    """
    committed_key = paths.checkpoint_committed(version)
    if store.exists(committed_key):
        raise ObjectExists(f"checkpoint version {version} is already committed ({committed_key})")
    try:
        meta_bytes = json.dumps(meta, sort_keys=True, allow_nan=False).encode()
    except (TypeError, ValueError) as e:
        raise ValueError(f"checkpoint {version} meta: expected a JSON-serialisable dict: {e}") from e
    files = {
        MODEL_FILE: _tensors_to_bytes(model_state, "model_state"),
        OPTIMIZER_FILE: _tensors_to_bytes(optimizer_state, "optimizer_state"),
        META_FILE: meta_bytes,
    }
    for name, tensors in (extra or {}).items():
        if not name.replace("_", "").isalnum():
            raise ValueError(f"checkpoint extra file name: expected letters, digits and '_', got {name!r}")
        files[f"{name}.safetensors"] = _tensors_to_bytes(tensors, name)
    for name, data in (folder_files or {}).items():
        if name in files or "/" in name or name.endswith(".safetensors") or name in (COMMITTED, ""):
            raise ValueError(f"checkpoint folder file name: expected a plain file name other than the tensor files "
                             f"and {COMMITTED}, got {name!r}")
        files[name] = data
    manifest: dict[str, Any] = {"format": FORMAT, "version": version, "files": {}}
    for name, data in files.items():
        store.put_bytes(paths.checkpoint(version, name), data)
        manifest["files"][name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    store.put_json(committed_key, manifest, if_absent=True)
    log.info("checkpoint %d committed at %s", version, paths.checkpoint_prefix(version))
    return paths.checkpoint_prefix(version)


def committed_versions(store: S3Store, paths: RunPaths) -> list[int]:
    """Every version with a COMMITTED marker, ascending."""
    root = paths.checkpoints_root()
    versions = []
    for key in store.list_keys(root):
        parts = key[len(root) :].split("/")
        if len(parts) == 2 and parts[1] == COMMITTED and parts[0].isdigit():
            versions.append(int(parts[0]))
    return sorted(versions)


def latest_committed_version(store: S3Store, paths: RunPaths) -> int | None:
    """The highest committed version, or None when no checkpoint is committed."""
    versions = committed_versions(store, paths)
    return versions[-1] if versions else None


def _read_verified(store: S3Store, paths: RunPaths, version: int, name: str, manifest: dict[str, Any]) -> bytes:
    key = paths.checkpoint(version, name)
    expected = manifest.get("files", {}).get(name)
    if not isinstance(expected, dict) or "sha256" not in expected:
        raise CheckpointError(f"checkpoint {version}: COMMITTED does not list {name}")
    data = store.get_bytes(key)
    if data is None:
        raise CheckpointError(f"checkpoint {version}: {key} is missing although COMMITTED lists it")
    if hashlib.sha256(data).hexdigest() != expected["sha256"]:
        raise CheckpointError(f"checkpoint {version}: {key} does not match its sha256 in COMMITTED")
    return data


def _committed_manifest(store: S3Store, paths: RunPaths, version: int) -> dict[str, Any]:
    committed_key = paths.checkpoint_committed(version)
    try:
        manifest = store.get_json(committed_key)
    except ValueError as e:
        raise CheckpointError(f"checkpoint {version}: unreadable COMMITTED marker: {e}") from e
    if manifest is None:
        raise CheckpointError(
            f"checkpoint {version} is not committed ({committed_key} missing); refusing to load a partial checkpoint"
        )
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or manifest.get("version") != version:
        raise CheckpointError(f"checkpoint {version}: {committed_key} is not a {FORMAT} marker for this version")
    return manifest


def load_checkpoint_tensors(store: S3Store, paths: RunPaths, version: int, name: str) -> dict[str, torch.Tensor]:
    """The `extra` tensor file `name` of a committed version (verified against COMMITTED); CheckpointError when
    the checkpoint has none (e.g. it was written by a run without critics)."""
    manifest = _committed_manifest(store, paths, version)
    return st_load(_read_verified(store, paths, version, f"{name}.safetensors", manifest))


def load_checkpoint_meta(store: S3Store, paths: RunPaths, version: int) -> dict[str, Any]:
    """The meta document (cursors, counters, ...) of a committed version, verified, without the tensors."""
    manifest = _committed_manifest(store, paths, version)
    try:
        return json.loads(_read_verified(store, paths, version, META_FILE, manifest))
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {version}: {META_FILE} is not JSON: {e}") from e


def load_checkpoint(
    store: S3Store, paths: RunPaths, version: int
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, Any]]:
    """(model_state, optimizer_state, meta) of a committed version; CheckpointError otherwise."""
    manifest = _committed_manifest(store, paths, version)
    model = st_load(_read_verified(store, paths, version, MODEL_FILE, manifest))
    optim = st_load(_read_verified(store, paths, version, OPTIMIZER_FILE, manifest))
    meta_bytes = _read_verified(store, paths, version, META_FILE, manifest)
    try:
        meta = json.loads(meta_bytes)
    except json.JSONDecodeError as e:
        raise CheckpointError(f"checkpoint {version}: {META_FILE} is not JSON: {e}") from e
    for name in checkpoint_folder_files(manifest):  # small files: a corrupt config or tokenizer fails the resume
        _read_verified(store, paths, version, name, manifest)
    return model, optim, meta


def checkpoint_folder_files(manifest: dict[str, Any]) -> list[str]:
    """The model folder's files a COMMITTED marker lists besides the tensors and meta (none before they existed)."""
    return sorted(n for n in manifest.get("files", {}) if n != META_FILE and not n.endswith(".safetensors"))


def checkpoint_file_names(store: S3Store, paths: RunPaths, version: int) -> list[str]:
    """Every file a committed version's COMMITTED marker lists; CheckpointError when it is not committed."""
    return sorted(_committed_manifest(store, paths, version).get("files", {}))


def read_checkpoint_file(store: S3Store, paths: RunPaths, version: int, name: str) -> bytes:
    """One file of a committed version, verified against its sha256 in COMMITTED."""
    return _read_verified(store, paths, version, name, _committed_manifest(store, paths, version))


# --- optimizer state <-> flat tensors + JSON skeleton (pure) -----------------------------------------

def _flatten(node: Any, path: str, tensors: dict[str, torch.Tensor]) -> Any:
    if isinstance(node, torch.Tensor):
        name = path or "root"
        if name in tensors:
            raise ValueError(f"optimizer state: two tensors flatten to the same name {name!r}")
        tensors[name] = node
        return {"t": name}
    if isinstance(node, dict):
        items = []
        for k, v in node.items():
            if not isinstance(k, str | int) or isinstance(k, bool):
                raise TypeError(f"optimizer state at {path or '<root>'}: unsupported key {k!r}")
            items.append([k, _flatten(v, f"{path}/{k}" if path else str(k), tensors)])
        return {"d": items}
    if isinstance(node, list | tuple):
        kids = [_flatten(v, f"{path}/{i}" if path else str(i), tensors) for i, v in enumerate(node)]
        return {"l" if isinstance(node, list) else "u": kids}
    if isinstance(node, float) and not math.isfinite(node):
        return {"f": repr(node)}
    if node is None or isinstance(node, bool | int | float | str):
        return {"v": node}
    raise TypeError(f"optimizer state at {path or '<root>'}: unsupported value of type {type(node).__name__}")


def flatten_optimizer_state(sd: dict[str, Any]) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """(named tensors, JSON-able skeleton) of a nested optimizer `state_dict()`; exact inverse below."""
    tensors: dict[str, torch.Tensor] = {}
    skeleton = _flatten(sd, "", tensors)
    return tensors, skeleton


def _unflatten(node: Any, tensors: dict[str, torch.Tensor]) -> Any:
    if not isinstance(node, dict) or len(node) != 1:
        raise ValueError(f"optimizer skeleton: expected a one-key node, got {node!r}")
    (tag, val), = node.items()
    if tag == "t":
        if val not in tensors:
            raise ValueError(f"optimizer skeleton: tensor {val!r} missing from the optimizer tensors")
        return tensors[val]
    if tag == "d":
        return {k: _unflatten(v, tensors) for k, v in val}
    if tag == "l":
        return [_unflatten(v, tensors) for v in val]
    if tag == "u":
        return tuple(_unflatten(v, tensors) for v in val)
    if tag == "f":
        return float(val)
    if tag == "v":
        return val
    raise ValueError(f"optimizer skeleton: unknown node tag {tag!r}")


def unflatten_optimizer_state(tensors: dict[str, torch.Tensor], skeleton: dict[str, Any]) -> dict[str, Any]:
    """The nested optimizer state_dict from `flatten_optimizer_state`'s output."""
    return _unflatten(skeleton, tensors)
