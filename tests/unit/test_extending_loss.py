"""The "Your own loss" example of docs/extending.md ("Your own loss") runs as written: its module registers the loss, its
YAML selects it by import path, and the policy loss it gives is the hand-computed one."""

from __future__ import annotations

import math
import re
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch

from asyncrl.config import ConfigError, load_config, loss_params
from asyncrl.training import loss_registry
from asyncrl.training.losses import per_token_loss, policy_loss

DOC = Path(__file__).resolve().parents[2] / "docs" / "extending.md"
LN = math.log


def _block(language: str) -> str:
    name = {"python": "loss", "yaml": "loss-config"}[language]
    blocks = re.findall(rf"<!-- example: {name} -->\n```{language}\n(.*?)```", DOC.read_text(), flags=re.S)
    assert len(blocks) == 1, f"expected one {name} example in {DOC.name}, found {len(blocks)}"
    return blocks[0]


@pytest.fixture
def my_losses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Path]:
    """The doc's module, written as my_losses.py on sys.path, and its YAML; the registrations it makes are undone
    afterwards (the registries are copies for the test), so other tests see the built-in losses only."""
    (tmp_path / "my_losses.py").write_text(_block("python"))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.setattr(loss_params, "_REGISTRY", dict(loss_params._REGISTRY))
    monkeypatch.setattr(loss_registry, "_FUNCTIONS", dict(loss_registry._FUNCTIONS))
    config = tmp_path / "config.yaml"
    config.write_text(_block("yaml"))
    yield config
    sys.modules.pop("my_losses", None)


def test_the_documented_loss_is_selected_and_computes_its_formula(my_losses: Path) -> None:
    cfg = load_config(my_losses).training
    assert "my_losses" in sys.modules and cfg.loss == "my_losses:clipped_reinforce"
    assert type(cfg.loss_params).__name__ == "ClippedReinforceParams"
    assert (cfg.loss_params.scale, cfg.loss_params.cap) == (0.5, 2.0)
    # ratio exp(logp - behav) = [3, 0.5], cap 2: weight [2, 0.5]; A = [1, 2], scale 0.5:
    # ℓ = -0.5·w·A·logp = [-0.5·2·1·-0.5, -0.5·0.5·2·-1] = [0.5, 0.5]; seq-mean-token-mean = 0.5;
    # dℓ/dlogp = -0.5·w·A = [-1, -0.5], over 2 tokens: [-0.5, -0.25].
    logp = torch.tensor([[-0.5, -1.0]], requires_grad=True)
    behav = logp.detach() - torch.tensor([[LN(3.0), LN(0.5)]])
    adv = torch.tensor([[1.0, 2.0]])
    loss, metrics = policy_loss(cfg, logp, logp.detach(), behav, adv, torch.ones(1, 2), torch.ones(1))
    loss.backward()
    assert loss.item() == pytest.approx(0.5, abs=1e-6)
    assert torch.allclose(logp.grad, torch.tensor([[-0.5, -0.25]]), atol=1e-6)
    assert metrics["capped_fraction"] == pytest.approx(0.5) and metrics["iw_max"] == pytest.approx(3.0, abs=1e-5)
    ell = per_token_loss("clipped_reinforce", logp.detach(), logp.detach(), behav, adv, torch.ones(1, 2), scale=0.5)
    assert torch.allclose(ell, torch.tensor([[0.5, 0.5]]), atol=1e-6)


def test_its_parameters_are_checked_by_its_class(my_losses: Path) -> None:
    with pytest.raises(ConfigError, match=r"training\.loss_params\.cap: Input should be greater than 0 \(got -1\)"):
        load_config(my_losses, ["training.loss_params.cap=-1"])
    with pytest.raises(ConfigError, match=r"training\.loss_params\.eps_high: unknown parameter of loss "
                                          r"'my_losses:clipped_reinforce'; it takes \['cap', 'scale'\]"):
        load_config(my_losses, ["training.loss_params.eps_high=4"])
    with pytest.raises(ConfigError, match="did not register a loss 'other'"):
        load_config(my_losses, ["training.loss=my_losses:other"])
