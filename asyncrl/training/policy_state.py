"""The policy's checkpointable state under every ZeRO stage: AdamW's moments as flat named tensors, and loading
weights and moments back (checkpoint resume). Used by `asyncrl.training.policy.PolicyTrainer`.

The names are those the trainer gives its trained parameters (`PolicyTrainer._named_params`: every parameter, or the
LoRA adapters' wire names), so a checkpoint holds exactly what trains. Collective under ZeRO-3 (weights) and ZeRO 1-3
(moments): every rank calls these at the same points.

Invariant: the format is the same under every stage (full, unpartitioned moments); `step` = 0 (before the first
optimizer step) loads as zero moments, the same as a fresh AdamW.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import Tensor

__all__ = ["MOMENTS", "load_state", "optimizer_state"]

MOMENTS = ("exp_avg", "exp_avg_sq")
Params = list[tuple[str, torch.nn.Parameter]]


def _base_optimizer(engine: Any, stage: int) -> torch.optim.Optimizer:
    opt = engine.optimizer
    return opt if stage == 0 else opt.optimizer


def _get_moment(base: torch.optim.Optimizer, stage: int, p: torch.nn.Parameter, key: str) -> Tensor:
    if stage == 0:
        return base.state[p][key].detach()
    from deepspeed.utils import safe_get_full_optimizer_state

    t = safe_get_full_optimizer_state(p, key)
    shape = getattr(p, "ds_shape", p.shape)
    return t.reshape(shape)


def optimizer_state(engine: Any, stage: int, params: Params) -> dict[str, Tensor]:
    """AdamW state as flat named tensors: `step` (0-dim) and `exp_avg.<param>`, `exp_avg_sq.<param>`; before the
    first step only `step` = 0."""
    base = _base_optimizer(engine, stage)
    if not base.state:
        return {"step": torch.tensor(0.0)}
    step = float(next(iter(base.state.values()))["step"])
    out = {"step": torch.tensor(step)}
    for name, p in params:
        for key in MOMENTS:
            out[f"{key}.{name}"] = _get_moment(base, stage, p, key).float().cpu().clone().contiguous()
    return out


def load_state(engine: Any, stage: int, device: torch.device, params: Params, model_state: dict[str, Tensor],
               optimizer: dict[str, Tensor] | None = None) -> None:
    """Load a model state (`params`' names to tensors) and, when given, an `optimizer_state` output."""
    names = {n for n, _ in params}
    missing, extra = sorted(names - set(model_state)), sorted(set(model_state) - names)
    if missing or extra:
        raise ValueError(f"model_state: missing parameters {missing[:5]}, unexpected {extra[:5]}")
    for n, p in params:
        shape = tuple(getattr(p, "ds_shape", p.shape))
        if tuple(model_state[n].shape) != shape:
            raise ValueError(f"model_state[{n!r}]: expected shape {shape}, got {tuple(model_state[n].shape)}")
    _load_weights(stage, params, model_state)
    if optimizer is not None:
        _load_optimizer(engine, stage, device, params, optimizer)


def _load_weights(stage: int, params: Params, state: dict[str, Tensor]) -> None:
    import deepspeed
    from deepspeed.utils import safe_set_full_fp32_param

    if stage == 3:
        with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=0), torch.no_grad():
            for n, p in params:
                p.data.copy_(state[n])
    else:
        with torch.no_grad():
            for n, p in params:
                p.data.copy_(state[n])
    if stage > 0:  # the optimizer's fp32 master partitions are separate copies
        for n, p in params:
            safe_set_full_fp32_param(p, state[n].float())


def _load_optimizer(engine: Any, stage: int, device: torch.device, params: Params, state: dict[str, Tensor]) -> None:
    """Overwrite AdamW's moments and step in place (DeepSpeed keeps views into the state tensors)."""
    if "step" not in state:
        raise ValueError("optimizer_state: missing 'step'")
    step = float(state["step"])
    base = _base_optimizer(engine, stage)
    if not base.state:
        _materialise_optimizer_state(engine, device)
    from deepspeed.utils import safe_set_full_optimizer_state

    for n, p in params:
        shape = tuple(getattr(p, "ds_shape", p.shape))
        for key in MOMENTS:
            value = state.get(f"{key}.{n}")
            if value is None:
                if step > 0:
                    raise ValueError(f"optimizer_state: missing {key}.{n}")
                value = torch.zeros(shape)
            if tuple(value.shape) != shape:
                raise ValueError(f"optimizer_state[{key}.{n}]: expected shape {shape}, got {tuple(value.shape)}")
            if stage == 0:
                base.state[p][key].copy_(value)
            else:
                safe_set_full_optimizer_state(p, value.float(), key)
    for s in base.state.values():
        s["step"] = torch.tensor(step)


def _materialise_optimizer_state(engine: Any, device: torch.device) -> None:
    """Create AdamW's lazy state (and DeepSpeed's links to it) with a no-op engine step: zero gradients at lr 0
    leave every weight unchanged; the moments and step are overwritten next."""
    groups = engine.optimizer.param_groups
    lrs = [g["lr"] for g in groups]
    for g in groups:
        g["lr"] = 0.0
    try:
        engine.set_gradient_accumulation_boundary(True)
        ids = torch.zeros((1, 2), dtype=torch.long, device=device)
        logits = engine(input_ids=ids, use_cache=False).logits
        engine.backward(logits.sum() * 0.0, scale_wrt_gas=False)
        engine.step()
    finally:
        for g, lr in zip(groups, lrs, strict=True):
            g["lr"] = lr
