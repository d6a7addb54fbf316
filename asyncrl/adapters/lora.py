"""LoRA adapters as they travel and as they merge (docs/algorithms.md §8, "LoRA"). Pure torch, no I/O.

One target module (a linear layer of the Hugging Face model, e.g. `model.layers.0.self_attn.q_proj`) has an adapter
pair: A (rank x in, Kaiming-uniform at the start) and B (out x rank, zero at the start), and the layer computes
`W' = W + s·B·A` with `s = alpha / rank`. On the wire and in checkpoints a pair is two tensors named
`<module>.lora_A` and `<module>.lora_B` (`wire_name` maps peft's parameter names to these); the scale is not sent:
both sides derive it from `training.lora`.

Invariants: `merged_weights` returns, for every pair, the module's Hugging Face weight name `<module>.weight` and
`base + s·(B @ A)` computed in float32 whatever the dtypes; a pair that is incomplete, or whose shapes do not chain
(B: out x r, A: r x in, base: out x in), is an error naming the module, and nothing is returned.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping

import torch
from torch import Tensor

__all__ = ["A_SUFFIX", "B_SUFFIX", "adapter_pairs", "is_adapter_name", "merged_weights", "wire_name"]

A_SUFFIX = ".lora_A"
B_SUFFIX = ".lora_B"
_PEFT_NAME = re.compile(r"^(?P<module>.+)\.(?P<part>lora_A|lora_B)\.(?P<adapter>[^.]+)\.weight$")


def wire_name(param_name: str) -> str | None:
    """`<module>.lora_A` / `<module>.lora_B` for peft's `<module>.lora_A.<adapter>.weight` (and the same with
    lora_B); None for any other parameter."""
    m = _PEFT_NAME.match(param_name)
    return None if m is None else f"{m['module']}.{m['part']}"


def is_adapter_name(name: str) -> bool:
    """Whether `name` is an adapter tensor's wire name."""
    return name.endswith((A_SUFFIX, B_SUFFIX))


def adapter_pairs(items: Iterable[tuple[str, Tensor]]) -> dict[str, tuple[Tensor, Tensor]]:
    """{module: (A, B)} of wire-named adapter tensors; ValueError on a name that is not an adapter's, a half pair
    or a rank that differs between A and B."""
    a: dict[str, Tensor] = {}
    b: dict[str, Tensor] = {}
    for name, t in items:
        if name.endswith(A_SUFFIX):
            a[name.removesuffix(A_SUFFIX)] = t
        elif name.endswith(B_SUFFIX):
            b[name.removesuffix(B_SUFFIX)] = t
        else:
            raise ValueError(f"LoRA adapter: expected tensors named <module>{A_SUFFIX} or <module>{B_SUFFIX}, "
                             f"got {name!r}")
    half = sorted(set(a) ^ set(b))
    if half:
        raise ValueError(f"LoRA adapter: modules with only one of lora_A and lora_B: {half[:5]}")
    pairs = {}
    for module in sorted(a):
        ta, tb = a[module], b[module]
        if ta.dim() != 2 or tb.dim() != 2 or tb.shape[1] != ta.shape[0]:
            raise ValueError(f"LoRA adapter {module}: expected A (rank x in) and B (out x rank), got A "
                             f"{tuple(ta.shape)} and B {tuple(tb.shape)}")
        pairs[module] = (ta, tb)
    return pairs


def merged_weights(base: Mapping[str, Tensor], pairs: Mapping[str, tuple[Tensor, Tensor]],
                   scale: float) -> list[tuple[str, Tensor]]:
    """`[(<module>.weight, base + scale·(B @ A))]` for every pair, in module order, float32 (module docstring)."""
    out = []
    for module in sorted(pairs):
        ta, tb = pairs[module]
        name = f"{module}.weight"
        w = base.get(name)
        if w is None:
            raise ValueError(f"LoRA adapter {module}: the base model has no weight {name!r}")
        if tuple(w.shape) != (tb.shape[0], ta.shape[1]):
            raise ValueError(f"LoRA adapter {module}: B @ A is {tb.shape[0]} x {ta.shape[1]}, the base weight "
                             f"{tuple(w.shape)}")
        out.append((name, torch.addmm(w.float(), tb.float(), ta.float(), alpha=scale)))
    return out
