"""Mini-batch updates of `PolicyTrainer` (`training.mini_batches`, `training.epochs`) on a real DeepSpeed
engine (CPU, gloo, ZeRO 0), in one subprocess (`python this_file.py <model_dir>`, as
tests/integration/test_policy_deepspeed.py).

Checks:
- one update (the default): the step of a plain HF model and a torch AdamW by hand (whole-batch denominators,
  prox = logp): the same loss, gradient (AdamW's first moment) and grad_norm; prox is the update's own
  log-probs and no extra forward runs; one optimizer step;
- two mini-batches: two optimizer steps; the prox of every micro batch, the second update's included, is the
  policy's log-probs at the step's start (`PolicyTrainer.logprobs` before the step), not the moved policy's;
  each update divides by its own mini-batch's non-empty samples and trained tokens; one no-grad forward per
  micro batch more. With loss tis (whose loss reads no prox) the step is, weight for weight, two one-update
  steps on the halves;
- a large learning rate: clip_fraction exactly 0 with one update, above 0 with 2 mini-batches or 2 epochs;
- more mini-batches than samples: a ValueError naming training.mini_batches, before any weight moves.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.subprocess_runs import run_lone_trainer_script

HERE = Path(__file__).resolve()
PROMPT = [1, 2, 3]
GOOD = 5
RESPONSES = [[GOOD], [6, 7], [GOOD, 8], [9], [6], [GOOD], [10, 11], [GOOD, GOOD]]
TEMP = 0.7


def _batch():
    from asyncrl.training.batch import build_batch
    from asyncrl.types import Group, Sample

    groups = []
    for g in range(2):
        samples = [Sample(f"g{g}", j, PROMPT, r, [-2.0 - 0.1 * k for k in range(len(r))], [0] * len(r), 0,
                          reward=float(r[0] == GOOD)) for j, r in enumerate(RESPONSES[4 * g : 4 * g + 4])]
        groups.append(Group(f"g{g}", g, "t", samples))
    return build_batch(groups, norm_std=True, pad_id=0)


class _Spy:
    """Records the arguments of every `policy_loss` call and counts the engine's forwards."""

    def __init__(self, trainer) -> None:
        import asyncrl.training.policy as policy

        self.calls: list[dict] = []
        self.forwards = 0
        self._policy, self._real = policy, policy.policy_loss

        def spy(cfg, logp, prox, behav, adv, mask, rewards, **kw):
            self.calls.append({"logp": logp.detach().clone(), "prox": prox.clone(), "mask": mask.clone(),
                               "num_samples": kw["num_samples"], "num_tokens": kw["num_tokens"]})
            return self._real(cfg, logp, prox, behav, adv, mask, rewards, **kw)

        policy.policy_loss = spy
        trainer.engine.module.register_forward_hook(lambda *_: setattr(self, "forwards", self.forwards + 1))

    def close(self) -> None:
        self._policy.policy_loss = self._real


def _masked_diff(a, b, mask) -> float:
    m = mask > 0
    return float((a[m] - b[m]).abs().max())


