"""Tensor parallelism of a generation server: whether a model can be split across its GPUs.

vLLM splits every attention layer's heads evenly across the tensor-parallel workers, so the tensor-parallel size
(`generation.tensor_parallel_size`, the GPUs of one generation replica) must divide the model's attention heads.
Checked here, before vLLM starts, with an error naming the field, the model and the sizes that would work.
Pure except `check_model_folder`, which reads the folder's config.json.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def attention_heads(model_config: dict[str, Any]) -> int | None:
    """The attention heads of a Hugging Face config (`num_attention_heads`, or a multimodal model's
    `text_config.num_attention_heads`); None when it names none."""
    for cfg in (model_config, model_config.get("text_config") or {}):
        heads = cfg.get("num_attention_heads") if isinstance(cfg, dict) else None
        if isinstance(heads, int) and not isinstance(heads, bool) and heads > 0:
            return heads
    return None


def check_tensor_parallel(size: int, heads: int | None, model: str) -> None:
    """ValueError naming generation.tensor_parallel_size when `size` does not divide `heads` (unknown heads: only
    size 1 passes)."""
    if size == 1:
        return
    if heads is None:
        raise ValueError(f"generation.tensor_parallel_size: {size} needs the model's attention heads, but {model} "
                         f"names none (num_attention_heads in config.json); use 1")
    if heads % size:
        fits = [d for d in range(1, heads + 1) if heads % d == 0 and d <= 64]
        raise ValueError(f"generation.tensor_parallel_size: expected a divisor of the {heads} attention heads of "
                         f"{model} (one of {fits}), got {size}; on a cluster it is the pipeline's generation_gpus")


def check_model_folder(size: int, folder: Path) -> None:
    """`check_tensor_parallel` against the config.json of the model folder `folder`."""
    if size == 1:
        return
    path = Path(folder) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as err:
        raise ValueError(f"generation.tensor_parallel_size: cannot read the model's {path}: {err}") from None
    check_tensor_parallel(size, attention_heads(config if isinstance(config, dict) else {}), str(folder))
