"""Build a tiny llama GGUF for tests with the `gguf` package's GGUFWriter (no download, no llama.cpp).

Shape: hidden 128, 2 heads of 64 (vLLM's CPU attention needs head size 64), 2 KV heads, `layers` layers,
intermediate 256, tied embeddings, float32 tensors; deterministic for a given seed. The weights are wide
(std 0.5 for matrices) so a greedy decode is decided by clear margins, not by rounding.

The tokenizer is a small byte-level BPE in the GGUF metadata (`tokenizer.ggml.model` "gpt2"): ids 0-2 are the control
tokens `<|endoftext|>`, `<|im_start|>`, `<|im_end|>`, then the 256 byte-level characters in byte order (so byte b is
id 3 + b), then the merged tokens of MERGES in order; bos `<|im_start|>`, eos and pad `<|im_end|>`, unk
`<|endoftext|>`, and a ChatML chat template (SmolLM2's shape, without its default system prompt).

`TinyGguf.hf_tensors` are the weights as a Hugging Face llama holds them: the q/k projections are written to the
GGUF permuted the way llama.cpp's converter permutes them (rotary halves interleaved), and transformers undoes that.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from gguf import GGUFWriter

HIDDEN, HEADS, KV_HEADS, HEAD_DIM, INTERMEDIATE, CONTEXT = 128, 2, 2, 64, 256, 512
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
# merges in priority order: each one's joined pair is a token, in this order after the 256 byte characters
MERGES = ("h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "Ġwor l", "Ġworl d")
CHATML = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + "
    "'\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def byte_chars() -> list[str]:
    """The byte-level alphabet (GPT-2's bytes_to_unicode) in byte order: the character byte b is spelled with."""
    printable = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(
        range(ord("®"), ord("ÿ") + 1))
    spelled, extra = {b: chr(b) for b in printable}, 0
    for b in range(256):
        if b not in spelled:
            spelled[b] = chr(256 + extra)
            extra += 1
    return [spelled[b] for b in range(256)]


def tokens() -> list[str]:
    return [*SPECIALS, *byte_chars(), *(m.replace(" ", "") for m in MERGES)]


def llama_permute(w: np.ndarray, n_head: int) -> np.ndarray:
    """llama.cpp's HF -> GGUF permutation of a q/k projection (the inverse of what transformers applies)."""
    return w.reshape(n_head, 2, w.shape[0] // n_head // 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)


@dataclass
class TinyGguf:
    path: Path
    vocab: list[str]
    hf_tensors: dict[str, np.ndarray] = field(default_factory=dict)


def _metadata(w: GGUFWriter, layers: int, vocab: list[str], chat_template: str | None, tokenizer_model: str | None,
              ) -> None:
    w.add_name("tiny test llama")
    w.add_block_count(layers)
    w.add_context_length(CONTEXT)
    w.add_embedding_length(HIDDEN)
    w.add_feed_forward_length(INTERMEDIATE)
    w.add_head_count(HEADS)
    w.add_head_count_kv(KV_HEADS)
    w.add_rope_dimension_count(HEAD_DIM)
    w.add_rope_freq_base(10000.0)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_vocab_size(len(vocab))
    w.add_file_type(0)  # all F32
    if tokenizer_model is None:
        return
    w.add_tokenizer_model(tokenizer_model)
    w.add_tokenizer_pre("default")
    w.add_token_list(vocab)
    w.add_token_types([3 if t in SPECIALS else 1 for t in vocab])
    w.add_token_merges(list(MERGES))
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_unk_token_id(0)
    w.add_pad_token_id(2)
    w.add_bool("tokenizer.ggml.add_bos_token", False)
    if chat_template is not None:
        w.add_chat_template(chat_template)


def write_tiny_gguf(path: Path, layers: int = 2, seed: int = 0, chat_template: str | None = CHATML,
                    architecture: str = "llama", tokenizer_model: str | None = "gpt2",
                    edit: Callable[[GGUFWriter], None] | None = None) -> TinyGguf:
    """Write the tiny model to `path` (`tokenizer_model` None: no tokenizer metadata at all); `edit` may add
    metadata before the file is written."""
    rng = np.random.default_rng(seed)
    vocab = tokens()
    out = TinyGguf(Path(path), vocab)
    w = GGUFWriter(str(path), architecture)
    _metadata(w, layers, vocab, chat_template, tokenizer_model)
    if edit is not None:
        edit(w)

    def add(gguf_name: str, hf_name: str, shape: tuple[int, ...], std: float, permute_heads: int = 0) -> None:
        hf = (rng.standard_normal(shape) * std).astype(np.float32) if std else np.ones(shape, np.float32)
        out.hf_tensors[hf_name] = hf
        w.add_tensor(gguf_name, llama_permute(hf, permute_heads) if permute_heads else hf)

    add("token_embd.weight", "model.embed_tokens.weight", (len(vocab), HIDDEN), 0.5)
    for i in range(layers):
        b, h = f"blk.{i}.", f"model.layers.{i}."
        add(b + "attn_norm.weight", h + "input_layernorm.weight", (HIDDEN,), 0.0)
        add(b + "attn_q.weight", h + "self_attn.q_proj.weight", (HEADS * HEAD_DIM, HIDDEN), 0.5, HEADS)
        add(b + "attn_k.weight", h + "self_attn.k_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), 0.5, KV_HEADS)
        add(b + "attn_v.weight", h + "self_attn.v_proj.weight", (KV_HEADS * HEAD_DIM, HIDDEN), 0.1)
        add(b + "attn_output.weight", h + "self_attn.o_proj.weight", (HIDDEN, HEADS * HEAD_DIM), 0.1)
        add(b + "ffn_norm.weight", h + "post_attention_layernorm.weight", (HIDDEN,), 0.0)
        add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", (INTERMEDIATE, HIDDEN), 0.1)
        add(b + "ffn_up.weight", h + "mlp.up_proj.weight", (INTERMEDIATE, HIDDEN), 0.1)
        add(b + "ffn_down.weight", h + "mlp.down_proj.weight", (HIDDEN, INTERMEDIATE), 0.1)
    add("output_norm.weight", "model.norm.weight", (HIDDEN,), 0.0)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return out
