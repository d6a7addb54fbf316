"""CriticEnsemble on a real tiny Qwen2 (CPU torch): label alignment, zero init, learning, AsyPPO's
disjoint data split, exact gradient accumulation, explained variance, and a state round trip."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.critic import CriticEnsemble, explained_variance
from asyncrl.types import Group, Sample
from tests.helpers.tiny_random_model import build_tiny_random_model

pytestmark = pytest.mark.integration

PAD = 0
RESPONSES = [[5, 6, 7], [8], [9, 10, 11, 12], [13, 14], [15, 16, 17], [18], [19, 20], [21, 22, 23, 24]]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random_model(tmp_path_factory.mktemp("critic_model"))


def _groups(keep: list[int] | None = None) -> list[Group]:
    """Two groups of 4 (prompts [1, 2, 3] and [4, 2]); sample i has reward 1 iff i is even."""
    groups = []
    for g, prompt in enumerate(([1, 2, 3], [4, 2])):
        samples = [
            Sample(f"g{g}", j, prompt, r, [0.0] * len(r), [0] * len(r), 0, reward=float((4 * g + j) % 2 == 0))
            for j, r in enumerate(RESPONSES[4 * g : 4 * g + 4])
            if keep is None or 4 * g + j in keep
        ]
        groups.append(Group(f"g{g}", g, "t", samples))
    return [g for g in groups if g.samples]


def _batch(keep: list[int] | None = None) -> TrainBatch:
    return build_batch(_groups(keep), norm_std=False, pad_id=PAD)


def _returns(batch: TrainBatch) -> torch.Tensor:
    """Fixed, learnable returns: +1 on group 0's response tokens, −0.5 on group 1's (prompts differ)."""
    per_sample = torch.where(batch.input_ids[:, 0] == 1, 1.0, -0.5)
    return per_sample.unsqueeze(1) * batch.response_mask


def _randomise_heads(ens: CriticEnsemble, seed: int) -> None:
    gen = torch.Generator().manual_seed(seed)
    state = ens.state()
    for m in range(ens.num_critics):
        w = state[f"critic{m}.value_head.weight"]
        state[f"critic{m}.value_head.weight"] = torch.randn(w.shape, generator=gen) * 0.1
        state[f"critic{m}.value_head.bias"] = torch.randn(1, generator=gen)
    ens.load_state(state)


def _grads(ens: CriticEnsemble, batch: TrainBatch, returns: torch.Tensor, owner: torch.Tensor | None, mbs: int):
    owner_l = ens._check_train_inputs(batch, returns, owner)
    for opt in ens.optimizers:
        opt.zero_grad(set_to_none=True)
    ens._accumulate(batch, returns, owner_l, mbs)
    out = [{n: p.grad.clone() for n, p in m.named_parameters() if p.grad is not None} for m in ens.models]
    for opt in ens.optimizers:
        opt.zero_grad(set_to_none=True)
    return out


def _assert_grads_close(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> None:
    assert a.keys() == b.keys() and len(a) > 0
    for n in a:
        # float32 sums in another order: compare to the tensor's scale (its largest entry).
        scale = float(a[n].abs().max())
        torch.testing.assert_close(a[n], b[n], rtol=1e-4, atol=1e-5 * scale + 1e-8, msg=n)


def test_values_shapes_zero_init_and_label_alignment(model_dir: Path) -> None:
    ens = CriticEnsemble(model_dir, num_critics=2, micro_batch_size=3)
    batch = _batch()
    v = ens.values(batch)
    assert v.shape == (2, 8, 7) and v.abs().sum().item() == 0  # zero head: values 0 everywhere
    _randomise_heads(ens, seed=1)
    v = ens.values(batch)
    mask = batch.response_mask > 0
    assert bool((v[:, ~mask] == 0).all()) and bool((v[:, mask] != 0).all())
    assert not torch.equal(v[0], v[1])  # different heads
    torch.testing.assert_close(ens.values(batch, micro_batch_size=1), v, rtol=1e-5, atol=1e-6)

    model = ens.models[0]
    ids, attn = batch.input_ids, batch.attention_mask
    with torch.no_grad():
        full = model(ids, attn)
        hidden = model.backbone(input_ids=ids, attention_mask=attn, use_cache=False).last_hidden_state
        head = hidden @ model.value_head.weight[0] + model.value_head.bias[0]
    assert bool((full[:, 0] == 0).all())
    torch.testing.assert_close(full[:, 1:], head[:, :-1], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(full * mask, v[0], rtol=1e-5, atol=1e-6)
    # Column j uses only tokens < j: changing token j leaves columns 0..j unchanged, changes j + 1.
    j = 4  # sample 0: prompt [1, 2, 3], response [5, 6, 7] at columns 3..5
    changed = ids.clone()
    changed[0, j] = 30
    with torch.no_grad():
        after = model(changed, attn)
    torch.testing.assert_close(after[0, : j + 1], full[0, : j + 1], rtol=0, atol=1e-6)
    assert abs(after[0, j + 1].item() - full[0, j + 1].item()) > 1e-4
    torch.testing.assert_close(after[1:], full[1:], rtol=0, atol=1e-6)


def test_training_reduces_mse(model_dir: Path) -> None:
    ens = CriticEnsemble(model_dir, num_critics=1, lr=1e-2, micro_batch_size=4)
    batch = _batch()
    returns = _returns(batch)
    first = ens.train_step(batch, returns)
    assert set(first) == {"critic/loss", "critic/explained_variance", "critic/grad_norm", "critic/value_mean"}
    # Zero init: pre-update values 0 → MSE = mean R² = (10·1² + 10·0.5²) / 20 over 10 + 10 response tokens.
    assert first["critic/loss"] == pytest.approx(0.625, rel=1e-6)
    assert first["critic/value_mean"] == 0.0 and first["critic/grad_norm"] > 0
    assert first["critic/explained_variance"] == pytest.approx(0.0, abs=1e-6)  # V̄ = 0: R − V̄ = R
    last = first
    for _ in range(30):
        last = ens.train_step(batch, returns)
    assert last["critic/loss"] < 0.05 * first["critic/loss"]
    assert last["critic/explained_variance"] > 0.8


def test_explained_variance_hand_cases(model_dir: Path) -> None:
    r = torch.tensor([[0.0, 1.0, 2.0, 3.0, 4.0, 9.0]])
    v = torch.tensor([[0.0, 1.0, 2.0, 3.0, 3.0, -5.0]])
    mask = torch.tensor([[0.0, 1.0, 1.0, 1.0, 1.0, 0.0]])
    # masked R = [1, 2, 3, 4]: Var = 1.25; R − V = [0, 0, 0, 1]: Var = 0.1875 → 1 − 0.15 = 0.85.
    assert explained_variance(r, v, mask) == pytest.approx(0.85, abs=1e-12)
    assert explained_variance(torch.full((1, 6), 2.0), v, mask) == 0.0  # Var(R) = 0
    assert explained_variance(r, v, torch.zeros(1, 6)) == 0.0

    # Returns equal to the critic's own pre-update values: EV = 1 and loss = 0.
    ens = CriticEnsemble(model_dir, num_critics=1)
    _randomise_heads(ens, seed=2)
    batch = _batch()
    metrics = ens.train_step(batch, ens.values(batch)[0])
    assert metrics["critic/explained_variance"] == pytest.approx(1.0, abs=1e-6)
    assert metrics["critic/loss"] == pytest.approx(0.0, abs=1e-10)
    # With 2 critics the metric uses V̄ = the mean of the pre-update values over the critics.
    ens2 = CriticEnsemble(model_dir, num_critics=2)
    _randomise_heads(ens2, seed=3)
    values = ens2.values(batch)
    returns = _returns(batch)
    metrics = ens2.train_step(batch, returns, owner=torch.tensor([0, 0, 1, 1, 0, 0, 1, 1]))
    expected = explained_variance(returns, values.mean(0), batch.response_mask)
    assert metrics["critic/explained_variance"] == pytest.approx(expected, abs=1e-5)
    mask_b = batch.response_mask > 0
    assert metrics["critic/value_mean"] == pytest.approx(float(values.mean(0)[mask_b].mean()), abs=1e-6)
    mse = [float(((values[m] - returns)[mask_b & (own == m)[:, None]] ** 2).mean()) for m, own in
           ((0, torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])), (1, torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])))]
    assert metrics["critic/loss_0"] == pytest.approx(mse[0], rel=1e-5)
    assert metrics["critic/loss_1"] == pytest.approx(mse[1], rel=1e-5)
    assert metrics["critic/loss"] == pytest.approx((mse[0] + mse[1]) / 2, rel=1e-5)


def test_owner_split_is_disjoint(model_dir: Path) -> None:
    batch = _batch()
    returns = _returns(batch)
    ens = CriticEnsemble(model_dir, num_critics=2, lr=1e-3)
    _randomise_heads(ens, seed=4)
    before = ens.state()
    metrics = ens.train_step(batch, returns, owner=torch.ones(8, dtype=torch.long))
    after = ens.state()
    assert "critic/loss_0" not in metrics and "critic/loss_1" in metrics
    assert all(torch.equal(after[n], t) for n, t in before.items() if n.startswith("critic0."))
    assert all(not torch.equal(after[n], t) for n, t in before.items() if n.startswith("critic1."))
    assert ens.optimizer_state()["critic0.step"].item() == 0.0
    assert ens.optimizer_state()["critic1.step"].item() == 1.0

    # Mixed ownership: critic 0's gradient equals that of a lone critic on critic 0's samples only.
    owner = torch.tensor([0, 1, 1, 0, 1, 0, 0, 1])
    mine = [i for i in range(8) if owner[i] == 0]
    grads = _grads(ens, batch, returns, owner, mbs=64)
    lone = CriticEnsemble(model_dir, num_critics=1)
    lone.load_state({n: t for n, t in ens.state().items() if n.startswith("critic0.")})
    sub = _batch(keep=mine)
    lone_grads = _grads(lone, sub, _returns(sub), None, mbs=64)
    _assert_grads_close(grads[0], lone_grads[0])
    with pytest.raises(ValueError, match=r"owner: expected critic indices in \[0, 2\)"):
        ens.train_step(batch, returns, owner=torch.full((8,), 2))
    with pytest.raises(ValueError, match=r"owner: expected shape \(8,\)"):
        ens.train_step(batch, returns, owner=torch.zeros(7, dtype=torch.long))
    with pytest.raises(ValueError, match=r"returns: expected shape \(8, 7\)"):
        ens.train_step(batch, returns[:, :3])


def test_micro_batches_equal_full_batch(model_dir: Path) -> None:
    batch = _batch()
    returns = _returns(batch)
    owner = torch.tensor([0, 0, 1, 1, 0, 1, 0, 1])
    a = CriticEnsemble(model_dir, num_critics=2)
    _randomise_heads(a, seed=5)
    g_full, g_micro = _grads(a, batch, returns, owner, mbs=64), _grads(a, batch, returns, owner, mbs=3)
    for m in range(2):
        _assert_grads_close(g_full[m], g_micro[m])
        assert any(t.abs().sum() > 0 for n, t in g_full[m].items() if n.startswith("backbone."))
    b = CriticEnsemble(model_dir, num_critics=2)
    b.load_state(a.state(), a.optimizer_state())
    ma, mb = a.train_step(batch, returns, owner), b.train_step(batch, returns, owner, micro_batch_size=1)
    for key in ma:
        assert ma[key] == pytest.approx(mb[key], rel=1e-4, abs=1e-7), key


def test_state_round_trip(model_dir: Path, tmp_path: Path) -> None:
    batch = _batch()
    returns = _returns(batch)
    owner = torch.tensor([0, 0, 1, 1, 0, 0, 1, 1])
    a = CriticEnsemble(model_dir, num_critics=2, lr=1e-3, weight_decay=0.01, micro_batch_size=3)
    fresh = a.optimizer_state()
    assert fresh.keys() == {"critic0.step", "critic1.step"}
    for _ in range(2):
        a.train_step(batch, returns, owner)
    save_file(a.state(), tmp_path / "critic.safetensors")
    save_file(a.optimizer_state(), tmp_path / "critic_optim.safetensors")
    opt = load_file(tmp_path / "critic_optim.safetensors")
    assert opt["critic1.step"].item() == 2.0 and "critic0.exp_avg_sq.value_head.weight" in opt

    b = CriticEnsemble(model_dir, num_critics=2, lr=1e-3, weight_decay=0.01, micro_batch_size=3)
    b.load_state(load_file(tmp_path / "critic.safetensors"), opt)
    assert torch.equal(a.values(batch), b.values(batch))
    assert a.train_step(batch, returns, owner) == b.train_step(batch, returns, owner)
    sa, sb = a.state(), b.state()
    assert all(torch.equal(sa[n], sb[n]) for n in sa)
    oa, ob = a.optimizer_state(), b.optimizer_state()
    assert oa.keys() == ob.keys() and all(torch.equal(oa[n], ob[n]) for n in oa)

    # Errors name the tensor.
    state = a.state()
    del state["critic1.value_head.bias"]
    with pytest.raises(ValueError, match=r"missing tensors \['critic1.value_head.bias'\]"):
        b.load_state(state)
    state = a.state()
    state["critic0.value_head.weight"] = torch.zeros(1, 3)
    with pytest.raises(ValueError, match=r"critic state\['critic0.value_head.weight'\]: expected shape \(1, 128\)"):
        b.load_state(state)
    broken = dict(oa)
    del broken["critic1.step"]
    with pytest.raises(ValueError, match="missing 'critic1.step'"):
        b.load_state(a.state(), broken)
    broken = dict(oa)
    del broken["critic0.exp_avg.value_head.bias"]
    with pytest.raises(ValueError, match="missing 'critic0.exp_avg.value_head.bias'"):
        b.load_state(a.state(), broken)
    # Loading a fresh optimizer state (step 0) empties AdamW's state.
    b.load_state(a.state(), fresh)
    assert b.optimizer_state().keys() == fresh.keys()
