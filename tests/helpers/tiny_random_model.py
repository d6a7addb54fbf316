"""Build a tiny RANDOM Qwen2 model folder for tests (no tokenizer: vLLM runs with token ids in/out).

Shape: hidden 128, 2 heads of 64 (vLLM's CPU attention needs head size 64), 2 layers, vocab 32, tied
embeddings, float32 so trainer-side and vLLM-side weights compare exactly. Deterministic for a given seed.
"""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

VOCAB_SIZE = 32


def tiny_qwen2_config(max_position_embeddings: int = 256) -> Qwen2Config:
    return Qwen2Config(
        hidden_size=128,
        num_attention_heads=2,
        num_key_value_heads=2,
        head_dim=64,
        num_hidden_layers=2,
        intermediate_size=256,
        vocab_size=VOCAB_SIZE,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        torch_dtype="float32",
        bos_token_id=None,
        eos_token_id=None,  # no EOS: outputs run to max_tokens unless stop_token_ids say otherwise
    )


def build_tiny_random_model(folder: str | Path, seed: int = 0, max_position_embeddings: int = 256) -> Path:
    """Write a randomly initialised tiny Qwen2 (safetensors + config.json) into `folder`; return it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    model = Qwen2ForCausalLM(tiny_qwen2_config(max_position_embeddings)).to(torch.float32)
    # HF's default init gives near-uniform outputs; widen it so sampling is far from uniform.
    with torch.no_grad():
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(folder, safe_serialization=True)
    return folder
