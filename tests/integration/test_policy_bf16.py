"""PolicyTrainer with `training.matmul_dtype: bfloat16` on a real DeepSpeed engine (CPU, gloo, ZeRO 0).

Checks: the model attends in float32 (`FLOAT32_SDPA`) while its matrix products run in bf16; log-probs close to a
float32 Hugging Face forward (not equal); prox == logp exactly at the step start (the same forward); weights and
optimizer state stay float32; a rewarded token's log-prob rises over a few steps, as in float32.

Runs in its own interpreter (`python this_file.py <model_dir>`), as test_policy_deepspeed.py does.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.subprocess_runs import run_lone_trainer_script
from tests.integration.test_policy_deepspeed import GOOD, PROMPT, _build_model, _groups

HERE = Path(__file__).resolve()


def _worker(model_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.batch import build_batch
    from asyncrl.training.mixed_precision import FLOAT32_SDPA
    from asyncrl.training.policy import PolicyTrainer

    temp = 0.7
    cfg = TrainingConfig(zero_stage=0, micro_batch_size=3, lr=1e-2, loss="decoupled_ppo", matmul_dtype="bfloat16")
    trainer = PolicyTrainer(model_dir, cfg, batch_size=8)
    res: dict = {"autocast": trainer.autocast, "attn": trainer.engine.module.config._attn_implementation}
    try:
        groups = _groups(trainer, temp)
        batch = build_batch(groups, norm_std=True, pad_id=0)
        ref = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        lp = trainer.logprobs(batch, temp)
        with torch.no_grad():
            logits = ref(input_ids=torch.tensor([PROMPT + [GOOD, 8]])).logits[0] / temp
            hf = [torch.log_softmax(logits[2], -1)[GOOD].item(), torch.log_softmax(logits[3], -1)[8].item()]
        res["align_err"] = max(abs(lp[2, 3].item() - hf[0]), abs(lp[2, 4].item() - hf[1]))
        res["good_lp"] = [lp[0, 3].item()]
        m1 = trainer.train_step(batch, temp)
        res["prox_metrics"] = {k: m1[k] for k in ("approx_kl", "behav_prox_abs_diff", "iw_mean", "clip_fraction")}
        for _ in range(4):
            trainer.train_step(batch, temp)
        res["good_lp"].append(trainer.logprobs(batch, temp)[0, 3].item())
        res["weight_dtypes"] = sorted({str(t.dtype) for _, t in trainer.named_weights()})
        res["optimizer_dtypes"] = sorted({str(t.dtype) for t in trainer.optimizer_state().values()})
        res["attn_expected"] = FLOAT32_SDPA
    finally:
        trainer.close()
    return res


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tiny_qwen2_bf16")
    _build_model(path)
    return path


@pytest.mark.integration
def test_policy_trainer_bf16_matmuls(model_dir: Path) -> None:
    res = run_lone_trainer_script(HERE, str(model_dir))
    assert res["autocast"] is True and res["attn"] == res["attn_expected"], res
    assert 0 < res["align_err"] < 0.05, res  # bf16 matrix products: close to float32, not equal
    pm = res["prox_metrics"]
    # The behaviour log-probs came from the same bf16 forward: prox == behav == logp, nothing clips.
    assert pm["approx_kl"] == 0.0 and pm["behav_prox_abs_diff"] < 1e-6, res
    assert abs(pm["iw_mean"] - 1.0) < 1e-6 and pm["clip_fraction"] == 0.0, res
    assert res["weight_dtypes"] == ["torch.float32"], res
    assert set(res["optimizer_dtypes"]) <= {"torch.float32", "torch.int64"}, res
    assert res["good_lp"][1] > res["good_lp"][0] + 0.5, res


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_worker(Path(sys.argv[1]))))
