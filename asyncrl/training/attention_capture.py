"""Banded attention statistics of chosen layers, captured during one ordinary forward pass.

Owns: `choose_layers` (which layers to watch) and `AttentionCapture`, a context manager that, while
active, routes a Hugging Face model's attention through a registered wrapper (transformers'
`AttentionInterface`). The wrapper returns exactly what the delegate implementation (sdpa or eager)
returns, so outputs and gradients are unchanged; for the chosen layers it also computes, from detached
post-RoPE q and k, under `torch.no_grad()`, a chunk of query rows at a time (never a full N×N map per
layer):
- `span_sums[s, h, t] = Σ_{s'} A[t, s']·(t − s')`
- `band[s, h, t, d] = A[t, t − d]` for d < D (0 where t − d < 0),
with A = softmax(q kᵀ·scaling + mask) in float32, kv heads repeated for GQA.

Invariants:
- Stats are float32, detached, on the model's device; heads are layer-major in the order `layers` was
  given: stacked index = position_of_layer · H + head.
- Masking is the model's own mask (padding + causal, sliding window if any): keys beyond a sample's
  length never receive weight in a valid row. Rows of padding positions (whose own key is masked) are
  set to 0.
- A layer run twice inside the context (e.g. activation-checkpoint recompute) overwrites its stats.
- The previous attention implementation is restored on exit, also when the body raises.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from types import TracebackType
from typing import Any

import torch
from torch import Tensor, nn
from transformers import AttentionInterface, PreTrainedModel
from transformers.masking_utils import AttentionMaskInterface, eager_mask, sdpa_mask
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

log = logging.getLogger(__name__)

_IMPL_PREFIX = "asyncrl_capture_"
_HOOK_ATTR = "_asyncrl_attention_capture"
_MASKS: dict[str, Callable[..., Any]] = {"sdpa": sdpa_mask, "eager": eager_mask}


def choose_layers(num_layers: int, count: int = 5) -> list[int]:
    """`count` layers spread evenly over ⌊L/3⌋…⌊2L/3⌋ inclusive (rounded half up), deduplicated, sorted.

    Fewer than `count` when the range is small: L = 2 → [0, 1]; L = 24 → [8, 10, 12, 14, 16]. With
    count = 1 the middle of the range (rounded down).
    """
    if num_layers < 1:
        raise ValueError(f"num_layers: expected >= 1, got {num_layers}")
    if count < 1:
        raise ValueError(f"count: expected >= 1, got {count}")
    lo, hi = num_layers // 3, (2 * num_layers) // 3
    hi = min(hi, num_layers - 1)
    if count == 1:
        return [(lo + hi) // 2]
    span, steps = hi - lo, count - 1
    picked = {lo + (2 * i * span + steps) // (2 * steps) for i in range(count)}
    return sorted(picked)


def _eager_delegate(module: nn.Module) -> Callable[..., Any]:
    fn = getattr(sys.modules[type(module).__module__], "eager_attention_forward", None)
    if fn is None:
        raise RuntimeError(f"{type(module).__name__}: its modeling module has no eager_attention_forward")
    return fn


def _capturing_attention(base: str) -> Callable[..., Any]:
    """An attention function that delegates to `base` and feeds the capture hooked on the module."""

    def attention(
        module: nn.Module,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        attention_mask: Tensor | None,
        **kwargs: Any,
    ) -> tuple[Tensor, Tensor | None]:
        capture = getattr(module, _HOOK_ATTR, None)
        if capture is not None:
            scaling = kwargs.get("scaling")
            if scaling is None:
                scaling = query.shape[-1] ** -0.5
            capture._record(module, query, key, attention_mask, float(scaling))
        delegate = ALL_ATTENTION_FUNCTIONS["sdpa"] if base == "sdpa" else _eager_delegate(module)
        return delegate(module, query, key, value, attention_mask, **kwargs)

    return attention


def _register(base: str) -> str:
    """Register (once) the capturing attention + mask functions for `base`; return their name."""
    name = _IMPL_PREFIX + base
    if name not in ALL_ATTENTION_FUNCTIONS._global_mapping:
        AttentionInterface.register(name, _capturing_attention(base))
    if name not in AttentionMaskInterface._global_mapping:
        # Without a registered mask function, create_causal_mask returns None: padding would be ignored.
        AttentionMaskInterface.register(name, _MASKS[base])
    return name


@torch.no_grad()
def layer_stats(
    query: Tensor, key: Tensor, mask: Tensor | None, scaling: float, band: int, row_chunk: int
) -> tuple[Tensor, Tensor]:
    """(span_sums [B, H, Tq], bands [B, H, Tq, band]) of one layer, computed a chunk of rows at a time (at most
    `row_chunk` query rows of all heads at once: several short samples together, or part of one long one).

    query [B, H, Tq, hd], key [B, Hkv, Tk, hd] (H a multiple of Hkv; query row i sits at position
    Tk − Tq + i), mask None (plain causal) or [B|1, 1|H, Tq, Tk], bool (True = attend) or additive float
    (a value ≤ finfo.min / 2 = masked; other values are treated as allowed, no bias is added).
    """
    b_count, heads, tq, _ = query.shape
    tk = key.shape[2]
    if heads % key.shape[1]:
        raise ValueError(f"key: {key.shape[1]} kv heads do not divide {heads} query heads")
    n_rep = heads // key.shape[1]
    dev = query.device
    spans = torch.zeros(b_count, heads, tq, dtype=torch.float32, device=dev)
    bands = torch.zeros(b_count, heads, tq, band, dtype=torch.float32, device=dev)
    allowed_all = None
    if mask is not None:
        allowed_all = mask if mask.dtype == torch.bool else mask > torch.finfo(mask.dtype).min / 2
    kpos = torch.arange(tk, device=dev)
    offsets = torch.arange(band, device=dev)
    neg = torch.finfo(torch.float32).min
    keys = key.detach().float().repeat_interleave(n_rep, dim=1)  # [B, H, Tk, hd]
    for r0 in range(0, tq, row_chunk):
        r1 = min(tq, r0 + row_chunk)
        c = r1 - r0
        qpos = torch.arange(r0, r1, device=dev) + (tk - tq)  # [c]
        dist = (qpos.unsqueeze(1) - kpos.unsqueeze(0)).clamp(min=0).float()  # [c, Tk]
        idx = qpos.unsqueeze(1) - offsets.unsqueeze(0)  # [c, D]
        per_chunk = max(1, row_chunk // c)  # samples at a time: at most ~row_chunk query rows in flight
        for b0 in range(0, b_count, per_chunk):
            b1 = min(b_count, b0 + per_chunk)
            scores = torch.matmul(query[b0:b1, :, r0:r1].detach().float(), keys[b0:b1].transpose(-1, -2)) * scaling
            if allowed_all is None:
                allowed = (kpos.unsqueeze(0) <= qpos.unsqueeze(1)).view(1, 1, c, tk)
            else:
                rows = slice(b0, b1) if allowed_all.shape[0] > 1 else slice(0, 1)
                allowed = allowed_all[rows, :, r0:r1]  # [bc|1, 1|H, c, Tk]
            probs = scores.masked_fill(~allowed, neg).softmax(-1)  # [bc, H, c, Tk]
            own = allowed.gather(-1, qpos.view(1, 1, c, 1).expand(allowed.shape[0], allowed.shape[1], c, 1))
            probs = probs * own  # padding rows → 0
            spans[b0:b1, :, r0:r1] = (probs * dist).sum(-1)
            vals = probs.gather(-1, idx.clamp(min=0).expand(b1 - b0, heads, c, band))
            bands[b0:b1, :, r0:r1] = vals * (idx >= 0)
    return spans, bands


def _unwrap(model: nn.Module) -> PreTrainedModel:
    """The HF model inside a DeepSpeed engine / DDP wrapper (following `.module`)."""
    inner: Any = model
    while not isinstance(inner, PreTrainedModel) and isinstance(getattr(inner, "module", None), nn.Module):
        inner = inner.module
    if not isinstance(inner, PreTrainedModel):
        raise TypeError(f"model: expected a transformers PreTrainedModel or a wrapper of one, got {type(model)}")
    return inner


class AttentionCapture:
    """Context manager capturing `span_sums` [S, Hs, T] and `bands` [S, Hs, T, band] of `layers`.

    Usage: `with AttentionCapture(model, layers, band=D) as cap: out = model(input_ids=…, attention_mask=…)`
    then read `cap.span_sums`, `cap.bands` (valid after the forward, also after exit).
    """

    def __init__(self, model: nn.Module, layers: Sequence[int], band: int = 101, row_chunk: int = 256) -> None:
        if band < 1:
            raise ValueError(f"band: expected >= 1, got {band}")
        if row_chunk < 1:
            raise ValueError(f"row_chunk: expected >= 1, got {row_chunk}")
        if len(set(layers)) != len(layers) or not layers:
            raise ValueError(f"layers: expected distinct layer indices, got {list(layers)}")
        self.model = _unwrap(model)
        self.layers = [int(x) for x in layers]
        self.band = band
        self.row_chunk = row_chunk
        self._stats: dict[int, tuple[Tensor, Tensor]] = {}
        self._modules: list[nn.Module] = []
        self._previous: str | None = None

    def _attention_modules(self) -> list[nn.Module]:
        found: dict[int, nn.Module] = {}
        for mod in self.model.modules():
            idx = getattr(mod, "layer_idx", None)
            if idx in self.layers and hasattr(mod, "num_key_value_groups"):
                if idx in found:
                    raise RuntimeError(f"layers: two attention modules claim layer_idx {idx}")
                found[idx] = mod
        missing = [x for x in self.layers if x not in found]
        if missing:
            raise ValueError(f"layers: no attention module with layer_idx {missing} in {type(self.model).__name__}")
        return [found[x] for x in self.layers]

    def __enter__(self) -> AttentionCapture:
        self._stats.clear()
        modules = self._attention_modules()
        previous = self.model.config._attn_implementation
        base = previous if previous in _MASKS else "sdpa"
        if base != previous:
            log.warning("attention capture delegates to sdpa (the model was on %r)", previous)
        self.model.set_attn_implementation(_register(base))
        self._previous = previous
        for mod in modules:
            setattr(mod, _HOOK_ATTR, self)
        self._modules = modules
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        try:
            for mod in self._modules:
                if hasattr(mod, _HOOK_ATTR):
                    delattr(mod, _HOOK_ATTR)
            self._modules = []
        finally:
            if self._previous is not None:
                self.model.set_attn_implementation(self._previous)
                self._previous = None

    def _record(self, module: nn.Module, query: Tensor, key: Tensor, mask: Tensor | None, scaling: float) -> None:
        self._stats[int(module.layer_idx)] = layer_stats(query, key, mask, scaling, self.band, self.row_chunk)

    @property
    def captured_layers(self) -> list[int]:
        """Layer indices that have stats (in capture order); only chosen layers can appear."""
        return list(self._stats)

    def _stacked(self, which: int) -> Tensor:
        missing = [x for x in self.layers if x not in self._stats]
        if missing:
            raise RuntimeError(f"no attention captured for layers {missing}: run the forward inside the context")
        return torch.cat([self._stats[x][which] for x in self.layers], dim=1)

    @property
    def span_sums(self) -> Tensor:
        """[S, len(layers)·H, T] float32: `Σ_s A[t,s]·(t−s)` per head (layer-major)."""
        return self._stacked(0)

    @property
    def bands(self) -> Tensor:
        """[S, len(layers)·H, T, band] float32: `A[t, t−d]` per head (layer-major)."""
        return self._stacked(1)
