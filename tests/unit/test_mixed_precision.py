"""`asyncrl.training.mixed_precision`: the choice of the trainer's matmul dtype, and the float32 attention that the
model uses under bf16 autocast (masking included)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from asyncrl.config.load import ConfigError, config_from_dict
from asyncrl.training import mixed_precision as mp


def test_cpuinfo_flags_decide_native_bf16(tmp_path: Path) -> None:
    amx = tmp_path / "amx"
    amx.write_text("processor\t: 0\nflags\t\t: fpu avx512f avx512_bf16 amx_bf16 amx_tile\n\n")
    plain = tmp_path / "plain"
    plain.write_text("processor\t: 0\nflags\t\t: fpu avx2 fma amx_bf16x\nbugs\t: amx_bf16\n")
    assert mp.cpu_has_native_bf16(str(amx)) is True
    assert mp.cpu_has_native_bf16(str(plain)) is False  # only the flags line counts, whole words only
    assert mp.cpu_has_native_bf16(str(tmp_path / "missing")) is False


def test_resolve_autocast(monkeypatch: pytest.MonkeyPatch) -> None:
    cpu = torch.device("cpu")
    assert mp.resolve_autocast("float32", cpu) is False
    assert mp.resolve_autocast("bfloat16", cpu) is True
    monkeypatch.setattr(mp, "cpu_has_native_bf16", lambda: True)
    assert mp.resolve_autocast("auto", cpu) is True
    monkeypatch.setattr(mp, "cpu_has_native_bf16", lambda: False)
    assert mp.resolve_autocast("auto", cpu) is False
    with pytest.raises(ValueError, match="training.matmul_dtype: expected one of float32, bfloat16, auto"):
        mp.resolve_autocast("fp16", cpu)


def test_config_names_a_bad_matmul_dtype() -> None:
    assert config_from_dict({"training": {"matmul_dtype": "bfloat16"}}).training.matmul_dtype == "bfloat16"
    with pytest.raises(ConfigError, match="training.matmul_dtype"):
        config_from_dict({"training": {"matmul_dtype": "fp16"}})


def _tiny_qwen2() -> torch.nn.Module:
    from transformers import AutoModelForCausalLM, Qwen2Config

    torch.manual_seed(0)
    cfg = Qwen2Config(hidden_size=128, num_attention_heads=2, num_key_value_heads=2, num_hidden_layers=2,
                      intermediate_size=256, vocab_size=32, tie_word_embeddings=True)
    return AutoModelForCausalLM.from_config(cfg).eval()


def test_float32_sdpa_matches_sdpa_and_honours_padding() -> None:
    model = _tiny_qwen2()
    # Left padding: row 1's first two columns are padding, which a mask-less attention would attend to.
    ids = torch.tensor([[3, 4, 5, 6, 7, 8], [0, 0, 5, 6, 7, 8]])
    mask = torch.tensor([[1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 1, 1]])
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        ref = model(input_ids=ids, attention_mask=mask).logits
        alone = model(input_ids=ids[1:, 2:]).logits
        model.set_attn_implementation(mp.register_float32_sdpa())
        assert mp.register_float32_sdpa() == mp.FLOAT32_SDPA  # registering twice is harmless
        f32 = model(input_ids=ids, attention_mask=mask).logits
        with mp.autocast_context(True, torch.device("cpu")):
            bf16 = model(input_ids=ids, attention_mask=mask).logits
    assert torch.allclose(f32, ref, atol=1e-5)
    # The padded row's real tokens see only themselves: as the same tokens without padding (positions aside,
    # which rotary embeddings make relative).
    assert torch.allclose(f32[1, 2:], alone[0], atol=1e-4)
    assert bf16.dtype == torch.bfloat16
    assert (bf16.float() - f32).abs().max() < 0.1  # bf16 matrix products: close, not equal


def test_autocast_context_off_is_a_no_op() -> None:
    a, b = torch.randn(4, 8), torch.randn(8, 4)
    with mp.autocast_context(False, torch.device("cpu")):
        assert (a @ b).dtype == torch.float32
    with mp.autocast_context(True, torch.device("cpu")):
        assert (a @ b).dtype == torch.bfloat16
