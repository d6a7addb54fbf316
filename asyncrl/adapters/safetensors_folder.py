"""Reading a model folder's weights by name from its safetensors files (one file or shards), without loading a model.

Used by a generation worker's LoRA support (the base weights of the adapted layers, and the base it reloads once)
and by `asyncrl model merge`.
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path

from torch import Tensor

__all__ = ["folder_tensor_names", "read_folder_tensors"]


def _safetensors_files(folder: Path) -> list[Path]:
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise FileNotFoundError(f"{folder}: expected the model's *.safetensors files (LoRA merges into them)")
    return files


def folder_tensor_names(folder: Path) -> dict[str, Path]:
    """Every tensor name of the model folder's safetensors files -> its file."""
    from safetensors import safe_open

    where: dict[str, Path] = {}
    for f in _safetensors_files(folder):
        with safe_open(str(f), framework="pt") as st:
            for name in st.keys():  # noqa: SIM118 - safe_open is not a mapping
                where[name] = f
    return where


def read_folder_tensors(folder: Path, names: Iterable[str] | None = None) -> list[tuple[str, Tensor]]:
    """The named tensors (all of them with `names` None) of the model folder, as stored; KeyError naming a missing
    one."""
    from safetensors import safe_open

    where = folder_tensor_names(folder)
    wanted = list(where) if names is None else list(names)
    missing = [n for n in wanted if n not in where]
    if missing:
        raise KeyError(f"{folder}: no tensor {missing[0]!r} in its safetensors files ({len(missing)} missing)")
    out = []
    by_file: dict[Path, list[str]] = {}
    for n in wanted:
        by_file.setdefault(where[n], []).append(n)
    for f, file_names in by_file.items():
        with safe_open(str(f), framework="pt") as st:
            out.extend((n, st.get_tensor(n)) for n in file_names)
    return out
