"""The built-in character-level tokenizers, built locally with `tokenizers` (never from a hub).

Owns the vocabularies (the "arithmetic" and the "text" character sets), the chat template of the text
tokenizer, the saved tokenizer folder and the prompt/response <-> token id conversions.

Invariants:
- arithmetic ids are fixed: <pad>=0, <bos>=1, <eos>=2, <unk>=3, then the characters of CHARS in order; every
  character of CHARS is exactly one token, any other character is <unk>; its saved files never change
  (cached models depend on them): no chat template, no role tokens;
- text ids extend the arithmetic ones: the same 19 ids, then TEXT_EXTRA_CHARS (letters, punctuation, "\n")
  in order at 19..99, then the special role tokens <|system|>, <|user|>, <|assistant|> at 100..102;
  a role token's text inside content is that role token (do not put it in observations);
- the text tokenizer's chat template renders <bos> once, then per message <|role|> + content, with <eos>
  after an assistant message's content; the generation prompt is <|assistant|>. So rendering
  messages[:k] with add_generation_prompt is a prefix of rendering messages[:k+1] when message k is
  the assistant's, and the model ends each turn with <eos>, the generation stop token;
- `encode_prompt(tok, p)` == [bos] + one id per character of p, so its length is 1 + len(p)
  (what `TaskConfig.max_prompt_tokens()` counts);
- `decode_response` stops at the first <eos> and drops other special tokens;
- the saved folder loads with `PreTrainedTokenizerFast(tokenizer_file=...)` (see `load_tokenizer`)
  to the same ids. Do not load it with AutoTokenizer: for a qwen2 model config that can pick
  Qwen2's tokenizer class and change the ids.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

if TYPE_CHECKING:
    from asyncrl.config.schema import RunConfig

PAD, BOS, EOS, UNK = "<pad>", "<bos>", "<eos>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
CHARS = "0123456789+-*= "
VOCAB: dict[str, int] = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *CHARS])}
TEXT_EXTRA_CHARS = (
    "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ" + "!\"#$%&'(),./:;<>?@[\\]^_`{|}~" + "\n"
)
ROLE_TOKENS = ("<|system|>", "<|user|>", "<|assistant|>")
TEXT_VOCAB: dict[str, int] = {t: i for i, t in enumerate([*SPECIAL_TOKENS, *CHARS, *TEXT_EXTRA_CHARS, *ROLE_TOKENS])}
CHARSETS = ("arithmetic", "text")
CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|' + message['role'] + '|>' }}{{ message['content'] }}"
    "{% if message['role'] == 'assistant' %}{{ eos_token }}{% endif %}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)
CHAT_ROLES = ("system", "user", "assistant")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json")
_SPECIAL_KWARGS = {"bos_token": BOS, "eos_token": EOS, "pad_token": PAD, "unk_token": UNK}


def _check_charset(charset: str) -> None:
    if charset not in CHARSETS:
        raise ValueError(f"charset: expected one of {CHARSETS}, got {charset!r}")


def _raw_tokenizer(charset: str = "arithmetic") -> Tokenizer:
    """A `tokenizers.Tokenizer` splitting text into single characters looked up in the charset's vocab."""
    _check_charset(charset)
    vocab = VOCAB if charset == "arithmetic" else TEXT_VOCAB
    tok = Tokenizer(models.WordLevel(vocab=dict(vocab), unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex(r"[\s\S]"), behavior="isolated")
    tok.decoder = decoders.Fuse()
    if charset == "text":
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in ROLE_TOKENS])
    return tok


def make_tokenizer(charset: str = "arithmetic") -> PreTrainedTokenizerFast:
    """The built-in tokenizer of `charset`, in memory, with bos/eos/pad/unk set (text: role tokens, chat template)."""
    if charset == "text":
        return PreTrainedTokenizerFast(
            tokenizer_object=_raw_tokenizer(charset),
            chat_template=CHAT_TEMPLATE,
            extra_special_tokens=list(ROLE_TOKENS),
            **_SPECIAL_KWARGS,
        )
    return PreTrainedTokenizerFast(tokenizer_object=_raw_tokenizer(charset), **_SPECIAL_KWARGS)