def _reference_step(model_dir: Path, cfg, batch) -> dict:
    """One optimizer step by hand: a plain HF forward at every column, the loss with the whole batch's
    denominators and prox = logp, its gradient."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.training.losses import policy_loss
    from asyncrl.training.token_logprobs import full_logprobs

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    logits = model(input_ids=batch.input_ids, attention_mask=batch.attention_mask).logits
    logp, _ = full_logprobs(logits, batch.input_ids, TEMP, entropy_grad=False)
    loss, _ = policy_loss(cfg, logp, logp.detach(), batch.behav_logprobs, batch.advantages,
                          batch.response_mask, batch.rewards, num_samples=batch.num_nonempty,
                          num_tokens=batch.num_tokens)
    loss.backward()
    grads = {n: p.grad.detach().clone() for n, p in model.named_parameters()}
    norm = float(torch.stack([g.norm() for g in grads.values()]).norm())
    return {"loss": float(loss), "grads": grads, "norm": norm}


def _one_update(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    ref = _reference_step(model_dir, cfg, batch)
    trainer = PolicyTrainer(model_dir, cfg, batch_size=8)
    spy = _Spy(trainer)
    try:
        m = trainer.train_step(batch, TEMP)
        opt = trainer.optimizer_state()
        grad_err = max(float((opt[f"exp_avg.{n}"] - 0.1 * g).abs().max()) for n, g in ref["grads"].items())
        scale = max(float((0.1 * g).abs().max()) for g in ref["grads"].values())
        return {"loss_err": abs(m["loss"] - ref["loss"]),
                "norm_err": abs(m["grad_norm"] - ref["norm"]) / ref["norm"],
                "grad_err": grad_err / scale, "opt_step": float(opt["step"]), "updates": m["updates"],
                "prox_is_logp": all(bool((c["prox"] == c["logp"]).all()) for c in spy.calls),
                "calls": len(spy.calls), "forwards": spy.forwards, "clip_fraction": m["clip_fraction"],
                "micro_batches": m["micro_batches"], "tokens": m["tokens"]}
    finally:
        spy.close()
        trainer.close()


def _two_mini_batches(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.distributed import select_rows
    from asyncrl.training.policy import PolicyTrainer

    trainer = PolicyTrainer(model_dir, cfg.model_copy(update={"mini_batches": 2}), batch_size=8)
    spy = _Spy(trainer)
    try:
        start = trainer.logprobs(batch, TEMP)  # the step-start log-probs, every column
        spy.forwards = 0
        m = trainer.train_step(batch, TEMP)
        # by count, 3 a micro batch: mini-batch rows 0-3 as [0, 1, 2], [3]; rows 4-7 as [4, 5, 6], [7]
        rows = [[0, 1, 2], [3], [4, 5, 6], [7]]
        prox_err, moved = [], []
        for c, r in zip(spy.calls, rows, strict=True):
            t = c["prox"].shape[1]
            prox_err.append(_masked_diff(c["prox"], start[r, :t], c["mask"]))
            moved.append(_masked_diff(c["logp"], start[r, :t], c["mask"]))
        halves = [select_rows(batch, 0, 4), select_rows(batch, 4, 8)]
        denominators = [[c["num_samples"], c["num_tokens"]] for c in spy.calls]
        expected = [[h.num_nonempty, h.num_tokens] for h in halves for _ in range(2)]
        return {"prox_err": prox_err, "moved": moved, "denominators": denominators, "expected": expected,
                "opt_step": float(trainer.optimizer_state()["step"]),
                "global_steps": trainer.engine.global_steps,
                "updates": m["updates"], "forwards": spy.forwards, "micro_batches": m["micro_batches"],
                "tokens": m["tokens"]}
    finally:
        spy.close()
        trainer.close()


def _tis_against_two_steps(model_dir: Path, cfg, batch) -> dict:
    """Loss tis reads no prox: 2 mini-batches in one step = one-update steps on each half, in turn."""
    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.distributed import select_rows
    from asyncrl.training.policy import PolicyTrainer

    tis = TrainingConfig(**(cfg.model_dump(exclude={"loss", "loss_params"}) | {"loss": "tis"}))
    trainer = PolicyTrainer(model_dir, tis.model_copy(update={"mini_batches": 2}), batch_size=8)
    try:
        m = trainer.train_step(batch, TEMP)
        together = trainer.model_state()
    finally:
        trainer.close()
    trainer = PolicyTrainer(model_dir, tis, batch_size=8)
    try:
        losses = [trainer.train_step(select_rows(batch, a, b), TEMP)["loss"] for a, b in ((0, 4), (4, 8))]
        apart = trainer.model_state()
    finally:
        trainer.close()
    return {"weights_err": max(float((together[n] - apart[n]).abs().max()) for n in together),
            "loss_err": abs(m["loss"] - sum(losses) / 2)}


def _clip_fractions(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    out = {}
    for name, update in (("one", {}), ("mini_batches", {"mini_batches": 2}), ("epochs", {"epochs": 2})):
        trainer = PolicyTrainer(model_dir, cfg.model_copy(update={"lr": 5e-2, **update}), batch_size=8)
        try:
            out[name] = trainer.train_step(batch, TEMP)["clip_fraction"]
        finally:
            trainer.close()
    return out


def _too_many(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    trainer = PolicyTrainer(model_dir, cfg.model_copy(update={"mini_batches": 9}), batch_size=8)
    try:
        before = trainer.model_state()
        try:
            trainer.train_step(batch, TEMP)
            error = ""
        except ValueError as e:
            error = str(e)
        after = trainer.model_state()
        return {"error": error, "unchanged": all(bool((before[n] == after[n]).all()) for n in before),
                "opt_step": float(trainer.optimizer_state()["step"])}
    finally:
        trainer.close()


def _worker(model_dir: Path) -> dict:
    from asyncrl.config.schema import TrainingConfig

    cfg = TrainingConfig(micro_batch_size=3, lr=1e-2, loss="ppo", grad_clip=1e6)
    batch = _batch()
    return {"one": _one_update(model_dir, cfg, batch), "two": _two_mini_batches(model_dir, cfg, batch),
            "tis": _tis_against_two_steps(model_dir, cfg, batch),
            "clip": _clip_fractions(model_dir, cfg, batch),
            "too_many": _too_many(model_dir, cfg, batch)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tests.helpers.tiny_random_model import build_tiny_random_model

    model_dir = build_tiny_random_model(tmp_path_factory.mktemp("model") / "tiny")
    return run_lone_trainer_script(HERE, str(model_dir), timeout_s=240)


@pytest.mark.integration
def test_one_update_is_the_hand_computed_step(results: dict) -> None:
    one = results["one"]
    assert one["loss_err"] < 1e-6 and one["norm_err"] < 1e-5 and one["grad_err"] < 1e-4, one
    assert one["opt_step"] == 1.0 and one["updates"] == 1.0, one
    # prox is the update's own log-probs; 8 rows by 3: 3 micro batches, 3 forwards, nothing more
    assert one["prox_is_logp"] and one["calls"] == 3 and one["forwards"] == 3, one
    assert one["clip_fraction"] == 0.0 and one["micro_batches"] == 3.0 and one["tokens"] == 12.0, one


@pytest.mark.integration
def test_two_mini_batches_step_twice_against_the_step_start_prox(results: dict) -> None:
    two = results["two"]
    assert two["opt_step"] == 2.0 and two["global_steps"] == 2 and two["updates"] == 2.0, two
    # every micro batch's prox is the step-start log-probs (float noise of a differently shaped forward) ...
    assert max(two["prox_err"]) < 1e-5, two
    # ... while the second update's own log-probs have moved (lr 1e-2) and the first's have not
    assert max(two["moved"][:2]) < 1e-5 and min(two["moved"][2:]) > 1e-3, two
    # each update divides by its own mini-batch: rows 0-3 and rows 4-7 (4 samples, 6 tokens each)
    assert two["denominators"] == two["expected"] == [[4, 6], [4, 6], [4, 6], [4, 6]], two
    # 4 micro batches with gradient and 4 prox forwards without; one pass's plan and tokens
    assert two["forwards"] == 8 and two["micro_batches"] == 4.0 and two["tokens"] == 12.0, two
    tis = results["tis"]
    assert tis["weights_err"] == 0.0 and tis["loss_err"] < 1e-7, tis


@pytest.mark.integration
def test_clip_fraction_moves_with_several_updates_only(results: dict) -> None:
    clip = results["clip"]
    assert clip["one"] == 0.0, clip
    assert clip["mini_batches"] > 0.0 and clip["epochs"] > 0.0, clip


@pytest.mark.integration
def test_more_mini_batches_than_samples_is_an_error_naming_the_field(results: dict) -> None:
    too_many = results["too_many"]
    assert too_many["error"] == ("training.mini_batches: expected at most the step's 8 samples (every "
                                 "mini-batch needs one), got 9"), too_many
    assert too_many["unchanged"] and too_many["opt_step"] == 0.0, too_many


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_worker(Path(sys.argv[1]))))
