"""Pure arithmetic of a decoder-only transformer's inference work: the FLOPs a generation engine does for a batch.

Owns how the engine-alone benchmark counts work, so that its GFLOP/s figures are comparable with the matrix-multiply
peak (`real_parts.matmul_peak`) and with the issue's "2 x params per token":
- **linear FLOPs** (the matrix products against weights, what a GEMM peak bounds): 2 x the linear layers' weights for
  every position the body runs on, plus 2 x vocab x hidden (the LM head) for every position whose logits are taken.
  A sequence of P prompt tokens that generated G tokens runs the body on P + G - 1 positions (the last token is
  never fed back) and takes logits G times (a prefill takes them at its last position only).
- **tied embeddings** count once, as the LM head's product; the embedding lookup itself is a gather, 0 FLOPs.
  So for SmolLM2-135M "params" = 106.2 M linear + 28.3 M head = 134.5 M (norms, ~0.03 %, are not counted).
- **attention** (the scores and the weighted sum, against the KV cache, not against weights): 4 x heads x head_dim
  FLOPs per layer per (query, key) pair, causal, so position t (0-based) costs 4 * heads * head_dim * (t + 1) per
  layer. Reported separately: it does not run at a GEMM's efficiency and is not "2 x params".
- prompt positions served from the prefix cache are not computed by the engine; `cached_prompt_tokens` takes them
  out of the body's positions and the attention (they would otherwise be counted as work done).

Invariant: every count is exact integer arithmetic on the model's shape (`ModelShape.from_config`), tested with
exact numbers in tests/unit/test_engine_flops.py.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class ModelShape:
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied: bool

    @staticmethod
    def from_config(cfg: Mapping[str, Any]) -> ModelShape:
        """From a Hugging Face Llama-style `config.json` (a missing `head_dim` is hidden / heads)."""
        try:
            heads = int(cfg["num_attention_heads"])
            hidden = int(cfg["hidden_size"])
            return ModelShape(
                layers=int(cfg["num_hidden_layers"]), hidden=hidden, heads=heads,
                kv_heads=int(cfg.get("num_key_value_heads", heads)),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate=int(cfg["intermediate_size"]), vocab=int(cfg["vocab_size"]),
                tied=bool(cfg.get("tie_word_embeddings", False)),
            )
        except KeyError as e:
            raise ValueError(f"config.json: expected a Llama-style config with {e.args[0]!r}") from None

    @property
    def linear_params(self) -> int:
        """Weights of the body's linear layers: q, k, v, o and the gated MLP (gate, up, down), all layers."""
        attn = self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim + self.heads * self.head_dim * self.hidden
        mlp = 3 * self.hidden * self.intermediate
        return self.layers * (attn + mlp)

    @property
    def head_params(self) -> int:
        """The LM head's weight (the embedding itself when tied: counted here once)."""
        return self.vocab * self.hidden

    @property
    def params(self) -> int:
        """The parameters a token's forward multiplies by: linear layers and LM head."""
        return self.linear_params + self.head_params


@dataclass(frozen=True)
class Work:
    """FLOPs of a set of sequences (sums over them)."""

    linear_flops: int
    attention_flops: int
    body_positions: int
    logit_positions: int

    @property
    def total_flops(self) -> int:
        return self.linear_flops + self.attention_flops


def attention_flops(shape: ModelShape, start: int, end: int) -> int:
    """Attention FLOPs of positions start..end-1 (0-based; position t attends to t + 1 keys), all layers."""
    if not 0 <= start <= end:
        raise ValueError(f"positions: expected 0 <= start <= end, got {start}, {end}")
    pairs = (end * (end + 1) - start * (start + 1)) // 2  # sum of (t + 1) for t in [start, end)
    return 4 * shape.heads * shape.head_dim * shape.layers * pairs


def sequence_work(shape: ModelShape, prompt_tokens: int, generated_tokens: int, cached_prompt_tokens: int = 0) -> Work:
    """The engine's work for one sequence (see the module docstring)."""
    if prompt_tokens < 1 or generated_tokens < 0 or not 0 <= cached_prompt_tokens < prompt_tokens:
        raise ValueError(f"expected prompt >= 1, generated >= 0, 0 <= cached < prompt; got {prompt_tokens}, "
                         f"{generated_tokens}, {cached_prompt_tokens}")
    if generated_tokens == 0:
        return Work(0, 0, 0, 0)
    end = prompt_tokens + generated_tokens - 1
    body = end - cached_prompt_tokens
    return Work(linear_flops=2 * shape.linear_params * body + 2 * shape.head_params * generated_tokens,
                attention_flops=attention_flops(shape, cached_prompt_tokens, end),
                body_positions=body, logit_positions=generated_tokens)


def batch_work(shape: ModelShape, sequences: Iterable[tuple[int, int, int]]) -> Work:
    """Sum of `sequence_work` over (prompt, generated, cached prompt) tokens of each sequence."""
    lin = att = body = logits = 0
    for p, g, c in sequences:
        w = sequence_work(shape, p, g, c)
        lin, att, body, logits = lin + w.linear_flops, att + w.attention_flops, body + w.body_positions, \
            logits + w.logit_positions
    return Work(lin, att, body, logits)
