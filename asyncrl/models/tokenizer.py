"""The built-in character-level tokenizer, built locally with `tokenizers` (never from a hub).

Owns the vocabulary, the saved tokenizer folder and the prompt/response <-> token id conversions.

Invariants:
- ids are fixed: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then the characters of CHARS in order; every
  character of CHARS is exactly one token, any other character is <unk>;
- `encode_prompt(tok, p)` == [bos] + one id per character of p, so its length is 1 + len(p)
  (what `TaskConfig.max_prompt_tokens()` counts);
- `decode_response` stops at the first <eos> and drops other special tokens;
- the saved folder loads with `PreTrainedTokenizerFast(tokenizer_file=...)` (see `load_tokenizer`)
  to the same ids. Do not load it with AutoTokenizer: for a qwen2 model config that can pick
  Qwen2's tokenizer class and change the ids.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path

from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARS = "0123456789+-*= "
VOCAB: dict[str, int] = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *CHARS])}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SPECIAL_KWARGS = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}


def _raw_tokenizer() -> Tokenizer:
    """A `tokenizers.Tokenizer` splitting text into single characters looked up in VOCAB."""
    tok = Tokenizer(models.WordLevel(vocab=dict(VOCAB), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    return tok


def make_tokenizer() -> PreTrainedTokenizerFast:
    """The built-in tokenizer, in memory, with bos/eos/pad/unk set."""
    return PreTrainedTokenizerFast(tokenizer_object=_raw_tokenizer(), **_SPECIAL_KWARGS)


def build_tokenizer(out_dir: str | Path) -> PreTrainedTokenizerFast:
    """Write the tokenizer folder (tokenizer.json, tokenizer_config.json, special_tokens_map.json)."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer()
    tok.save_pretrained(str(out))
    # transformers 5 no longer writes special_tokens_map.json; older readers still look for it.
    (out / "special_tokens_map.json").write_text(json.dumps(_SPECIAL_KWARGS, indent=2) + "\n")
    return tok


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerFast:
    """Load the tokenizer of a model folder via PreTrainedTokenizerFast(tokenizer_file=...).

    The special tokens come from tokenizer_config.json (transformers does not read them from
    tokenizer.json alone); the built-in names are the fallback.
    """
    folder = Path(model_dir)
    path = folder / "tokenizer.json"
    if not path.is_file():
        raise FileNotFoundError(f"{path}: expected a tokenizer.json in model folder {folder}")
    kwargs = dict(_SPECIAL_KWARGS)
    cfg_path = folder / "tokenizer_config.json"
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        for key in kwargs:
            value = cfg.get(key)
            if isinstance(value, str):
                kwargs[key] = value
            elif isinstance(value, dict) and isinstance(value.get("content"), str):
                kwargs[key] = value["content"]
    return PreTrainedTokenizerFast(tokenizer_file=str(path), **kwargs)


def vocab_size(tok: PreTrainedTokenizerFast) -> int:
    """Number of token ids the tokenizer can produce (ids are 0..vocab_size-1)."""
    return len(tok)


def encode_prompt(tok: PreTrainedTokenizerFast, prompt: str) -> list[int]:
    """[bos] + one id per character of the prompt."""
    ids = tok(prompt, add_special_tokens=False)["input_ids"]
    return [int(tok.bos_token_id), *ids]


def encode_response(tok: PreTrainedTokenizerFast, text: str) -> list[int]:
    """The target ids of a response: one id per character, then <eos>."""
    ids = tok(text, add_special_tokens=False)["input_ids"]
    return [*ids, int(tok.eos_token_id)]


def decode_response(tok: PreTrainedTokenizerFast, ids: Sequence[int]) -> str:
    """The text of generated ids up to (not including) the first <eos>; other special ids are dropped.

    Ids outside the tokenizer's vocabulary (a model's padded vocab rows) are dropped too.
    """
    eos = int(tok.eos_token_id)
    special = set(tok.all_special_ids)
    n = len(tok)
    kept: list[int] = []
    for i in ids:
        i = int(i)
        if i == eos:
            break
        if i in special or not 0 <= i < n:
            continue
        kept.append(i)
    return "".join(tok.convert_ids_to_tokens(kept))
