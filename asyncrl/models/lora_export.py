"""A LoRA checkpoint as a folder a user can read and merge: its description file, and `asyncrl model merge`.

With `training.lora`, a checkpoint's `model.safetensors` holds the adapters (`<module>.lora_A`, `<module>.lora_B`,
`asyncrl.adapters.lora`), not a whole model. Every such checkpoint (and so every MLflow model logged from it, and the
registered version) also carries `LORA_FILE`: the adapters' rank, alpha, scale and target modules, and the base
model they adapt (the run's `model.path`). `merge_checkpoint` turns the folder back into a plain Hugging Face model:
the base's weights with every adapted layer replaced by `W + scale·B·A` (the generation workers' own merge), the
checkpoint's config and tokenizer files, no description file.

Invariants: the merged folder is written next to its destination and renamed into place (never half-written); a
folder without `LORA_FILE`, a base that lacks an adapted layer, or adapters that do not chain are errors naming
the file, and nothing is written.
"""

from __future__ import annotations

import json
import shutil
import tempfile
from pathlib import Path
from typing import Any

from asyncrl.adapters.lora import adapter_pairs, merged_weights

__all__ = ["LORA_FILE", "lora_description", "merge_checkpoint"]

LORA_FILE = "asyncrl_lora.json"
FORMAT = "asyncrl-lora-v1"


def lora_description(rank: int, alpha: float, target_modules: list[str], base_model: str) -> bytes:
    """The bytes of `LORA_FILE` for a run's checkpoints."""
    doc = {"format": FORMAT, "rank": rank, "alpha": alpha, "scale": alpha / rank,
           "target_modules": list(target_modules), "base_model": base_model,
           "tensors": "model.safetensors: <module>.lora_A (rank x in) and <module>.lora_B (out x rank); the adapted "
                      "weight is W + scale * B @ A (asyncrl model merge writes it)"}
    return (json.dumps(doc, indent=2) + "\n").encode()


def read_description(folder: Path) -> dict[str, Any]:
    path = folder / LORA_FILE
    if not path.is_file():
        raise FileNotFoundError(f"{path}: not found; expected a LoRA checkpoint folder (one of a run with "
                                f"training.lora)")
    doc = json.loads(path.read_text())
    if doc.get("format") != FORMAT or not isinstance(doc.get("scale"), int | float):
        raise ValueError(f"{path}: expected format {FORMAT!r} with a numeric scale, got {doc.get('format')!r}")
    return dict(doc)


def merge_checkpoint(folder: Path, out: Path, base: Path | None = None) -> dict[str, Any]:
    """Write the merged model of LoRA checkpoint `folder` to `out` (base: `base`, else the one the description names);
    returns {base, layers, out}."""
    from safetensors.torch import load_file, save_file

    from asyncrl.adapters.safetensors_folder import read_folder_tensors

    doc = read_description(folder)
    base_dir = Path(base or doc["base_model"])
    try:
        pairs = adapter_pairs(load_file(str(folder / "model.safetensors")).items())
    except ValueError as e:
        raise ValueError(f"{folder / 'model.safetensors'}: {e}") from None
    weights = dict(read_folder_tensors(base_dir))
    try:
        merged = dict(merged_weights(weights, pairs, float(doc["scale"])))
    except ValueError as e:
        raise ValueError(f"{folder} onto base {base_dir}: {e}") from None
    dtypes = {n: weights[n].dtype for n in merged}
    weights.update({n: t.to(dtypes[n]) for n, t in merged.items()})
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}-", dir=out.parent))
    try:
        for f in folder.iterdir():
            if f.is_file() and not f.name.endswith(".safetensors") and f.name not in (LORA_FILE, "meta.json"):
                shutil.copy2(f, tmp / f.name)
        save_file({n: t.contiguous() for n, t in weights.items()}, str(tmp / "model.safetensors"),
                  metadata={"format": "pt"})
        if out.exists():
            shutil.rmtree(out)
        tmp.rename(out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return {"base": str(base_dir), "layers": len(merged), "out": str(out)}
