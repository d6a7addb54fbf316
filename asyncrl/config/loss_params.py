"""The parameters of each policy loss (docs/algorithms.md §3), one class per loss, and the registry of loss names.

Each class owns its parameters' defaults, bounds and checks; `training.loss` names the loss and
`training.loss_params` holds its parameters, validated against that loss's class. The registry maps a loss name to
its parameter class; `asyncrl.training.losses.register_loss` adds a loss (its class here, its token-loss function
there), so the config is validated without importing torch. `training.loss` may also be an import path
`package.module:name`: the module is imported wherever the config is validated, and must register `name`.
"""

from __future__ import annotations

import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from asyncrl.plugins import import_module_of

__all__ = ["BUILTIN_LOSSES", "CISPOParams", "DecoupledPPOParams", "GSPOParams", "LossParams", "MOVED_KEYS", "PPOParams",
           "TISParams", "TOPRParams", "loss_params_class", "parse_loss_params", "register_loss_params",
           "registered_losses", "resolve_loss"]


class LossParams(BaseModel):
    """The base of every loss's parameters: unknown parameters are errors, assignments are validated."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True)


class PPOParams(LossParams):
    """ppo (docs/algorithms.md §3): `ℓ = −min(r·A, clip(r, 1−ε_lo, 1+ε_hi)·A)`, optionally dual-clipped."""

    clip_low: float = Field(0.2, ge=0, lt=1, description="ε_lo of the ratio clip.")
    clip_high: float = Field(0.2, ge=0, description="ε_hi of the ratio clip.")
    dual_clip: float | None = Field(None, gt=1, description="c: for A < 0, ℓ = min(ℓ, −c·A) (null: off; 3 is usual).")


class DecoupledPPOParams(PPOParams):
    """decoupled_ppo (docs/algorithms.md §3): the ppo term against the proximal policy, weighted by
    `sg(min(w, w_max))`, `w = π_prox/π_behav`; or, with `w_mask`, tokens whose w leaves [lo, hi] are dropped."""

    w_max: float = Field(2.0, gt=0, description="Cap on w = π_prox/π_behav.")
    w_mask: tuple[float, float] | None = Field(None, description="Drop tokens with w outside [lo, hi] instead of "
                                               "capping (0 <= lo < 1 < hi).")

    @model_validator(mode="after")
    def _w_mask_straddles_one(self) -> DecoupledPPOParams:
        if self.w_mask is not None:
            lo, hi = self.w_mask
            if not 0 <= lo < 1 < hi:
                raise ValueError(f"w_mask: expected [lo, hi] with 0 <= lo < 1 < hi, got {list(self.w_mask)}")
        return self


class TISParams(LossParams):
    """tis (docs/algorithms.md §3): `ℓ = −sg(clamp(exp(logp − behav), 0, c)) · A · logp`."""

    tis_cap: float = Field(2.0, gt=0, description="c: the cap of the importance weight.")


class CISPOParams(LossParams):
    """cispo (docs/algorithms.md §3): `ℓ = −sg(clamp(exp(logp − behav), 1−ε_lo, 1+ε_hi)) · A · logp`."""

    eps_low: float = Field(0.1, ge=0, lt=1, description="ε_lo of the weight's clamp.")
    eps_high: float = Field(0.1, ge=0, description="ε_hi of the weight's clamp (4 is common too).")
    unified_mask: bool = Field(False, description="Drop tokens with A > 0 and ratio > 1+ε_hi, or A < 0 and ratio < "
                               "1−ε_lo.")


class TOPRParams(LossParams):
    """topr (docs/algorithms.md §3): `−w⁺·A·logp` on samples with reward > 0, else
    `−w⁻·sg(clamp(exp(logp − behav), 0, 1))·A·logp`."""

    pos_weight: float = Field(1.0, ge=0, description="w⁺: the weight of samples with reward > 0.")
    neg_weight: float = Field(1.0, ge=0, description="w⁻: the weight of the other samples.")


class GSPOParams(LossParams):
    """gspo (docs/algorithms.md §7): the sequence-level ratio `s_i = exp(mean_t (logp − prox))`, clipped per sample,
    `ℓ_i = −min(s_i·A_i, clip(s_i, 1−ε_lo, 1+ε_hi)·A_i)`. The clip binds only with several updates a step
    (`training.mini_batches` or `training.epochs`); the engine-side correction is `training.seq_correction`."""

    clip_low: float = Field(3e-4, ge=0, lt=1, description="ε_lo of the sequence ratio's clip (the paper's 3e-4).")
    clip_high: float = Field(4e-4, ge=0, description="ε_hi of the sequence ratio's clip (the paper's 4e-4).")


BUILTIN_LOSSES: dict[str, type[LossParams]] = {
    "ppo": PPOParams, "decoupled_ppo": DecoupledPPOParams, "tis": TISParams, "cispo": CISPOParams, "topr": TOPRParams,
    "gspo": GSPOParams,
}
"""The built-in losses' names and parameter classes (what the configuration reference lists)."""
_REGISTRY: dict[str, type[LossParams]] = dict(BUILTIN_LOSSES)
_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.-]*$")

