"""The trainer's forward pieces on a small real model (Qwen2, 2 layers): log-probs at the trained-on columns only
(`asyncrl.training.token_logprobs`) equal the full computation's, the gradient accumulated over token-budget micro
batches equals the one-batch gradient, and gradient checkpointing changes neither log-probs nor gradients."""

from __future__ import annotations

import copy

import pytest
import torch

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.activation_checkpointing import enable_gradient_checkpointing
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.distributed import batch_lengths
from asyncrl.training.losses import policy_loss
from asyncrl.training.micro_batches import pack_by_tokens
from asyncrl.training.token_logprobs import full_logprobs, trained_logprobs, trained_positions
from asyncrl.types import Group, Sample

TEMP = 0.7


def _model() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=64, num_attention_heads=2, num_key_value_heads=1, num_hidden_layers=2,
                      intermediate_size=128, vocab_size=48, tie_word_embeddings=True)
    model = AutoModelForCausalLM.from_config(cfg).eval()
    model.config.use_cache = False
    return model


def _batch() -> TrainBatch:
    """8 samples in 2 groups: prompts of 2-4 tokens, responses of 0-9 tokens, one with a loss mask that stops early."""
    g = torch.Generator().manual_seed(1)
    groups = []
    for k in range(2):
        samples = []
        for j in range(4):
            i = 4 * k + j
            prompt = torch.randint(3, 48, (2 + i % 3,), generator=g).tolist()
            resp = torch.randint(3, 48, ((7 * i) % 10,), generator=g).tolist()
            mask = [1] * min(3, len(resp)) + [0] * (len(resp) - 3) if i == 5 else None
            behav = (-torch.rand(len(resp), generator=g) - 0.5).tolist()
            samples.append(Sample(f"g{k}", j, prompt, resp, behav, [0] * len(resp), 0, reward=float(i % 3 == 0),
                                  loss_mask=mask))
        groups.append(Group(f"g{k}", k, "t", samples))
    return build_batch(groups, norm_std=True, pad_id=0)


def _loss(cfg: TrainingConfig, mb: TrainBatch, logp: torch.Tensor, entropy: torch.Tensor,
          whole: TrainBatch) -> torch.Tensor:
    loss, _ = policy_loss(cfg, logp, logp.detach(), mb.behav_logprobs, mb.advantages, mb.response_mask, mb.rewards,
                          entropy=entropy, num_samples=whole.num_nonempty, num_tokens=whole.num_tokens,
                          ent_mask=mb.entropy_mask)
    return loss


def _grads(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}


def _trained_only(model: torch.nn.Module, mb: TrainBatch) -> tuple[torch.Tensor, torch.Tensor]:
    """What `PolicyTrainer._forward(trained_only=True)` computes, on a plain HF model."""
    shapes = []

    def run() -> object:
        out = model(input_ids=mb.input_ids, attention_mask=mb.attention_mask)
        shapes.append(tuple(out.logits.shape))
        return out

    lp, ent = trained_logprobs(run, model, mb.input_ids, mb.response_mask, TEMP, entropy_grad=True)
    assert shapes == [(1, int((mb.response_mask[:, 1:] > 0).sum()), 48)]  # the LM head ran at the trained tokens only
    return lp, ent


def test_trained_positions_are_the_masked_response_columns() -> None:
    mask = torch.tensor([[0, 0, 1, 1, 0], [1, 0, 0, 1, 1]])
    rows, cols = trained_positions(mask)
    assert rows.tolist() == [0, 0, 1, 1] and cols.tolist() == [2, 3, 3, 4]  # column 0 never counts


def test_trained_only_logprobs_equal_the_full_ones() -> None:
    model, batch = _model(), _batch()
    with torch.no_grad():
        full_lp, full_ent = full_logprobs(model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits,
                                          batch.input_ids, TEMP, entropy_grad=False)
        lp, ent = _trained_only(model, batch)
    m = batch.response_mask > 0
    assert int(m.sum()) == batch.num_tokens > 20
    assert torch.allclose(lp[m], full_lp[m], atol=1e-6) and torch.allclose(ent[m], full_ent[m], atol=1e-6)
    assert float(lp[~m].abs().sum()) == 0.0 and float(ent[~m].abs().sum()) == 0.0


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_token_budget_micro_batches_give_the_one_batch_gradient(aggregation: str) -> None:
    cfg = TrainingConfig(aggregation=aggregation, ent_coef=0.01)
    model, batch = _model(), _batch()
    out = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask)
    logp, ent = full_logprobs(out.logits, batch.input_ids, TEMP, entropy_grad=True)
    _loss(cfg, batch, logp, ent, batch).backward()
    ref = _grads(model)
    model.zero_grad()
    plan = pack_by_tokens(batch_lengths(batch), 24, 3)
    assert len(plan) >= 3 and sorted(i for mb in plan for i in mb) == list(range(batch.num_samples))
    for index in plan:
        mb = batch.rows(index)
        logp, ent = _trained_only(model, mb)
        _loss(cfg, mb, logp, ent, batch).backward()
    got = _grads(model)
    assert set(got) == set(ref) and len(ref) > 10
    scale = max(float(g.abs().max()) for g in ref.values())
    assert scale > 1e-3
    worst = max(float((got[n] - ref[n]).abs().max()) for n in ref)
    assert worst <= 1e-5 * scale, (worst, scale)


def test_gradient_checkpointing_keeps_logprobs_and_gradients() -> None:
    cfg = TrainingConfig(ent_coef=0.01)
    plain, batch = _model(), _batch()
    ckpt = copy.deepcopy(plain)
    assert enable_gradient_checkpointing(ckpt) == 2
    # the decoder layers alone are flagged as training; attention and MLP stay in eval mode (no dropout)
    assert [m.training for m in ckpt.model.layers] == [True, True]
    assert not ckpt.model.layers[0].self_attn.training and not ckpt.model.layers[0].mlp.training
    calls = {"plain": 0, "ckpt": 0}
    plain.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__("plain", calls["plain"] + 1))
    ckpt.model.layers[0].mlp.register_forward_pre_hook(lambda *_: calls.__setitem__("ckpt", calls["ckpt"] + 1))
    results = []
    for model in (plain, ckpt):
        logp, ent = _trained_only(model, batch)
        _loss(cfg, batch, logp, ent, batch).backward()
        results.append((logp.detach(), _grads(model)))
    # the checkpointed layer ran again in the backward pass (a pre-hook: the recompute stops once it has what the
    # backward needs, inside the MLP)
    assert calls == {"plain": 1, "ckpt": 2}
    (lp0, g0), (lp1, g1) = results
    assert torch.equal(lp0, lp1)
    assert set(g0) == set(g1)
    assert max(float((g0[n] - g1[n]).abs().max()) for n in g0) <= 1e-7
    with torch.no_grad():  # the log-prob pass (no grad) runs with checkpointing on too
        assert torch.equal(_trained_only(ckpt, batch)[0], lp0)


def test_gradient_checkpointing_names_the_field_for_a_plain_module() -> None:
    with pytest.raises(ValueError, match="training.gradient_checkpointing"):
        enable_gradient_checkpointing(torch.nn.Linear(2, 2))
