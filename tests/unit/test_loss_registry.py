"""The loss registry: every built-in loss has its parameter class and its function, registration errors name the
problem, and the loss parameters keep their defaults in one place (their class)."""

from __future__ import annotations

import pytest
import torch
from pydantic import Field

from asyncrl.config import loss_params
from asyncrl.config.loss_params import BUILTIN_LOSSES, LossParams, PPOParams, TISParams, registered_losses
from asyncrl.config.schema import TrainingConfig
from asyncrl.training import loss_registry
from asyncrl.training.losses import LossInputs, TokenLoss, register_loss


@pytest.fixture(autouse=True)
def _own_registries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(loss_params, "_REGISTRY", dict(loss_params._REGISTRY))
    monkeypatch.setattr(loss_registry, "_FUNCTIONS", dict(loss_registry._FUNCTIONS))


def test_every_builtin_loss_has_a_function_and_defaults_from_its_class() -> None:
    assert list(BUILTIN_LOSSES) == ["ppo", "decoupled_ppo", "tis", "cispo", "topr", "gspo"] == registered_losses()
    x = torch.zeros(1, 2)
    inputs = LossInputs(logp=x, prox=x, behav=x, adv=torch.ones(1, 2), positive=torch.zeros(1, 2, dtype=torch.bool),
                        mask=torch.ones(1, 2, dtype=torch.bool))
    for name, cls in BUILTIN_LOSSES.items():
        cfg = TrainingConfig(loss=name)
        assert cfg.loss_params == cls(), name
        assert loss_registry.token_loss_of(cfg.loss_params, inputs).loss.shape == (1, 2), name


def test_registration_errors_name_the_problem() -> None:
    class Scale(LossParams):
        scale: float = Field(1.0, gt=0)

    def plain(p: Scale, x: LossInputs) -> TokenLoss:
        return TokenLoss.plain(-p.scale * x.adv * x.logp)

    with pytest.raises(ValueError, match="'tis': already registered with TISParams"):
        register_loss("tis", Scale)(plain)
    with pytest.raises(ValueError, match="PPOParams is already the parameter class of another loss"):
        register_loss("ppo2", PPOParams)(plain)
    with pytest.raises(ValueError, match="params must be a subclass of .*LossParams"):
        register_loss("mine", dict)(plain)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="loss name 'my loss'"):
        register_loss("my loss", Scale)(plain)
    assert "mine" not in registered_losses() and "ppo2" not in registered_losses()
    register_loss("scaled", Scale)(plain)
    cfg = TrainingConfig(loss="scaled", loss_params={"scale": 2.0})
    inputs = LossInputs(logp=torch.full((1, 2), -1.0), prox=torch.zeros(1, 2), behav=torch.zeros(1, 2),
                        adv=torch.tensor([[1.0, -1.0]]), positive=torch.zeros(1, 2, dtype=torch.bool))
    tok = loss_registry.token_loss_of(cfg.loss_params, inputs)
    assert torch.equal(tok.loss, torch.tensor([[2.0, -2.0]])) and torch.equal(tok.weight, torch.ones(1, 2))
    assert not tok.clipped.any() and not tok.capped.any() and not tok.dropped.any()


def test_a_loss_assigned_after_its_parameters_is_an_error() -> None:
    cfg = TrainingConfig(loss="cispo", loss_params={"eps_high": 4.0})
    with pytest.raises(ValueError, match="training.loss_params: expected the parameters of loss 'tis' \\(TISParams\\)"):
        cfg.loss = "tis"
    assert TrainingConfig(loss="tis", loss_params=TISParams(tis_cap=3.0)).loss_params.tis_cap == 3.0
