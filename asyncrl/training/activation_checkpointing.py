"""Activation (gradient) checkpointing of a Hugging Face model that stays in eval mode (`training.gradient_checkpointing`).

Owns `enable_gradient_checkpointing(model)`: Hugging Face's own checkpointing (`gradient_checkpointing_enable`,
non-reentrant torch checkpoint), with each decoder layer recomputed in the backward pass instead of keeping its
activations. Hugging Face checkpoints a layer only while that layer module is in training mode, and the trainer keeps
its models in eval mode (no dropout: `prox = logp.detach()` is exact, `asyncrl.training.policy`), so the layer
modules alone (`GradientCheckpointingLayer` instances, not their children) are flagged as training: attention,
MLP and dropout submodules stay in eval mode, and the decoder layer's own forward reads no `training` flag.

Invariants: the model's outputs and gradients are those without checkpointing (the recompute runs the same
deterministic ops; RNG state is restored, and nothing random runs in eval mode); call it after the last
`.eval()`/`.train()` on the model, which would reset the layers' flag.
"""

from __future__ import annotations

import torch


def enable_gradient_checkpointing(model: torch.nn.Module) -> int:
    """Checkpoint every decoder layer of the HF `model` (see the module docstring); the number of layers."""
    from transformers.modeling_layers import GradientCheckpointingLayer

    enable = getattr(model, "gradient_checkpointing_enable", None)
    if not callable(enable):
        raise ValueError(f"training.gradient_checkpointing: {type(model).__name__} is not a Hugging Face model with "
                         "gradient checkpointing")
    enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    layers = [m for m in model.modules() if isinstance(m, GradientCheckpointingLayer)]
    if not layers:
        raise ValueError(f"training.gradient_checkpointing: {type(model).__name__} has no checkpointable decoder "
                         "layers (transformers' GradientCheckpointingLayer)")
    for layer in layers:
        layer.training = True  # the layer itself only (Module.train() would recurse into attention and dropout)
    return len(layers)
