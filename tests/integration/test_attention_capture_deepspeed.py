"""AttentionCapture through a real DeepSpeed engine (PolicyTrainer, CPU, gloo), ZeRO stages 0 and 3.

The worker runs in its own interpreter (`python this_file.py <stage> <model_dir>`, as in
test_policy_deepspeed) and prints one JSON line: the capture through the engine must equal the
capture on a plain HF model, and the engine's logits must not change.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.helpers.subprocess_runs import run_lone_trainer_script

HERE = Path(__file__).resolve()
REPO = HERE.parents[2]


def _worker(stage: int, model_dir: Path) -> dict:
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.attention_capture import AttentionCapture
    from asyncrl.training.policy import PolicyTrainer

    ids = torch.tensor([[3, 4, 5, 6, 7, 8, 9], [10, 11, 12, 13, 0, 0, 0]])
    mask = (ids != 0).long()
    ref = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32).eval()
    with torch.no_grad(), AttentionCapture(ref, [0, 1], band=4, row_chunk=3) as ref_cap:
        ref(input_ids=ids, attention_mask=mask)
    trainer = PolicyTrainer(model_dir, TrainingConfig(zero_stage=stage, micro_batch_size=2), batch_size=2)
    try:
        engine = trainer.engine
        with torch.no_grad():
            plain = engine(input_ids=ids, attention_mask=mask, use_cache=False).logits
        with AttentionCapture(engine, [0, 1], band=4, row_chunk=3) as cap:
            out = engine(input_ids=ids, attention_mask=mask, use_cache=False).logits
            engine.backward(out.float().pow(2).mean())  # a backward inside the context works
        return {
            "logits_err": (plain - out.detach()).abs().max().item(),
            "span_err": (cap.span_sums - ref_cap.span_sums).abs().max().item(),
            "band_err": (cap.bands - ref_cap.bands).abs().max().item(),
            "layers": cap.captured_layers,
            "impl": cap.model.config._attn_implementation,
        }
    finally:
        trainer.close()


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from tests.helpers.tiny_random_model import build_tiny_random_model

    return build_tiny_random_model(tmp_path_factory.mktemp("tiny_capture"))


@pytest.mark.integration
@pytest.mark.parametrize("stage", [0, 3])
def test_capture_through_deepspeed_engine(stage: int, model_dir: Path) -> None:
    res = run_lone_trainer_script(HERE, str(stage), str(model_dir))
    assert res["layers"] == [0, 1], res
    assert res["impl"] == "sdpa", res
    assert res["logits_err"] <= 1e-6, res
    assert res["span_err"] < 1e-5 and res["band_err"] < 1e-5, res


if __name__ == "__main__":
    import logging

    logging.basicConfig(level=logging.WARNING)
    print(json.dumps(_worker(int(sys.argv[1]), Path(sys.argv[2]))))
