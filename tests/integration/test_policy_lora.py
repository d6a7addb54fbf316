"""LoRA training in `PolicyTrainer` (`training.lora`) on a real DeepSpeed engine (CPU, gloo, ZeRO 0), in one
subprocess (`python this_file.py <model_dir>`, as tests/integration/test_policy_deepspeed.py).

Checks:
- the trainer starts at the base model (B = 0) and trains only the adapters: after a step every base weight is
  bit-identical, the adapters moved, the optimizer holds moments for the adapters alone, and what a push sends
  (`named_weights`) is the adapters under their wire names;
- the merged weights (`asyncrl.adapters.lora.merged_weights`, what a generation worker serves) give the trainer's log-probs;
- a checkpoint round trip (model and optimizer state into a fresh trainer) gives the same next step, bit for bit;
- LoRA dropout: the prox comes from a forward without it (a prox pass runs) and the step trains;
- gradient checkpointing with frozen embeddings still trains the adapters;
- a target that is not in the model, or a rank above a target's dimension: a ValueError naming the field, before
  DeepSpeed starts.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.subprocess_runs import run_lone_trainer_script

HERE = Path(__file__).resolve()
PROMPT = [1, 2, 3]
RESPONSES = [[5], [6, 7], [5, 8], [9], [6], [5], [10, 11], [5, 5]]


def _batch():
    from asyncrl.training.batch import build_batch
    from asyncrl.types import Group, Sample

    groups = []
    for g in range(2):
        samples = [Sample(f"g{g}", j, PROMPT, r, [-2.0 - 0.1 * k for k in range(len(r))], [0] * len(r), 0,
                          reward=float(r[0] == 5)) for j, r in enumerate(RESPONSES[4 * g : 4 * g + 4])]
        groups.append(Group(f"g{g}", g, "t", samples))
    return build_batch(groups, norm_std=True, pad_id=0)


def _train(model_dir: Path, cfg, batch) -> dict:
    import torch

    from asyncrl.adapters.lora import adapter_pairs, merged_weights
    from asyncrl.training.policy import PolicyTrainer

    trainer = PolicyTrainer(model_dir, cfg, batch_size=8)
    try:
        module = trainer.engine.module
        base_before = {n: p.detach().clone() for n, p in module.named_parameters() if "lora_" not in n}
        lp0 = trainer.logprobs(batch)
        metrics = trainer.train_step(batch)
        changed_base = [n for n, p in module.named_parameters() if "lora_" not in n
                        and not torch.equal(p.detach(), base_before[n])]
        sent = trainer.named_weights()
        opt = trainer.optimizer_state()
        # the merged model a worker serves gives the trainer's log-probs
        from transformers import AutoModelForCausalLM

        served = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
        base = {n.replace(".base_layer", ""): t for n, t in base_before.items()}
        merged = dict(merged_weights(base, adapter_pairs(sent), cfg.lora.scale))
        served.load_state_dict({**served.state_dict(), **merged})
        ids = batch.input_ids[:1]
        with torch.no_grad():
            want = torch.log_softmax(served(input_ids=ids).logits / 1.0, -1)
            got = torch.log_softmax(module(input_ids=ids).logits, -1)
        # a checkpoint round trip: the same next step in a fresh trainer
        state, opt_state = trainer.model_state(), trainer.optimizer_state()
        after_one = trainer.train_step(batch)
        fresh = PolicyTrainer(model_dir, cfg, batch_size=8)
        try:
            fresh.load_state(state, opt_state)
            again = fresh.train_step(batch)
            same_next = all(torch.equal(a, b) for (_, a), (_, b) in zip(trainer.named_weights(), fresh.named_weights(),
                                                                          strict=True))
        finally:
            fresh.close()
        return {
            "changed_base": changed_base, "sent": [n for n, _ in sent][:4], "n_sent": len(sent),
            "all_adapters": all(n.endswith((".lora_A", ".lora_B")) for n, _ in sent),
            "b_moved": float(max(t.abs().max() for n, t in sent if n.endswith(".lora_B"))),
            "opt_keys": sorted({k.split(".", 1)[0] for k in opt}), "opt_n": len(opt),
            "merged_err": float((want - got).abs().max()),
            "loss": metrics["loss"], "same_next": same_next, "loss_next": [after_one["loss"], again["loss"]],
            "start_lp": float(lp0[0, 3]),
        }
    finally:
        trainer.close()


def _dropout(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    trainer = PolicyTrainer(model_dir, cfg.model_copy(update={"lora": cfg.lora.model_copy(update={"dropout": 0.5})}),
                            batch_size=8)
    try:
        forwards = []
        trainer.engine.module.register_forward_hook(lambda *_: forwards.append(1))
        m = trainer.train_step(batch)
        return {"forwards": len(forwards), "loss": m["loss"], "dropout_modules": len(trainer._dropout),
                "eval_after": all(not d.training for d in trainer._dropout)}
    finally:
        trainer.close()


def _checkpointing(model_dir: Path, cfg, batch) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    trainer = PolicyTrainer(model_dir, cfg.model_copy(update={"gradient_checkpointing": True}), batch_size=8)
    try:
        m = trainer.train_step(batch)
        return {"grad_norm": m["grad_norm"],
                "b_moved": float(max(t.abs().max() for n, t in trainer.named_weights() if n.endswith("lora_B")))}
    finally:
        trainer.close()


def _bad(model_dir: Path, cfg) -> dict:
    from asyncrl.training.policy import PolicyTrainer

    out = {}
    for key, update in (("target", {"target_modules": ["q_proj", "wq"]}), ("rank", {"rank": 129})):
        try:
            PolicyTrainer(model_dir, cfg.model_copy(update={"lora": cfg.lora.model_copy(update=update)})).close()
            out[key] = None
        except ValueError as e:
            out[key] = str(e)
    return out


def _worker(model_dir: Path) -> dict:
    from asyncrl.config.schema import LoraConfig, TrainingConfig

    cfg = TrainingConfig(micro_batch_size=4, lr=1e-2, loss="ppo", lora=LoraConfig(rank=4, alpha=8.0))
    batch = _batch()
    return {"train": _train(model_dir, cfg, batch), "dropout": _dropout(model_dir, cfg, batch),
            "checkpointing": _checkpointing(model_dir, cfg, batch), "bad": _bad(model_dir, cfg)}


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> dict:
    from tests.helpers.tiny_random_model import build_tiny_random_model

    model_dir = build_tiny_random_model(tmp_path_factory.mktemp("model") / "tiny")
    return run_lone_trainer_script(HERE, str(model_dir), timeout_s=300)


@pytest.mark.integration
def test_only_the_adapters_train_and_travel(results: dict) -> None:
    t = results["train"]
    assert t["changed_base"] == [] and t["all_adapters"] and t["b_moved"] > 0, t
    assert t["n_sent"] == 2 * 7 * 2 and t["sent"][:2] == ["model.layers.0.self_attn.q_proj.lora_A",
                                                         "model.layers.0.self_attn.q_proj.lora_B"], t
    assert t["opt_keys"] == ["exp_avg", "exp_avg_sq", "step"] and t["opt_n"] == 1 + 2 * t["n_sent"], t


@pytest.mark.integration
def test_the_merged_model_is_the_trainers(results: dict) -> None:
    assert results["train"]["merged_err"] < 1e-4, results["train"]


@pytest.mark.integration
def test_a_checkpoint_round_trip_gives_the_same_next_step(results: dict) -> None:
    t = results["train"]
    assert t["same_next"] and t["loss_next"][0] == t["loss_next"][1], t


@pytest.mark.integration
def test_dropout_and_checkpointing(results: dict) -> None:
    d = results["dropout"]
    # 2 micro batches: 2 prox forwards without dropout and 2 with it; dropout back off after the step
    assert d["dropout_modules"] == 2 * 7 and d["forwards"] == 4 and d["eval_after"], d
    c = results["checkpointing"]
    assert c["grad_norm"] > 0 and c["b_moved"] > 0, c


@pytest.mark.integration
def test_bad_targets_and_ranks_name_the_field(results: dict) -> None:
    bad = results["bad"]
    assert bad["target"].startswith("training.lora.target_modules: ['wq'] name no linear layer"), bad
    assert bad["rank"].startswith("training.lora.rank: 129 is above the smaller dimension (128)"), bad


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_worker(Path(sys.argv[1]))))
