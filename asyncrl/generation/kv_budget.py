"""How many sequences a generation engine's KV cache holds: pure arithmetic on the model's `config.json`.

Owns the check that `generation.kv_cache_gib` can hold `generation.max_num_seqs` sequences of `max_model_len` tokens.
When it cannot, vLLM still admits `max_num_seqs` requests, allocating KV blocks as sequences grow, and once the cache
is full it preempts some of them (their KV is dropped and recomputed later): the batch is smaller than configured and
work is done twice. Answers that end early need fewer blocks, so this is the worst case, and a warning, not an error.
On SmolLM2-135M (30 layers, 3 KV heads of 64) a token's KV is 46,080 bytes in float32, so the default 0.25 GiB holds
364 blocks of 16 tokens: 16 sequences of 352 tokens, not 64.

Invariants: a token's KV is 2 (K and V) x layers x KV heads x head size x the dtype's bytes; vLLM allocates whole
blocks of `block_size` tokens per sequence, so a sequence of L tokens takes ceil(L / block_size) blocks.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}
BLOCK_SIZE = 16  # vLLM's KV block on the CPU (and its default on GPUs)


def kv_bytes_per_token(model_config: Mapping[str, Any], dtype: str) -> int:
    """Bytes of KV cache one token takes in every layer, from a Hugging Face `config.json`."""
    if dtype not in DTYPE_BYTES:
        raise ValueError(f"generation.dtype: expected one of {sorted(DTYPE_BYTES)}, got {dtype!r}")
    try:
        heads = int(model_config["num_attention_heads"])
        head_dim = int(model_config.get("head_dim") or int(model_config["hidden_size"]) // heads)
        kv_heads = int(model_config.get("num_key_value_heads") or heads)
        layers = int(model_config["num_hidden_layers"])
    except KeyError as e:
        raise ValueError(f"config.json: expected {e.args[0]!r} to size the KV cache") from None
    return 2 * layers * kv_heads * head_dim * DTYPE_BYTES[dtype]


def sequences_that_fit(model_config: Mapping[str, Any], dtype: str, kv_cache_gib: float, max_model_len: int,
                       block_size: int = BLOCK_SIZE) -> int:
    """Whole sequences of `max_model_len` tokens that `kv_cache_gib` holds at once."""
    blocks_per_seq = -(-max_model_len // block_size)
    block_bytes = block_size * kv_bytes_per_token(model_config, dtype)
    return int(kv_cache_gib * 2**30) // block_bytes // blocks_per_seq


def gib_for(model_config: Mapping[str, Any], dtype: str, max_num_seqs: int, max_model_len: int,
            block_size: int = BLOCK_SIZE) -> float:
    """The smallest `kv_cache_gib` that holds `max_num_seqs` whole sequences of `max_model_len` tokens."""
    blocks = max_num_seqs * -(-max_model_len // block_size)
    return blocks * block_size * kv_bytes_per_token(model_config, dtype) / 2**30


def kv_cache_warning(model_config: Mapping[str, Any], dtype: str, kv_cache_gib: float, max_num_seqs: int,
                     max_model_len: int) -> str | None:
    """A message naming the fields when the cache holds fewer than `max_num_seqs` whole sequences, else None."""
    fit = sequences_that_fit(model_config, dtype, kv_cache_gib, max_model_len)
    if fit >= max_num_seqs:
        return None
    need = gib_for(model_config, dtype, max_num_seqs, max_model_len)
    return (f"generation.kv_cache_gib: {kv_cache_gib:g} GiB holds {fit} sequences of max_model_len "
            f"{max_model_len} tokens in {dtype}, fewer than generation.max_num_seqs {max_num_seqs}: when that many "
            f"grow long, vLLM preempts some and recomputes them later; {need:.2f} GiB holds them all")
