"""Checkpoints on a real S3 server: COMMITTED semantics, exact tensors, optimizer state round trip."""

from __future__ import annotations

import json

import pytest
import torch

from asyncrl.storage.checkpoints import (
    CheckpointError,
    committed_versions,
    flatten_optimizer_state,
    latest_committed_version,
    load_checkpoint,
    save_checkpoint,
    unflatten_optimizer_state,
)
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store


def _trained_adamw() -> tuple[torch.nn.Module, torch.optim.AdamW]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 2))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, betas=(0.8, 0.95), weight_decay=0.1)
    for _ in range(3):
        opt.zero_grad()
        model(torch.randn(5, 4)).pow(2).sum().backward()
        opt.step()
    return model, opt


def _assert_same_state(a: dict, b: dict) -> None:
    assert a["param_groups"] == b["param_groups"]
    assert a["state"].keys() == b["state"].keys()
    for pid, st in a["state"].items():
        assert st.keys() == b["state"][pid].keys()
        for k, v in st.items():
            assert torch.equal(v, b["state"][pid][k]), (pid, k)
            assert v.dtype == b["state"][pid][k].dtype


def test_flatten_optimizer_state_round_trips_adamw_exactly() -> None:
    _, opt = _trained_adamw()
    sd = opt.state_dict()
    tensors, skeleton = flatten_optimizer_state(sd)
    assert set(tensors) == {f"state/{i}/{k}" for i in range(4) for k in ("step", "exp_avg", "exp_avg_sq")}
    skeleton = json.loads(json.dumps(skeleton, allow_nan=False))  # must survive JSON
    back = unflatten_optimizer_state(tensors, skeleton)
    _assert_same_state(sd, back)
    assert back["param_groups"][0]["betas"] == (0.8, 0.95)  # tuples stay tuples
    assert list(back["state"]) == [0, 1, 2, 3]  # int keys stay ints


def test_flatten_handles_non_finite_and_rejects_unknown_types() -> None:
    tensors, skel = flatten_optimizer_state({"a": float("inf"), "b": [1, None, "x"], "t": torch.ones(2)})
    back = unflatten_optimizer_state(tensors, json.loads(json.dumps(skel, allow_nan=False)))
    assert back["a"] == float("inf") and back["b"] == [1, None, "x"] and torch.equal(back["t"], torch.ones(2))
    with pytest.raises(TypeError, match="at x: unsupported value of type object"):
        flatten_optimizer_state({"x": object()})
    with pytest.raises(ValueError, match="tensor 'gone' missing"):
        unflatten_optimizer_state({}, {"t": "gone"})


@pytest.mark.integration
def test_save_load_and_commit_semantics(s3_store: S3Store) -> None:
    paths = RunPaths("runs", "ckpt")
    assert latest_committed_version(s3_store, paths) is None
    model, opt = _trained_adamw()
    opt_tensors, skeleton = flatten_optimizer_state(opt.state_dict())
    meta = {"step": 3, "cursors": {"env0": 12, "env1": 9}, "optimizer_skeleton": skeleton}
    prefix = save_checkpoint(s3_store, paths, 3, model.state_dict(), opt_tensors, meta)
    assert prefix == "runs/ckpt/checkpoints/3/"
    assert s3_store.list_keys(prefix) == [
        prefix + n for n in ("COMMITTED", "meta.json", "model.safetensors", "optimizer.safetensors")
    ]

    # an uncommitted, newer checkpoint (a crash before COMMITTED) is ignored and refused
    s3_store.put_bytes(paths.checkpoint(5, "model.safetensors"), b"partial")
    assert latest_committed_version(s3_store, paths) == 3
    with pytest.raises(CheckpointError, match="checkpoint 5 is not committed"):
        load_checkpoint(s3_store, paths, 5)

    m, o, meta_back = load_checkpoint(s3_store, paths, 3)
    assert meta_back["cursors"] == {"env0": 12, "env1": 9} and meta_back["step"] == 3
    assert m.keys() == model.state_dict().keys()
    assert all(torch.equal(m[k], v) for k, v in model.state_dict().items())
    _assert_same_state(opt.state_dict(), unflatten_optimizer_state(o, meta_back["optimizer_skeleton"]))

    # a fresh optimizer loaded from the checkpoint takes the same next step as the original
    model2, _ = _trained_adamw()
    opt2 = torch.optim.AdamW(model2.parameters(), lr=1.0)
    model2.load_state_dict(m)
    opt2.load_state_dict(unflatten_optimizer_state(o, meta_back["optimizer_skeleton"]))
    x = torch.randn(5, 4)
    for mod, op in ((model, opt), (model2, opt2)):
        op.zero_grad()
        mod(x).pow(2).sum().backward()
        op.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), model2.parameters(), strict=True))

    # a later save of version 5 overwrites the partial files and commits; version 3 cannot be rewritten
    save_checkpoint(s3_store, paths, 5, model.state_dict(), {}, {"step": 5})
    assert committed_versions(s3_store, paths) == [3, 5]
    assert latest_committed_version(s3_store, paths) == 5
    with pytest.raises(ObjectExists, match="version 3 is already committed"):
        save_checkpoint(s3_store, paths, 3, model.state_dict(), {}, {})


@pytest.mark.integration
def test_corrupt_committed_checkpoint_is_detected(s3_store: S3Store) -> None:
    paths = RunPaths("", "ckpt2")
    w = torch.arange(6, dtype=torch.float32).reshape(2, 3)
    save_checkpoint(s3_store, paths, 1, {"w": w, "tied": w}, {}, {})  # shared storage is saved twice
    m, _, _ = load_checkpoint(s3_store, paths, 1)
    assert torch.equal(m["tied"], w)
    s3_store.put_bytes(paths.checkpoint(1, "model.safetensors"), b"tampered")
    with pytest.raises(CheckpointError, match="model.safetensors does not match its sha256"):
        load_checkpoint(s3_store, paths, 1)
    with pytest.raises(ValueError, match="meta: expected a JSON-serialisable dict"):
        save_checkpoint(s3_store, paths, 2, {}, {}, {"bad": object()})


@pytest.mark.integration
def test_extra_tensor_files_are_committed_and_verified(s3_store: S3Store) -> None:
    from asyncrl.storage.checkpoints import load_checkpoint_tensors

    paths = RunPaths("runs", "ckpt-extra")
    critic = {"critic0.value_head.weight": torch.arange(6.0).reshape(1, 6)}
    critic_opt = {"critic0.step": torch.tensor(4.0)}
    save_checkpoint(s3_store, paths, 2, {"w": torch.ones(2)}, {}, {"v": 2},
                    extra={"critic": critic, "critic_optimizer": critic_opt})
    back = load_checkpoint_tensors(s3_store, paths, 2, "critic")
    assert torch.equal(back["critic0.value_head.weight"], critic["critic0.value_head.weight"])
    assert load_checkpoint_tensors(s3_store, paths, 2, "critic_optimizer")["critic0.step"].item() == 4.0
    with pytest.raises(CheckpointError, match="does not list nope.safetensors"):
        load_checkpoint_tensors(s3_store, paths, 2, "nope")
    s3_store.put_bytes(paths.checkpoint(2, "critic.safetensors"), b"tampered")
    with pytest.raises(CheckpointError, match="sha256"):
        load_checkpoint_tensors(s3_store, paths, 2, "critic")
    with pytest.raises(ValueError, match="extra file name"):
        save_checkpoint(s3_store, paths, 3, {}, {}, {}, extra={"../x": {}})
