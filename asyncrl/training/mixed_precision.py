"""The trainer's mixed precision: which dtype its matrix products compute in (`training.matmul_dtype`).

What it owns: the choice (`resolve_autocast`: "float32", "bfloat16", or "auto" = bfloat16 where the hardware
multiplies bf16 matrices natively), the context the trainer runs its model under (`autocast_context`), and the
attention function the model uses under autocast (`FLOAT32_SDPA`).

Under "bfloat16" the model's matrix products run in bfloat16 through `torch.autocast`; the weights, their gradients
and the optimizer state stay float32, and the trainer takes log-softmax of float32 logits. Attention stays float32:
the model is switched to `FLOAT32_SDPA`, PyTorch's SDPA on float32 query, key and value. Measured on this project's
2-core Xeon (AMX-BF16) on the default job's batch (256 rows of 11 tokens, tiny Qwen2, one thread): forward and
backward 90 ms in float32, 67 ms under bf16 autocast with float32 attention, 127 ms with bf16 attention (the CPU
flash-attention kernel's bf16 backward alone took 31 ms a call).

What it changes: the trainer's log-probs move away from a float32 forward's by up to a few 1e-2. `prox =
logp.detach()` stays exact (both come from the same forward); the engine's float32 behaviour log-probs differ from
prox by that much more, which the decoupled loss's weight `w = exp(prox − behav)` absorbs (docs/algorithms.md). On
the default job the per-token gap `train/behav_prox_abs_diff` is dominated by the step of staleness: mean 0.019-0.020
in bf16 against 0.020-0.021 in float32, smallest 0.005 against 0 (docs/data_plane.md).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from functools import lru_cache
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

FLOAT32_SDPA = "asyncrl_sdpa_float32"
MATMUL_DTYPES = ("float32", "bfloat16", "auto")


@lru_cache(maxsize=1)
def cpu_has_native_bf16(cpuinfo: str = "/proc/cpuinfo") -> bool:
    """True when the CPU's flags list AMX-BF16 (bf16 matrix tiles), where oneDNN's bf16 GEMM beats float32 ~6×
    (measured here: 1,085 against 177 GFLOP/s on one core); False elsewhere, and where the file is unreadable."""
    try:
        text = Path(cpuinfo).read_text()
    except OSError:
        return False
    return any(line.startswith("flags") and "amx_bf16" in line.split() for line in text.splitlines())


def resolve_autocast(matmul_dtype: str, device: torch.device) -> bool:
    """Whether the trainer runs under bf16 autocast for `training.matmul_dtype` on `device`."""
    if matmul_dtype not in MATMUL_DTYPES:
        raise ValueError(f"training.matmul_dtype: expected one of {', '.join(MATMUL_DTYPES)}, got {matmul_dtype!r}")
    if matmul_dtype != "auto":
        return matmul_dtype == "bfloat16"
    if device.type == "cuda":
        return bool(torch.cuda.is_bf16_supported())
    return device.type == "cpu" and cpu_has_native_bf16()


def register_float32_sdpa() -> str:
    """Register (once) `FLOAT32_SDPA` with Hugging Face's attention and mask interfaces; return its name."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def attention(module: torch.nn.Module, query: Tensor, key: Tensor, value: Tensor, attention_mask: Tensor | None,
                  **kwargs: Any) -> tuple[Tensor, Tensor | None]:
        with torch.autocast(query.device.type, enabled=False):
            out, weights = sdpa_attention_forward(module, query.float(), key.float(), value.float(), attention_mask,
                                                  **kwargs)
        return out.to(query.dtype), weights

    if FLOAT32_SDPA not in AttentionInterface._global_mapping:
        AttentionInterface.register(FLOAT32_SDPA, attention)
    if FLOAT32_SDPA not in AttentionMaskInterface._global_mapping:
        # Without a mask function of the same name, create_causal_mask returns None and padding would be attended.
        AttentionMaskInterface.register(FLOAT32_SDPA, sdpa_mask)
    return FLOAT32_SDPA


@contextlib.contextmanager
def autocast_context(enabled: bool, device: torch.device) -> Iterator[None]:
    """bf16 autocast on `device` when `enabled`, else nothing."""
    if not enabled:
        yield
        return
    with torch.autocast(device.type, dtype=torch.bfloat16):
        yield
