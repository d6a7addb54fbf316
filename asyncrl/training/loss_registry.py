"""The loss registry: a loss name → its parameter class (`asyncrl.config.loss_params`) and its token-loss function.

A token-loss function takes the validated parameters and the `LossInputs` of a batch and returns a `TokenLoss`
(ℓ_t on every position, with its diagnostics); `policy_loss` masks and aggregates it. The built-in losses are
registered here; `register_loss` adds your own (docs/extending.md, "Your own loss"), selected with
`training.loss: <name>` (or `package.module:name`, whose module registers it) and its parameters in
`training.loss_params`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, TypeVar

from asyncrl.config.loss_params import (
    CISPOParams,
    DecoupledPPOParams,
    GSPOParams,
    LossParams,
    PPOParams,
    TISParams,
    TOPRParams,
    register_loss_params,
)
from asyncrl.training.token_losses import (
    LossInputs,
    TokenLoss,
    cispo_token_loss,
    decoupled_ppo_token_loss,
    gspo_token_loss,
    ppo_token_loss,
    tis_token_loss,
    topr_token_loss,
)

__all__ = ["LossInputs", "TokenLoss", "TokenLossFn", "register_loss", "token_loss_of"]

P = TypeVar("P", bound=LossParams)
TokenLossFn = Callable[[Any, LossInputs], TokenLoss]
"""`fn(params, inputs) -> TokenLoss`, params being an instance of the loss's parameter class."""


def _ppo(p: PPOParams, x: LossInputs) -> TokenLoss:
    return ppo_token_loss(x.logp, x.prox, x.adv, p.clip_low, p.clip_high, p.dual_clip)


def _decoupled_ppo(p: DecoupledPPOParams, x: LossInputs) -> TokenLoss:
    return decoupled_ppo_token_loss(x.logp, x.prox, x.behav, x.adv, p.clip_low, p.clip_high, p.w_max, p.w_mask,
                                    p.dual_clip)


def _tis(p: TISParams, x: LossInputs) -> TokenLoss:
    return tis_token_loss(x.logp, x.behav, x.adv, p.tis_cap)


def _cispo(p: CISPOParams, x: LossInputs) -> TokenLoss:
    return cispo_token_loss(x.logp, x.behav, x.adv, p.eps_low, p.eps_high, p.unified_mask)


def _topr(p: TOPRParams, x: LossInputs) -> TokenLoss:
    return topr_token_loss(x.logp, x.behav, x.adv, x.positive, p.pos_weight, p.neg_weight)


def _gspo(p: GSPOParams, x: LossInputs) -> TokenLoss:
    if x.mask is None:
        raise ValueError("gspo: needs LossInputs.mask (the trained tokens) to form each sample's ratio")
    return gspo_token_loss(x.logp, x.prox, x.adv, x.mask, p.clip_low, p.clip_high)


# keyed by the parameter class: the names live once, in asyncrl.config.loss_params
_FUNCTIONS: dict[type[LossParams], TokenLossFn] = {
    PPOParams: _ppo, DecoupledPPOParams: _decoupled_ppo, TISParams: _tis, CISPOParams: _cispo, TOPRParams: _topr,
    GSPOParams: _gspo,
}


def register_loss(name: str, params: type[P]) -> Callable[[Callable[[P, LossInputs], TokenLoss]],
                                                          Callable[[P, LossInputs], TokenLoss]]:
    """Decorator: register the token-loss function of loss `name`, whose parameters are `params` (a subclass of
    `LossParams`, used by this loss alone). ValueError on a taken name or a class another loss already uses."""

    def add(fn: Callable[[P, LossInputs], TokenLoss]) -> Callable[[P, LossInputs], TokenLoss]:
        if not callable(fn):
            raise ValueError(f"loss {name!r}: expected a function (params, inputs) -> TokenLoss, got {fn!r}")
        if isinstance(params, type) and _FUNCTIONS.get(params, fn) is not fn:
            raise ValueError(f"loss {name!r}: {params.__name__} is already the parameter class of another loss; "
                             f"give each loss its own class")
        register_loss_params(name, params)
        _FUNCTIONS[params] = fn
        return fn

    return add


def token_loss_of(params: LossParams, inputs: LossInputs) -> TokenLoss:
    """ℓ_t of the loss whose parameters are `params`, with its diagnostics, on every position (callers mask)."""
    fn = _FUNCTIONS.get(type(params))
    if fn is None:
        raise ValueError(f"no loss function for {type(params).__name__}; register it with register_loss")
    return fn(params, inputs)
