"""Sequence-level and token-level importance corrections and GSPO (docs/algorithms.md §7), on hand-computed examples."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.losses import merge_metrics, policy_loss
from asyncrl.training.seq_correction import correction_weights
from asyncrl.training.token_losses import gspo_token_loss

# prox − behav per token; row 0: two trained tokens, row 1: one (a length-1 sample), row 2: none, row 3: three.
# Masked positions hold garbage (5.0, inf, nan) that must never enter.
DIFF = torch.tensor([[0.1, -0.3, 5.0], [0.9, float("inf"), 0.0], [float("nan"), 1.0, 2.0], [0.5, 0.5, 0.5]])
MASK = torch.tensor([[1, 1, 0], [1, 0, 0], [0, 0, 0], [1, 1, 1]], dtype=torch.bool)
BEHAV = torch.full((4, 3), -1.0)
PROX = BEHAV + DIFF
e = math.exp


def _weights(level: str, mode: str, **kw: object) -> list[list[float]]:
    c = correction_weights(PROX, BEHAV, MASK, level, mode, **kw)  # type: ignore[arg-type]
    assert not torch.isnan(c.weight).any()
    return c.weight.tolist()


def _close(got: list[list[float]], want: list[list[float]]) -> None:
    assert torch.allclose(torch.tensor(got), torch.tensor(want), rtol=1e-6, atol=1e-7), (got, want)


def test_token_truncate() -> None:
    _close(_weights("token", "truncate", cap=2.0),
           [[e(0.1), e(-0.3), 0], [2.0, 0, 0], [0, 0, 0], [e(0.5)] * 3])
    c = correction_weights(PROX, BEHAV, MASK, "token", "truncate", cap=2.0)
    assert (c.capped_tokens, c.masked_tokens, c.masked_sequences, c.sequences, c.trained_tokens) == (1, 0, 0, 3, 6)


def test_sequence_truncate_is_the_product_of_the_token_ratios() -> None:
    _close(_weights("sequence", "truncate", cap=2.0),
           [[e(-0.2), e(-0.2), 0], [2.0, 0, 0], [0, 0, 0], [2.0] * 3])  # e(0.9), e(1.5) > 2: capped
    c = correction_weights(PROX, BEHAV, MASK, "sequence", "truncate", cap=2.0)
    assert (c.capped_tokens, c.masked_tokens) == (4, 0)


def test_geometric_mask_keeps_long_samples_near_one() -> None:
    _close(_weights("geometric", "mask", band=(0.5, 2.0)),
           [[e(-0.1), e(-0.1), 0], [0, 0, 0], [0, 0, 0], [e(0.5)] * 3])  # row 1: e(0.9) > 2, masked
    c = correction_weights(PROX, BEHAV, MASK, "geometric", "mask", band=(0.5, 2.0))
    assert (c.masked_tokens, c.masked_sequences, c.sequences) == (1, 1, 3)
    assert c.keep.tolist() == [[True, True, False], [False] * 3, [False] * 3, [True] * 3]


def test_sequence_mask_drops_whole_samples_and_token_mask_single_tokens() -> None:
    _close(_weights("sequence", "mask"), [[e(-0.2), e(-0.2), 0], [0, 0, 0], [0, 0, 0], [0, 0, 0]])
    c = correction_weights(PROX, BEHAV, MASK, "sequence", "mask")
    assert (c.masked_tokens, c.masked_sequences) == (4, 2)
    behav = BEHAV.clone()
    behav[3, 1] = -2.0  # row 3's middle token: w = e(1.5) > 2
    c = correction_weights(PROX, behav, MASK, "token", "mask")
    _close(c.weight.tolist(), [[e(0.1), e(-0.3), 0], [0, 0, 0], [0, 0, 0], [e(0.5), 0, e(0.5)]])
    assert (c.masked_tokens, c.masked_sequences) == (2, 1)  # row 3 keeps two tokens: not a masked sequence


def test_huge_log_ratios_give_finite_weights() -> None:
    prox = torch.tensor([[500.0, 500.0], [-500.0, -500.0]])
    behav = torch.zeros(2, 2)
    mask = torch.ones(2, 2, dtype=torch.bool)
    assert correction_weights(prox, behav, mask, "sequence", "truncate", cap=3.0).weight.tolist() == [[3.0] * 2,
                                                                                                      [0.0] * 2]
    c = correction_weights(prox, behav, mask, "sequence", "mask")
    assert c.weight.tolist() == [[0.0] * 2] * 2 and c.masked_sequences == 2


def test_bad_band_and_cap_name_the_field() -> None:
    with pytest.raises(ValueError, match="training.seq_correction.band"):
        correction_weights(PROX, BEHAV, MASK, "sequence", "mask", band=(1.0, 2.0))
    with pytest.raises(ValueError, match="training.seq_correction.cap"):
        correction_weights(PROX, BEHAV, MASK, "sequence", "truncate", cap=0.0)
    with pytest.raises(ValueError, match=r"band: expected \[lo, hi\]"):
        TrainingConfig(loss="ppo", seq_correction={"band": (0.5, 0.9)})


def _policy_inputs() -> tuple[torch.Tensor, ...]:
    logp = PROX.clone().nan_to_num(0.0).requires_grad_()
    adv = torch.tensor([[1.0] * 3, [-1.0] * 3, [2.0] * 3, [0.5] * 3])
    return logp, adv


def test_policy_loss_with_sequence_mask_on_ppo() -> None:
    """ppo with prox = logp: ℓ_t = −A_t·ρ_i. Row 0 keeps ρ = e(−0.2); rows 1 and 3 are masked; row 2 is empty."""
    cfg = TrainingConfig(loss="ppo", seq_correction={"level": "sequence", "mode": "mask"}, ent_coef=0.1)
    logp, adv = _policy_inputs()
    entropy = torch.ones(4, 3, requires_grad=True)
    loss, metrics = policy_loss(cfg, logp, logp.detach(), BEHAV, adv, MASK.float(), torch.zeros(4), entropy=entropy)
    rho = e(-0.2)
    # pg: (−ρ + 0 + 0) / 3 samples; the entropy bonus only on row 0: 0.1 · (1 / 3)
    assert loss.item() == pytest.approx(-rho / 3 - 0.1 / 3, rel=1e-6)
    loss.backward()
    want = torch.zeros(4, 3)
    want[0, :2] = -rho / 2 / 3
    assert torch.allclose(logp.grad, want, atol=1e-7)
    assert entropy.grad[0, :2].tolist() == pytest.approx([-0.1 / 6] * 2) and not entropy.grad[1:].any()
    assert metrics["corr_masked_sequences_count"] == 2 and metrics["corr_masked_tokens_count"] == 4
    assert metrics["corr_sequences_count"] == 3
    assert metrics["corr_weight_mean"] == pytest.approx(2 * rho / 6, rel=1e-6)
    merged = merge_metrics([metrics, metrics])
    assert merged["corr_masked_sequences_count"] == 4 and merged["corr_weight_mean"] == metrics["corr_weight_mean"]


def test_policy_loss_without_correction_is_unchanged() -> None:
    logp, adv = _policy_inputs()
    plain, _ = policy_loss(TrainingConfig(loss="ppo"), logp, logp.detach(), BEHAV, adv, MASK.float(), torch.zeros(4))
    # −(1 + 1)/2 for row 0, +1 for row 1, −0.5 for row 3; 3 samples
    assert plain.item() == pytest.approx((-1.0 + 1.0 - 0.5) / 3, rel=1e-6)


def test_config_guards_double_correction_and_gspo_aggregation() -> None:
    with pytest.raises(ValueError, match="stack_on_decoupled: true"):
        TrainingConfig(loss="decoupled_ppo", seq_correction={})
    assert TrainingConfig(loss="decoupled_ppo", seq_correction={"stack_on_decoupled": True}).seq_correction
    with pytest.raises(ValueError, match="training.aggregation: loss gspo .*'seq-mean-token-mean'"):
        TrainingConfig(loss="gspo", aggregation="token-mean")
    cfg = TrainingConfig(loss="gspo")
    assert (cfg.loss_params.clip_low, cfg.loss_params.clip_high) == (3e-4, 4e-4)


def test_gspo_token_form_on_hand_computed_samples() -> None:
    """Row 0: logp − prox = (0.2, 0.0), s = e(0.1), A = 1, inside [0.8, 1.2]; row 1: a length-1 sample, s = e(−0.5)
    < 0.8 with A = −1: clipped, ℓ = 0.8, no gradient; row 2: no trained token."""
    prox = torch.tensor([[-1.0, -2.0], [-1.0, 0.0], [-3.0, -3.0]])
    logp = (prox + torch.tensor([[0.2, 0.0], [-0.5, 7.0], [1.0, 1.0]])).requires_grad_()
    mask = torch.tensor([[1, 1], [1, 0], [0, 0]], dtype=torch.bool)
    adv = torch.tensor([[1.0, 1.0], [-1.0, -1.0], [1.0, 1.0]])
    tok = gspo_token_loss(logp, prox, adv, mask, 0.2, 0.2)
    assert tok.weight[:, 0].tolist() == pytest.approx([e(0.1), e(-0.5), 1.0], rel=1e-6)  # no token: s = 1
    assert tok.loss[0].tolist() == pytest.approx([-e(0.1)] * 2, rel=1e-6)
    assert tok.loss[1, 0].item() == pytest.approx(0.8, rel=1e-6)
    assert tok.clipped.tolist() == [[False, False], [True, True], [False, False]]
    (tok.loss * mask).sum(dim=-1).div(mask.sum(-1).clamp(min=1)).sum().backward()
    assert logp.grad[0].tolist() == pytest.approx([-e(0.1) / 2] * 2, rel=1e-6)
    assert logp.grad[1:].abs().sum().item() == 0.0


def test_gspo_gradient_equals_the_sequence_formula() -> None:
    """The token form's gradient is that of −min(s_i·A_i, clip(s_i)·A_i), s_i = exp(mean_t (logp − prox))."""
    torch.manual_seed(0)
    prox = -torch.rand(3, 4) * 2
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0], [1, 0, 0, 0]], dtype=torch.bool)
    delta = 0.05 * torch.randn(3, 4)
    adv = torch.tensor([1.5, -0.7, 0.3]).unsqueeze(-1).expand(3, 4)
    a = (prox + delta).requires_grad_()
    tok = gspo_token_loss(a, prox, adv, mask, 0.01, 0.01)
    (tok.loss * mask).sum(dim=-1).div(mask.sum(-1)).sum().backward()
    b = (prox + delta).requires_grad_()
    s = torch.exp(torch.where(mask, b - prox, 0.0).sum(-1) / mask.sum(-1))
    ref = -torch.minimum(s * adv[:, 0], torch.clamp(s, 0.99, 1.01) * adv[:, 0])
    ref.sum().backward()
    assert torch.allclose(a.grad, b.grad, atol=1e-7)