MOVED_KEYS: dict[str, str] = {
    "clip_low": "clip_low", "clip_high": "clip_high", "dual_clip": "dual_clip", "w_max": "w_max", "w_mask": "w_mask",
    "tis_cap": "tis_cap", "cispo_eps_low": "eps_low", "cispo_eps_high": "eps_high",
    "cispo_unified_mask": "unified_mask", "topr_pos_weight": "pos_weight", "topr_neg_weight": "neg_weight",
}
"""The flat `training` keys of the loss parameters before they moved to `training.loss_params`, to their new names."""


def register_loss_params(name: str, params: type[LossParams]) -> None:
    """Register the parameter class of loss `name` (use `asyncrl.training.losses.register_loss`, which also registers
    its token-loss function). ValueError on a malformed or taken name or a class that is not a LossParams."""
    if not _NAME.match(name):
        raise ValueError(f"loss name {name!r}: expected letters, digits, '_', '.' or '-', starting with a letter "
                         f"or '_'")
    if not (isinstance(params, type) and issubclass(params, LossParams)):
        raise ValueError(f"loss {name!r}: params must be a subclass of asyncrl.config.loss_params.LossParams, "
                         f"got {params!r}")
    if name in _REGISTRY and _REGISTRY[name] is not params:
        raise ValueError(f"loss {name!r}: already registered with {_REGISTRY[name].__name__}")
    _REGISTRY[name] = params


def registered_losses() -> list[str]:
    """The registered loss names, built-in ones first."""
    return list(_REGISTRY)


def resolve_loss(name: str) -> str:
    """The registered name `name` stands for: itself, or for an import path `package.module:loss_name` the loss name
    after importing the module (which registers it). ValueError naming what is wrong."""
    if ":" not in name:
        if name not in _REGISTRY:
            raise ValueError(f"unknown loss {name!r}; expected one of {registered_losses()} or an import path "
                             f"'package.module:name'")
        return name
    module, loss_name = import_module_of(name, "loss", "a registered name or an import path 'package.module:name'")
    module_name = module.__name__
    if loss_name not in _REGISTRY:
        raise ValueError(f"loss {name!r}: module {module_name!r} did not register a loss {loss_name!r} (registered: "
                         f"{registered_losses()}); register it with asyncrl.training.losses.register_loss")
    return loss_name


def loss_params_class(name: str) -> type[LossParams]:
    """The parameter class of loss `name` (a registered name or an import path, see `resolve_loss`)."""
    return _REGISTRY[resolve_loss(name)]


def parse_loss_params(name: str, values: Any, where: str) -> LossParams:
    """`values` (a mapping, None for the defaults, or an instance of the class) as the parameters of loss `name`.

    ValueError with one `where.field: problem` per problem, `where` being how the caller names the parameters
    (e.g. `training.loss_params`).
    """
    cls = loss_params_class(name)
    if isinstance(values, LossParams):
        if type(values) is not cls:
            raise ValueError(f"{where}: expected {cls.__name__} for loss {name!r}, got {type(values).__name__}")
        return values
    try:
        return cls.model_validate({} if values is None else values)
    except ValidationError as err:
        problems = []
        for e in err.errors():
            loc = ".".join(str(p) for p in e["loc"])
            msg = e["msg"].removeprefix("Value error, ")
            if e["type"] == "extra_forbidden":
                problems.append(f"{where}.{loc}: unknown parameter of loss {name!r}; it takes "
                                f"{sorted(cls.model_fields)}")
            elif e["type"] == "model_type":
                problems.append(f"{where}: expected a mapping of the parameters of loss {name!r} "
                                f"({sorted(cls.model_fields)}), got {e.get('input')!r}")
            elif loc:
                problems.append(f"{where}.{loc}: {msg} (got {e.get('input')!r})")
            else:  # a check across the class's fields names its field first
                problems.append(f"{where}.{msg}")
        raise ValueError("; ".join(problems)) from None
