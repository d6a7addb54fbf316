"""LoRA: the wire names, the merge on hand-computed numbers, the trainer's injection and its checks, and a worker's
merger reading the base from a model folder (docs/algorithms.md §8)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from pydantic import ValidationError
from safetensors.torch import save_file

from asyncrl.adapters.lora import adapter_pairs, merged_weights, wire_name
from asyncrl.config.schema import LoraConfig, TrainingConfig
from asyncrl.generation.lora_merge import LoraMerger
from asyncrl.training.lora import adapter_params, check_targets, inject
from tests.helpers.tiny_random_model import build_tiny_random_model


def test_wire_names() -> None:
    assert wire_name("model.layers.0.self_attn.q_proj.lora_A.default.weight") == "model.layers.0.self_attn.q_proj.lora_A"
    assert wire_name("model.layers.3.mlp.down_proj.lora_B.default.weight") == "model.layers.3.mlp.down_proj.lora_B"
    assert wire_name("model.layers.0.self_attn.q_proj.base_layer.weight") is None
    assert wire_name("model.embed_tokens.weight") is None


def test_merge_on_hand_computed_numbers() -> None:
    """W = [[1, 2, 3], [4, 5, 6]], A = [[1, 0, -1]] (1 x 3), B = [[2], [-1]] (2 x 1), s = 0.5:
    B @ A = [[2, 0, -2], [-1, 0, 1]], W' = [[2, 2, 2], [3.5, 5, 6.5]]."""
    base = {"m.q.weight": torch.tensor([[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]])}
    pairs = adapter_pairs([("m.q.lora_A", torch.tensor([[1.0, 0.0, -1.0]])), ("m.q.lora_B", torch.tensor([[2.0], [-1.0]]))])
    [(name, w)] = merged_weights(base, pairs, 0.5)
    assert name == "m.q.weight" and w.tolist() == [[2.0, 2.0, 2.0], [3.5, 5.0, 6.5]]
    assert base["m.q.weight"].tolist() == [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0]]  # the base is never written


def test_bad_adapters_name_the_module() -> None:
    a, b = torch.zeros(2, 3), torch.zeros(4, 2)
    with pytest.raises(ValueError, match="only one of lora_A and lora_B: \\['m.k'\\]"):
        adapter_pairs([("m.k.lora_A", a)])
    with pytest.raises(ValueError, match="expected tensors named <module>.lora_A"):
        adapter_pairs([("m.k.weight", a)])
    with pytest.raises(ValueError, match="LoRA adapter m.k: expected A \\(rank x in\\) and B \\(out x rank\\)"):
        adapter_pairs([("m.k.lora_A", a), ("m.k.lora_B", torch.zeros(4, 3))])
    pairs = adapter_pairs([("m.k.lora_A", a), ("m.k.lora_B", b)])
    with pytest.raises(ValueError, match="the base model has no weight 'm.k.weight'"):
        merged_weights({}, pairs, 1.0)
    with pytest.raises(ValueError, match="B @ A is 4 x 3, the base weight \\(3, 3\\)"):
        merged_weights({"m.k.weight": torch.zeros(3, 3)}, pairs, 1.0)


def test_config_checks() -> None:
    assert LoraConfig(rank=8, alpha=16).scale == 2.0
    with pytest.raises(ValidationError, match="the embedding and LM head are not adapted"):
        LoraConfig(target_modules=["q_proj", "lm_head"])
    with pytest.raises(ValidationError, match="expected each name once"):
        LoraConfig(target_modules=["q_proj", "q_proj"])
    with pytest.raises(ValidationError, match="expected module names such as 'q_proj'"):
        LoraConfig(target_modules=["layers.0.q_proj"])
    with pytest.raises(ValidationError, match="rank"):
        TrainingConfig(lora={"rank": 0})


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_tiny_random_model(tmp_path_factory.mktemp("lora-tiny"))


def _model(folder: Path) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()


def test_inject_trains_only_the_adapters_and_starts_at_the_base(tiny: Path) -> None:
    base = _model(tiny)
    ids = torch.tensor([[1, 2, 3, 4]])
    with torch.no_grad():
        before = base(input_ids=ids).logits
    torch.manual_seed(0)
    model = inject(_model(tiny), LoraConfig(rank=4, alpha=8, target_modules=["q_proj", "down_proj"]))
    trainable = [n for n, p in model.named_parameters() if p.requires_grad]
    names = [n for n, _ in adapter_params(model)]
    assert len(trainable) == len(names) == 2 * 2 * 2  # 2 layers x 2 targets x (A, B)
    assert names[:2] == ["model.layers.0.self_attn.q_proj.lora_A", "model.layers.0.self_attn.q_proj.lora_B"]
    with torch.no_grad():
        assert torch.equal(model(input_ids=ids).logits, before)  # B = 0: the first policy is the base model


def test_targets_and_rank_are_checked_against_the_model(tiny: Path) -> None:
    model = _model(tiny)
    with pytest.raises(ValueError, match="training.lora.target_modules: \\['wq'\\] name no linear layer .* it has "
                                         "\\['down_proj', 'gate_proj', 'k_proj', 'o_proj', 'q_proj', 'up_proj', 'v_proj'\\]"):
        check_targets(model, LoraConfig(target_modules=["q_proj", "wq"]))
    with pytest.raises(ValueError, match="training.lora.rank: 129 is above the smaller dimension \\(128\\)"):
        check_targets(model, LoraConfig(rank=129))


def test_worker_merger_merges_from_the_base_every_time(tiny: Path, tmp_path: Path) -> None:
    """The merged weights equal the trainer's LoRA forward; a second adapter merges into the base, not the first."""
    torch.manual_seed(1)
    model = inject(_model(tiny), LoraConfig(rank=4, alpha=8))
    merger = LoraMerger(tiny, scale=2.0)
    ids = torch.tensor([[5, 6, 7, 8, 9]])
    for seed in (1, 2):
        g = torch.Generator().manual_seed(seed)
        with torch.no_grad():
            for _, p in adapter_params(model):
                p.copy_(0.3 * torch.randn(p.shape, generator=g))
            want = model(input_ids=ids).logits
        served = _model(tiny)
        merged = dict(merger.merge([(n, p.detach()) for n, p in adapter_params(model)]))
        assert len(merged) == 2 * 7
        served.load_state_dict({**served.state_dict(), **merged})
        with torch.no_grad():
            assert torch.allclose(served(input_ids=ids).logits, want, atol=1e-4)
    save_file({"other.weight": torch.zeros(2, 2)}, str(tmp_path / "model.safetensors"))
    with pytest.raises(ValueError, match="no tensor 'x.q.weight' .* names a layer the served model does not have"):
        LoraMerger(tmp_path, 1.0).merge([("x.q.lora_A", torch.zeros(1, 2)), ("x.q.lora_B", torch.zeros(2, 1))])
