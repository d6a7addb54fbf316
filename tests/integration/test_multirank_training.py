"""Data-parallel training ranks on real DeepSpeed over gloo (CPU), and the training role under torchrun.

1. Exactness (the key check): with the same start weights and batch, one optimizer step with 2 ranks (torchrun, 2
   processes; the batch travels from rank 0 over the control channel, rank 0 runs one micro batch fewer and is
   padded) gives the same weights, AdamW moments, loss and grad_norm as one lone process, for ZeRO 0, 2 and 3.
   Attention credit off. Each stage runs in its own interpreter(s): `python this_file.py <stage> <model> <out>`,
   as a lone process (W = 1) or under torchrun (W = 2).
   Then every rank reloads the step-1 state in place (`load_state`, collective under ZeRO-3) and a second step
   must equal the second step taken straight on. With 2 mini-batches (`training.mini_batches`), the step's two
   optimizer steps on 2 ranks equal those of the lone process too.
2. An embedded run (`asyncrl run`, smoke config) with `training.num_processes=2` does 2 steps; its trained
   weights reach the generation server (the launcher compares checksums and fails the run otherwise), and both
   ranks' logs show the protocol ran to "stop".
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]
MICRO = 2
RESPONSES = [[5], [6, 7], [5, 8, 9], [9], [6, 10]]  # 5 rows: W=1 runs 3 micro batches, ranks 0/1 run 2 each


def _groups():
    from asyncrl.types import Group, Sample

    samples = [Sample(f"g{i // 3}", i % 3, [1, 2, 3][: 1 + i % 3], r, [-2.0 - 0.3 * j for j in range(len(r))],
                      [0] * len(r), 0, reward=float(r[0] == 5)) for i, r in enumerate(RESPONSES)]
    return [Group("g0", 0, "t", samples[:3]), Group("g1", 1, "t", samples[3:])]


def _worker(stage: int, model_dir: Path, out_dir: Path, tokens: int | None = None, mini: int = 1) -> None:
    import torch
    from safetensors.torch import save_file

    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.batch import build_batch
    from asyncrl.training.distributed import Command, batch_from_tensors, batch_tensors
    from asyncrl.training.policy import PolicyTrainer

    aggregation = "token-mean" if stage == 2 else "seq-mean-token-mean"
    cfg = TrainingConfig(zero_stage=stage, micro_batch_size=MICRO, lr=1e-3, loss="decoupled_ppo", ent_coef=0.01,
                         aggregation=aggregation, grad_clip=1e6, micro_batch_tokens=tokens, mini_batches=mini)
    trainer = PolicyTrainer(model_dir, cfg, timeout_s=60)
    try:
        if trainer.is_leader:
            batch = build_batch(_groups(), norm_std=True, pad_id=0)
            if trainer.channel is not None:
                trainer.channel.send(Command("step", 0, {}), batch_tensors(batch), timeout_s=60)
        else:
            assert trainer.channel is not None
            _, tensors = trainer.channel.receive(timeout_s=60)
            batch = batch_from_tensors(tensors)
        metrics = trainer.train_step(batch, temperature=0.7)
        weights = dict(trainer.named_weights())  # collective under ZeRO-3
        opt = trainer.optimizer_state()  # collective under ZeRO 1-3
        # resume on every rank (collective under ZeRO-3): a second step after reloading the step-1 state in place
        # must equal the second step taken straight on
        model_state = trainer.model_state()
        straight = trainer.train_step(batch, temperature=0.7)["loss"], dict(trainer.named_weights())
        trainer.load_state(model_state, opt)
        again = trainer.train_step(batch, temperature=0.7)["loss"], dict(trainer.named_weights())
        resume_diff = max(float((again[1][k] - straight[1][k]).abs().max()) for k in weights)
        metrics |= {"resume_max_diff": resume_diff, "resume_loss_diff": abs(again[0] - straight[0])}
        if trainer.is_leader:
            save_file({f"w.{k}": v.contiguous() for k, v in weights.items()}
                      | {f"o.{k}": v.reshape(-1).contiguous() for k, v in opt.items()}, str(out_dir / "state.safetensors"))
            (out_dir / "metrics.json").write_text(json.dumps({**metrics, "world_size": trainer.world_size,
                                                              "threads": torch.get_num_threads()}))
    finally:
        trainer.close()


def _run(stage: int, model_dir: Path, out_dir: Path, world_size: int, tokens: int | None = None,
         mini: int = 1) -> dict:
    out_dir.mkdir(parents=True)
    env = {k: v for k, v in os.environ.items() if k not in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE",
                                                              "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env |= {"DS_BUILD_OPS": "0", "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1",
            "TORCH_EXTENSIONS_DIR": env.get("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))}
    launcher = [] if world_size == 1 else ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
                                           "--nproc-per-node", str(world_size)]
    cmd = [sys.executable, *launcher, str(HERE), str(stage), str(model_dir), str(out_dir), str(tokens or 0),
           str(mini)]
    proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=240)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-6000:]
    return json.loads((out_dir / "metrics.json").read_text())


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    from tests.helpers.tiny_random_model import build_tiny_random_model

    return build_tiny_random_model(tmp_path_factory.mktemp("model") / "tiny")


@pytest.mark.integration
@pytest.mark.timeout(400)
# (3, 8): the two ranks pack their micro batches under a token budget of 8 (rows of 6; 4 and 4; 2 and 2 tokens: rank 0
# runs [6] and [2, 2], rank 1 [4, 4] and a padding one), the lone process by count: the same step all the same
# (0, None, 2): 2 mini-batches, rows [0, 1, 2] and [3, 4]: the lone process runs [0, 1], [2] then [3, 4];
# rank 0 [0, 1] then [3], rank 1 [2] then [4]; two optimizer steps each; (3, 8, 2): the same under ZeRO-3,
# the ranks packing under the budget
@pytest.mark.parametrize(("stage", "tokens", "mini"),
                         [(0, None, 1), (3, None, 1), (3, 8, 1), (0, None, 2), (3, 8, 2)])
def test_two_ranks_equal_one_rank(stage, tokens, mini, model_dir, tmp_path):
    import torch
    from safetensors.torch import load_file

    # the lone process and the two ranks are independent: they run side by side (their start is mostly imports)
    with ThreadPoolExecutor(max_workers=2) as pool:
        one_run = pool.submit(_run, stage, model_dir, tmp_path / "w1", 1, None, mini)
        two_run = pool.submit(_run, stage, model_dir, tmp_path / "w2", 2, tokens, mini)
        one, two = one_run.result(), two_run.result()
    assert (one["world_size"], two["world_size"]) == (1, 2)
    s1, s2 = load_file(str(tmp_path / "w1/state.safetensors")), load_file(str(tmp_path / "w2/state.safetensors"))
    start = load_file(str(model_dir / "model.safetensors"))
    assert sorted(s1) == sorted(s2)
    # The gradients, seen through AdamW's first moment (exp_avg = 0.1·g after one step), agree everywhere.
    grads = [k for k in s1 if k.startswith("o.exp_avg.")]
    assert len(grads) == len([k for k in s1 if k.startswith("w.")])
    for k in grads:
        torch.testing.assert_close(s2[k], s1[k], rtol=1e-5, atol=1e-7, msg=lambda m, k=k: f"{k}: {m}")
    # The weights agree to 1e-6 wherever the gradient is above float noise. Adam's first step is lr·g/(|g| + ε),
    # about lr·sign(g): where the exact gradient is 0 (the key bias, softmax-invariant) or ~ε, summation-order noise
    # of ~1e-9 flips the sign, in any two runs that sum in a different order. Each further optimizer step (mini-batches)
    # adds its own step of that noise: 1e-6 a step (one weight of 32,628 moved 1.18e-6 after two steps on an AMX host).
    compared = changed = total = 0
    for k in (k for k in s1 if k.startswith("w.")):
        g = s1["o.exp_avg." + k[2:]].reshape(s1[k].shape)
        signal = g.abs() >= 1e-6
        torch.testing.assert_close(s2[k][signal], s1[k][signal], rtol=0, atol=1e-6 * mini,
                                   msg=lambda m, k=k: f"{k}: {m}")
        compared, total = compared + int(signal.sum()), total + signal.numel()
        changed += int((s1[k] != start[k[2:]]).sum())
    assert compared > 0.97 * total and changed > 0.97 * total
    assert float(s1["o.step"][0]) == float(s2["o.step"][0]) == float(mini)
    assert one["updates"] == two["updates"] == float(mini)
    assert len(one) == len(two)
    for key in ("loss", "pg_loss", "tokens", "entropy", "iw_mean", "iw_max", "clip_fraction", "grad_norm"):
        assert two[key] == pytest.approx(one[key], rel=1e-5, abs=1e-6), key
    assert one["tokens"] == 9.0 and one["grad_norm"] > 0
    # rows of 2, 4, 6, 2, 4 tokens; by count [2, 4], [6, 2], [4]: 24 computed for 18; packed: no padding.
    # With 2 mini-batches [2, 4, 6] and [2, 4]: by count [2, 4], [6], [2, 4]; packed [6], [4, 2], [4, 2]:
    # 22 computed for 18 both
    if tokens and mini == 1:
        assert (one["padding_fraction"], two["padding_fraction"]) == (pytest.approx(1 - 18 / 24), 0.0)
    if tokens and mini == 2:
        assert (one["padding_fraction"], two["padding_fraction"]) == (pytest.approx(1 - 18 / 22),) * 2
    for res in (one, two):
        assert res["resume_max_diff"] <= 1e-7 and res["resume_loss_diff"] <= 1e-7


if __name__ == "__main__":
    args = sys.argv[1:]
    _worker(int(args[0]), Path(args[1]), Path(args[2]), int(args[3]) or None, int(args[4]))
