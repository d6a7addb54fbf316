"""A generation worker's LoRA support: the base weights of the adapted layers, and the merge of each adapter pushed.

A server started with LoRA support (`--lora-scale s`, from `training.lora`) serves `W' = W + s·B·A` on every adapted
layer. The trainer pushes only A and B (`asyncrl.adapters.lora`); the worker turns them into the adapted layers'
Hugging Face weights with `merged_weights` and loads those as it loads any pushed weight. It keeps the base weights of
the layers an adapter has named (read once from the model folder's safetensors files, float32), so every merge starts
from the base: nothing accumulates from one version to the next.

Why merge instead of vLLM's own LoRA serving: a request served with a vLLM LoRA adapter is bound to that adapter, so a
new adapter version could not reach the requests in flight, and asyncrl's partial rollout (requests go on across a
weight update, each token labelled with the version that produced it) would break. Merged weights keep that contract
unchanged, and vLLM runs them at full speed (no LoRA kernels on the decode path).

Invariant: `merge` raises, changing nothing, when the adapter names a layer the model folder does not have or its
shapes do not chain; the base tensors are never written.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from pathlib import Path

import torch
from torch import Tensor

from asyncrl.adapters.lora import adapter_pairs, merged_weights
from asyncrl.adapters.safetensors_folder import read_folder_tensors

log = logging.getLogger(__name__)

__all__ = ["LoraMerger", "cast_like"]


class LoraMerger:
    """The base weights of adapted layers (loaded on first use) and the merge of an adapter into them."""

    def __init__(self, model_dir: str | Path, scale: float) -> None:
        if not scale > 0:
            raise ValueError(f"lora scale: expected > 0 (training.lora.alpha / rank), got {scale}")
        self.model_dir = Path(model_dir)
        self.scale = float(scale)
        self.base: dict[str, Tensor] = {}
        self._lock = threading.Lock()  # the staging thread and an update in the pause may both merge

    def merge(self, items: Iterable[tuple[str, Tensor]]) -> list[tuple[str, Tensor]]:
        """The adapted layers' weights `base + s·B·A` (HF names) for an adapter's wire-named tensors."""
        pairs = adapter_pairs(items)
        with self._lock:
            need = [f"{m}.weight" for m in pairs if f"{m}.weight" not in self.base]
            if need:
                try:
                    loaded = read_folder_tensors(self.model_dir, need)
                except KeyError as e:
                    raise ValueError(f"LoRA adapter: {e.args[0]}; the adapter names a layer the served model does "
                                     f"not have") from None
                self.base.update((n, t.float()) for n, t in loaded)
                log.info("LoRA: %d base weights of adapted layers kept (%.0f MB)", len(self.base),
                         sum(t.numel() * 4 for t in self.base.values()) / 1e6)
            return merged_weights(self.base, pairs, self.scale)


def cast_like(items: list[tuple[str, Tensor]], dtype: torch.dtype) -> list[tuple[str, Tensor]]:
    """`items` cast to the served dtype (merges are computed in float32)."""
    return [(n, t if t.dtype == dtype else t.to(dtype)) for n, t in items]
