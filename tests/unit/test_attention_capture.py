"""AttentionCapture on a real tiny Qwen2 (HF transformers): stats equal eager `output_attentions`,
outputs and gradients unchanged, only chosen layers captured, implementation restored; choose_layers."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from torch import nn
from transformers import AutoModelForCausalLM, Qwen2Config, Qwen2ForCausalLM

from asyncrl.training.attention_capture import _HOOK_ATTR, AttentionCapture, choose_layers
from tests.helpers.tiny_random_model import build_tiny_random_model

LENS = (9, 6)
T_LEN = 9
BAND = 5


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random_model(tmp_path_factory.mktemp("tiny"))


def _load(model_dir: Path, impl: str = "sdpa") -> Qwen2ForCausalLM:
    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation=impl)
    return model.eval()


def _gqa_model() -> Qwen2ForCausalLM:
    """4 query heads sharing 2 kv heads (GQA), random, in memory."""
    torch.manual_seed(3)
    cfg = Qwen2Config(
        hidden_size=128, num_attention_heads=4, num_key_value_heads=2, head_dim=32, num_hidden_layers=3,
        intermediate_size=128, vocab_size=32, tie_word_embeddings=True,
    )
    model = Qwen2ForCausalLM(cfg).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.1)
    return model


def _batch(padded: bool = True) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 32, (2, T_LEN), generator=g)
    mask = torch.ones(2, T_LEN, dtype=torch.long)
    if padded:
        mask[1, LENS[1] :] = 0
        ids[1, LENS[1] :] = 0
    return ids, mask


def _reference(model: Qwen2ForCausalLM, ids: torch.Tensor, mask: torch.Tensor, layers: list[int]):
    """span_sums, bands from the full maps of eager attention with output_attentions=True."""
    previous = model.config._attn_implementation
    model.set_attn_implementation("eager")
    try:
        with torch.no_grad():
            atts = model(input_ids=ids, attention_mask=mask, output_attentions=True).attentions
    finally:
        model.set_attn_implementation(previous)
    maps = torch.cat([atts[x].float() for x in layers], dim=1)  # [S, Hs, T, T]
    t = torch.arange(T_LEN)
    dist = (t.unsqueeze(1) - t.unsqueeze(0)).clamp(min=0).float()
    spans = (maps * dist).sum(-1)
    src = t.unsqueeze(1) - torch.arange(BAND).unsqueeze(0)  # [T, D]
    bands = maps.gather(-1, src.clamp(min=0).expand(*maps.shape[:2], -1, -1)) * (src >= 0)
    return spans, bands


@pytest.mark.parametrize(
    ("impl", "padded", "gqa"),
    [("sdpa", True, False), ("eager", True, False), ("sdpa", False, False), ("sdpa", True, True)],
)
def test_capture_equals_eager_attentions(model_dir: Path, impl: str, padded: bool, gqa: bool) -> None:
    model = _gqa_model() if gqa else _load(model_dir, impl)
    model.set_attn_implementation(impl)
    layers = [1, 0]  # layer-major in the given order
    ids, mask = _batch(padded)
    ref_spans, ref_bands = _reference(model, ids, mask, layers)
    with torch.no_grad(), AttentionCapture(model, layers, band=BAND, row_chunk=4) as cap:
        model(input_ids=ids, attention_mask=mask)
    heads = model.config.num_attention_heads
    assert cap.span_sums.shape == (2, 2 * heads, T_LEN) and cap.bands.shape == (2, 2 * heads, T_LEN, BAND)
    assert cap.span_sums.dtype == torch.float32 and not cap.bands.requires_grad
    for s, n in enumerate(LENS if padded else (T_LEN, T_LEN)):
        assert torch.allclose(cap.span_sums[s, :, :n], ref_spans[s, :, :n], atol=1e-5)
        assert torch.allclose(cap.bands[s, :, :n], ref_bands[s, :, :n], atol=1e-5)
        assert not cap.span_sums[s, :, n:].any() and not cap.bands[s, :, n:].any()  # padding rows zeroed
    # each valid band row of a causal map: mass of the first min(t+1, D) keys, ≤ 1
    assert bool((cap.bands.sum(-1) <= 1 + 1e-5).all())
    assert model.config._attn_implementation == impl


def test_outputs_and_gradients_unchanged(model_dir: Path) -> None:
    model = _load(model_dir)
    ids, mask = _batch()

    def run() -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        model.zero_grad(set_to_none=True)
        logits = model(input_ids=ids, attention_mask=mask).logits
        (logits.float().pow(2) * mask.unsqueeze(-1)).mean().backward()
        return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}

    logits0, grads0 = run()
    with AttentionCapture(model, [0, 1], band=BAND, row_chunk=3) as cap:
        logits1, grads1 = run()
    assert cap.captured_layers == [0, 1]
    assert torch.allclose(logits0, logits1, atol=1e-6, rtol=0)
    assert grads0.keys() == grads1.keys()
    for name, g in grads0.items():
        assert torch.allclose(g, grads1[name], atol=1e-6, rtol=0), name


def test_only_chosen_layers_and_restore(model_dir: Path) -> None:
    model = _load(model_dir)
    ids, mask = _batch()
    with torch.no_grad(), AttentionCapture(model, [1], band=BAND) as cap:
        assert model.config._attn_implementation == "asyncrl_capture_sdpa"
        model(input_ids=ids, attention_mask=mask)
    assert cap.captured_layers == [1]
    assert cap.span_sums.shape == (2, 2, T_LEN) and cap.bands.shape == (2, 2, T_LEN, BAND)
    assert model.config._attn_implementation == "sdpa"
    assert not any(hasattr(m, _HOOK_ATTR) for m in model.modules())
    # after exit a forward records nothing
    with torch.no_grad():
        model(input_ids=ids, attention_mask=mask)
    assert cap.captured_layers == [1]


def test_restores_on_error_and_reports_missing_forward(model_dir: Path) -> None:
    model = _load(model_dir, "eager")
    with pytest.raises(RuntimeError, match="boom"), AttentionCapture(model, [0]) as cap:
        raise RuntimeError("boom")
    assert model.config._attn_implementation == "eager"
    assert not any(hasattr(m, _HOOK_ATTR) for m in model.modules())
    with pytest.raises(RuntimeError, match="layers"):
        _ = cap.span_sums
    with pytest.raises(ValueError, match="layers"):
        AttentionCapture(model, [5]).__enter__()
    assert model.config._attn_implementation == "eager"


class _Engine(nn.Module):
    """The one thing AttentionCapture relies on in a DeepSpeed engine: the HF model at `.module`."""

    def __init__(self, module: nn.Module) -> None:
        super().__init__()
        self.module = module

    def forward(self, **kwargs):
        return self.module(**kwargs)


def test_unwraps_module_attribute(model_dir: Path) -> None:
    model = _load(model_dir)
    engine = _Engine(model)
    ids, mask = _batch()
    with torch.no_grad(), AttentionCapture(engine, [0], band=BAND) as cap:
        engine(input_ids=ids, attention_mask=mask)
    assert cap.captured_layers == [0] and cap.model is model
    with pytest.raises(TypeError, match="model"):
        AttentionCapture(nn.Linear(2, 2), [0])


@pytest.mark.parametrize(
    ("num_layers", "count", "expected"),
    [
        (24, 5, [8, 10, 12, 14, 16]),
        (2, 5, [0, 1]),
        (1, 5, [0]),
        (3, 5, [1, 2]),
        (28, 5, [9, 11, 14, 16, 18]),
        (36, 5, [12, 15, 18, 21, 24]),
        (24, 1, [12]),
        (24, 3, [8, 12, 16]),
    ],
)
def test_choose_layers(num_layers: int, count: int, expected: list[int]) -> None:
    assert choose_layers(num_layers, count) == expected


def test_choose_layers_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="num_layers"):
        choose_layers(0)
    with pytest.raises(ValueError, match="count"):
        choose_layers(4, 0)
