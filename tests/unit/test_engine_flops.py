"""The engine-alone benchmark's work count (benchmarks/real_parts/engine_flops.py), exact numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_parts.engine_flops import ModelShape, attention_flops, batch_work, sequence_work  # noqa: E402

SMOLLM2_135M = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
                "head_dim": 64, "intermediate_size": 1536, "vocab_size": 49152, "tie_word_embeddings": True}


def test_smollm2_parameters_tied_head_counted_once() -> None:
    shape = ModelShape.from_config(SMOLLM2_135M)
    # per layer: q,k,v 576 x (9 + 3 + 3) x 64 = 552,960; o 331,776; gate, up, down 3 x 576 x 1536 = 2,654,208
    assert shape.linear_params == 30 * 3_538_944 == 106_168_320
    assert shape.head_params == 28_311_552
    assert shape.params == 134_479_872


def test_one_sequence_linear_logits_and_attention() -> None:
    shape = ModelShape.from_config(SMOLLM2_135M)
    w = sequence_work(shape, prompt_tokens=3, generated_tokens=2)
    # the body runs on positions 0..3 (the last generated token is not fed back), logits at 2 of them
    assert (w.body_positions, w.logit_positions) == (4, 2)
    assert w.linear_flops == 2 * 106_168_320 * 4 + 2 * 28_311_552 * 2 == 962_592_768
    assert w.attention_flops == 4 * 9 * 64 * 30 * (1 + 2 + 3 + 4) == 691_200
    assert w.total_flops == 963_283_968
    cached = sequence_work(shape, prompt_tokens=3, generated_tokens=2, cached_prompt_tokens=2)
    assert cached.body_positions == 2
    assert cached.linear_flops == 2 * 106_168_320 * 2 + 2 * 28_311_552 * 2
    assert cached.attention_flops == 4 * 9 * 64 * 30 * (3 + 4)
    assert sequence_work(shape, 5, 0) == batch_work(shape, [])


def test_batch_is_the_sum_and_missing_head_dim_is_derived() -> None:
    shape = ModelShape.from_config({"num_hidden_layers": 1, "hidden_size": 4, "num_attention_heads": 2,
                                    "intermediate_size": 8, "vocab_size": 10})
    assert (shape.head_dim, shape.kv_heads, shape.tied) == (2, 2, False)
    assert shape.linear_params == 4 * 6 * 2 + 2 * 2 * 4 + 3 * 4 * 8 == 160
    total = batch_work(shape, [(2, 3, 0), (1, 1, 0)])
    a, b = sequence_work(shape, 2, 3), sequence_work(shape, 1, 1)
    assert total.linear_flops == a.linear_flops + b.linear_flops == 2 * 160 * (4 + 1) + 2 * 40 * (3 + 1)
    assert total.attention_flops == attention_flops(shape, 0, 4) + attention_flops(shape, 0, 1) == 16 * 1 * (10 + 1)


def test_bad_counts_and_configs_are_refused() -> None:
    shape = ModelShape.from_config(SMOLLM2_135M)
    with pytest.raises(ValueError, match="cached < prompt"):
        sequence_work(shape, 3, 2, cached_prompt_tokens=3)
    with pytest.raises(ValueError, match="start <= end"):
        attention_flops(shape, 4, 2)
    with pytest.raises(ValueError, match="'intermediate_size'"):
        ModelShape.from_config({k: v for k, v in SMOLLM2_135M.items() if k != "intermediate_size"})
