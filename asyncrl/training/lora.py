"""LoRA on the trainer's side: checking `training.lora` against the model, injecting the adapters (peft), and naming
them for pushes and checkpoints (`asyncrl.adapters.lora`). docs/algorithms.md §8.

peft's `inject_adapter_in_model` replaces each target `nn.Linear` of the Hugging Face model in place by a LoRA layer
(`base_layer` + `lora_A` + `lora_B`, B zero so the first policy is the base model) and freezes every other parameter;
the model keeps its class, its forward and its other parameter names, so the trainer runs it as any causal LM.

Invariants: after `inject`, the trainable parameters are exactly the adapters' A and B (`adapter_params`, in
`named_parameters` order, wire-named), and a target that names no linear layer of the model or a rank above a
target's smaller dimension is refused before anything is changed, with the field named.
"""

from __future__ import annotations

import torch

from asyncrl.adapters.lora import wire_name
from asyncrl.config.schema import LoraConfig

__all__ = ["adapter_params", "check_targets", "inject", "target_linears"]


def target_linears(model: torch.nn.Module, targets: list[str] | None = None) -> dict[str, torch.nn.Linear]:
    """The model's `nn.Linear` modules inside its decoder layers whose last name part is in `targets` (None: all of
    them), by name."""
    return {name: m for name, m in model.named_modules()
            if isinstance(m, torch.nn.Linear) and ".layers." in f".{name}"
            and (targets is None or name.rsplit(".", 1)[-1] in targets)}


def check_targets(model: torch.nn.Module, cfg: LoraConfig) -> None:
    """ValueError naming `training.lora.target_modules` (a target that names no linear layer of the decoder layers)
    or `training.lora.rank` (a rank above a target's smaller dimension)."""
    found = target_linears(model, cfg.target_modules)
    names = {n.rsplit(".", 1)[-1] for n in found}
    missing = [t for t in cfg.target_modules if t not in names]
    if missing:
        linears = sorted({n.rsplit(".", 1)[-1] for n in target_linears(model)})
        raise ValueError(f"training.lora.target_modules: {missing} name no linear layer of the model's decoder "
                         f"layers; it has {linears}")
    for name, m in found.items():
        smaller = min(m.in_features, m.out_features)
        if cfg.rank > smaller:
            raise ValueError(f"training.lora.rank: {cfg.rank} is above the smaller dimension ({smaller}) of {name} "
                             f"({m.out_features} x {m.in_features}); expected at most {smaller}")


def inject(model: torch.nn.Module, cfg: LoraConfig) -> torch.nn.Module:
    """The model with adapters on `cfg.target_modules` (checked first: `check_targets`), every other parameter
    frozen; the same object, changed in place."""
    from peft import LoraConfig as PeftLoraConfig
    from peft import inject_adapter_in_model

    check_targets(model, cfg)
    peft_cfg = PeftLoraConfig(r=cfg.rank, lora_alpha=cfg.alpha, lora_dropout=cfg.dropout,
                              target_modules=list(cfg.target_modules), bias="none")
    model = inject_adapter_in_model(peft_cfg, model)
    for name, p in model.named_parameters():
        p.requires_grad_(wire_name(name) is not None)
    return model


def adapter_params(model: torch.nn.Module) -> list[tuple[str, torch.nn.Parameter]]:
    """The adapters' parameters with their wire names (`<module>.lora_A`, `<module>.lora_B`), in model order."""
    out = []
    for name, p in model.named_parameters():
        wire = wire_name(name)
        if wire is not None:
            out.append((wire, p))
    return out
