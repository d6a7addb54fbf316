"""The DeepSpeed config dict of the policy trainer, derived from `TrainingConfig`. Pure.

Invariants: `train_batch_size = micro_batch_size · gradient_accumulation_steps · world_size`, the samples
of one optimizer step (a step's batch, or its largest mini-batch with `training.mini_batches` > 1); fp32
(no fp16/bf16 sections: the CPU path trains in fp32); the optimizer is a torch optimizer passed to
`deepspeed.initialize`, so ZeRO needs `zero_allow_untested_optimizer`; gradient clipping is done by
DeepSpeed at the optimizer step.
"""

from __future__ import annotations

from typing import Any

from asyncrl.config.schema import TrainingConfig


def deepspeed_config(cfg: TrainingConfig, batch_size: int | None = None, world_size: int = 1) -> dict[str, Any]:
    """DeepSpeed config for `cfg`; `batch_size` = samples per training step (default: one micro batch).

    The trainer drives the accumulation boundary itself (one per optimizer step: per mini-batch), so the
    accumulation steps here only make the batch arithmetic consistent; a step with a different number of micro
    batches (segmented samples make more rows than samples) is still exact.
    """
    micro = cfg.micro_batch_size
    per_rank = batch_size if batch_size is not None else micro * world_size
    if per_rank % world_size:
        raise ValueError(f"batch_size: expected a multiple of the world size {world_size}, got {per_rank}")
    per_rank = max(1, -(-(per_rank // world_size) // cfg.mini_batches))  # one optimizer step's rows, per rank
    micro = min(micro, per_rank)
    gas = max(1, -(-per_rank // micro))
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    if cfg.zero_stage in (1, 2):
        zero.update(overlap_comm=False, contiguous_gradients=False)
    if cfg.zero_stage == 3:
        zero.update(overlap_comm=False, contiguous_gradients=False, stage3_param_persistence_threshold=0)
    return {
        "train_batch_size": micro * gas * world_size,
        "train_micro_batch_size_per_gpu": micro,
        "gradient_accumulation_steps": gas,
        "gradient_clipping": cfg.grad_clip,
        "zero_optimization": zero,
        "zero_allow_untested_optimizer": True,
        "fp16": {"enabled": False},
        "bf16": {"enabled": False},
        "steps_per_print": 10**9,
        "wall_clock_breakdown": False,
    }