def build_tokenizer(out_dir: str | Path, charset: str = "arithmetic") -> PreTrainedTokenizerFast:
    """Write the tokenizer folder (tokenizer.json, tokenizer_config.json, special_tokens_map.json).

    The text charset also gets its chat template: in tokenizer_config.json ("chat_template", what older
    readers and vLLM look at) and in chat_template.jinja (what transformers 5 writes and reads).
    """
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    tok = make_tokenizer(charset)
    tok.save_pretrained(str(out))
    # transformers 5 no longer writes special_tokens_map.json; older readers still look for it.
    specials: dict[str, object] = dict(_SPECIAL_KWARGS)
    if charset == "text":
        specials["additional_special_tokens"] = list(ROLE_TOKENS)
        cfg_path = out / "tokenizer_config.json"
        cfg = json.loads(cfg_path.read_text())
        cfg["chat_template"] = CHAT_TEMPLATE
        cfg_path.write_text(json.dumps(cfg, indent=2) + "\n")
    (out / "special_tokens_map.json").write_text(json.dumps(specials, indent=2) + "\n")
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
    kwargs: dict[str, Any] = dict(_SPECIAL_KWARGS)
    cfg_path = folder / "tokenizer_config.json"
    cfg: dict[str, Any] = {}
    if cfg_path.is_file():
        cfg = json.loads(cfg_path.read_text())
        if not isinstance(cfg, dict):
            raise ValueError(f"{cfg_path}: expected a JSON object")
        for key in list(kwargs):
            value = cfg.get(key)
            if isinstance(value, str):
                kwargs[key] = value
            elif isinstance(value, dict) and isinstance(value.get("content"), str):
                kwargs[key] = value["content"]
    extra = cfg.get("extra_special_tokens") or cfg.get("additional_special_tokens")
    if isinstance(extra, list) and all(isinstance(t, str) for t in extra):
        kwargs["extra_special_tokens"] = list(extra)
    template = cfg.get("chat_template")
    jinja = folder / "chat_template.jinja"
    if not isinstance(template, str) and jinja.is_file():
        template = jinja.read_text()
    if isinstance(template, str):
        kwargs["chat_template"] = template
    return PreTrainedTokenizerFast(tokenizer_file=str(path), **kwargs)


def chat_ids(
    tok: PreTrainedTokenizerFast, messages: Sequence[Mapping[str, str]], add_generation_prompt: bool
) -> list[int]:
    """The token ids of `messages` rendered by the tokenizer's chat template, as a plain list of ints.

    transformers 5 returns a BatchEncoding from apply_chat_template(tokenize=True); older versions a list.
    """
    if not getattr(tok, "chat_template", None):
        raise ValueError("tokenizer: expected a chat_template (the arithmetic tokenizer has none; use charset='text')")
    out = tok.apply_chat_template(
        [dict(m) for m in messages], tokenize=True, add_generation_prompt=add_generation_prompt
    )
    if isinstance(out, Mapping) or hasattr(out, "input_ids"):
        out = out["input_ids"]
    ids = list(out)
    if ids and isinstance(ids[0], list):  # a batch of one conversation
        if len(ids) != 1:
            raise ValueError(f"apply_chat_template: expected one conversation, got {len(ids)}")
        ids = ids[0]
    return [int(i) for i in ids]


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

    Ids outside the tokenizer's vocabulary (a model's padded vocab rows) are dropped too. The text is the tokenizer's
    own decoding (a byte-level BPE's `Ġ` becomes a space); for the built-in character tokenizers that is the tokens
    joined.
    """
    facts = _decode_facts(tok, len(tok))
    kept: list[int] = []
    for i in ids:
        i = int(i)
        if i == facts.eos:
            break
        if i in facts.special or not 0 <= i < facts.n:
            continue
        kept.append(i)
    if facts.tokens is not None:  # the built-in tokenizers: the token strings joined, the same text as decode
        return "".join([facts.tokens[i] for i in kept])
    return tok.decode(kept, clean_up_tokenization_spaces=False)


class _DecodeFacts(NamedTuple):
    eos: int
    special: frozenset[int]
    n: int
    tokens: tuple[str, ...] | None  # id -> token string, when decoding is joining them (`_joins_tokens`)


@functools.lru_cache(maxsize=16)
def _decode_facts(tok: PreTrainedTokenizerFast, n: int) -> _DecodeFacts:
    """What `decode_response` needs of `tok`, read once per tokenizer and size (`n` = len(tok): a token added later
    makes a new entry). Reading them on every call (`all_special_ids` builds a list, each attribute goes through
    the tokenizer's `__getattr__`) was ~12% of an environment role's CPU on the default job."""
    tokens = tuple(tok.convert_ids_to_tokens(list(range(n)))) if _joins_tokens(tok) else None
    return _DecodeFacts(int(tok.eos_token_id), frozenset(tok.all_special_ids), n, tokens)


def _joins_tokens(tok: PreTrainedTokenizerFast) -> bool:
    """Whether decoding `tok`'s ids is joining their token strings (a `Fuse` decoder, or none)."""
    decoder = tok.backend_tokenizer.decoder
    return decoder is None or isinstance(decoder, decoders.Fuse)


def charset(cfg: RunConfig) -> str:
    """The built-in tokenizer's character set: arithmetic for the arithmetic task, text for jsonl and agentic."""
    return "arithmetic" if cfg.env is None and cfg.task.name == "arithmetic" else "text"
