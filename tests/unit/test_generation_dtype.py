"""`generation.dtype`: the engines' settings take it, and the trainer's weight group sends (and checksums) its float32
master weights cast to it (the real push to a bfloat16 server is tests/integration/test_weight_sync.py); the KV
cache's budget in that dtype (`asyncrl.generation.kv_budget`)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.config.load import ConfigError
from asyncrl.generation.kv_budget import gib_for, kv_bytes_per_token, kv_cache_warning, sequences_that_fit
from asyncrl.roles.context import RoleContext
from asyncrl.roles.generation import engine_settings, warn_small_kv_cache
from asyncrl.roles.weight_group import WeightGroup
from asyncrl.weights.buckets import weights_checksum


def _group(dtype: str) -> WeightGroup:
    cfg = load_config(None, [f"generation.dtype={dtype}"])
    ctx: Any = RoleContext("training", "0", "s3://bucket/prefix/run", None, None, cfg)  # only its config is read
    return WeightGroup(ctx, torch.device("cpu"))


def test_the_engine_runs_in_the_configured_dtype() -> None:
    assert load_config(None).generation.dtype == "float32"
    g = load_config(None, ["generation.dtype=bfloat16"]).generation
    assert engine_settings(g, "/m", index=1, version=3).dtype == "bfloat16"
    with pytest.raises(ConfigError, match="generation.dtype"):
        load_config(None, ["generation.dtype=float16"])


def test_bf16_engines_get_bf16_weights_and_the_checksum_of_what_they_get() -> None:
    master = [("w", torch.tensor([1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9, 0.1])), ("steps", torch.tensor([7]))]
    group = _group("bfloat16")
    wire = group.wire(master)
    assert [t.dtype for _, t in wire] == [torch.bfloat16, torch.int64]
    assert wire[0][1].tolist() == [1.0, 1.0078125, 0.10009765625]
    assert master[0][1].dtype == torch.float32  # the trainer's master weights are not touched
    # an engine that loads the float32 folder in bf16 holds exactly these bits: the checksums compare
    engine_holds = [("w", torch.empty(3, dtype=torch.bfloat16).copy_(master[0][1])), ("steps", master[1][1])]
    assert group.checksum(master) == weights_checksum(engine_holds)
    assert group.checksum(master) != weights_checksum(master)
    f32 = _group("float32")
    assert f32.checksum(master) == weights_checksum(master)
    assert f32.wire(master)[0][1].data_ptr() == master[0][1].data_ptr()  # float32: sent as they are, no copy


def test_kv_cache_budget_exact_numbers() -> None:
    smollm2 = {"num_hidden_layers": 30, "hidden_size": 576, "num_attention_heads": 9, "num_key_value_heads": 3,
               "head_dim": 64}
    assert kv_bytes_per_token(smollm2, "float32") == 2 * 30 * 3 * 64 * 4 == 46_080
    assert kv_bytes_per_token(smollm2, "bfloat16") == 23_040
    # 0.25 GiB = 268,435,456 bytes = 364 blocks of 16 tokens (737,280 bytes); 352 tokens take 22 blocks
    assert sequences_that_fit(smollm2, "float32", 0.25, 352) == 16
    assert sequences_that_fit(smollm2, "bfloat16", 0.25, 352) == 33
    assert gib_for(smollm2, "float32", 64, 352) == 64 * 22 * 737_280 / 2**30
    assert sequences_that_fit(smollm2, "float32", gib_for(smollm2, "float32", 64, 352), 352) == 64
    warning = kv_cache_warning(smollm2, "float32", 0.25, 64, 352)
    assert warning is not None and "holds 16 sequences" in warning and "generation.max_num_seqs 64" in warning
    assert "0.97 GiB" in warning
    assert kv_cache_warning(smollm2, "float32", 1.0, 64, 352) is None
    with pytest.raises(ValueError, match="'num_hidden_layers'"):
        kv_bytes_per_token({"num_attention_heads": 9, "hidden_size": 576}, "float32")


def test_the_generation_role_warns_of_a_kv_cache_too_small(tmp_path: Path) -> None:
    (tmp_path / "config.json").write_text(json.dumps({"num_hidden_layers": 30, "hidden_size": 576,
                                                      "num_attention_heads": 9, "num_key_value_heads": 3}))
    g = load_config(None, ["generation.max_model_len=352", "generation.max_num_seqs=64"]).generation
    assert "holds 16 sequences" in (warn_small_kv_cache(g, tmp_path) or "")
    assert warn_small_kv_cache(g.model_copy(update={"kv_cache_gib": 1.0}), tmp_path) is None
    assert warn_small_kv_cache(g, tmp_path / "missing") is None
