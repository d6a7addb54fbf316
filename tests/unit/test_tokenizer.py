"""The built-in character tokenizer: fixed ids, round trips, and the saved folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from asyncrl.config.schema import TaskConfig
from asyncrl.models.tokenizer import (
    CHAT_TEMPLATE,
    ROLE_TOKENS,
    TEXT_EXTRA_CHARS,
    TOKENIZER_FILES,
    build_tokenizer,
    chat_ids,
    decode_response,
    encode_prompt,
    encode_response,
    load_tokenizer,
    make_tokenizer,
)


def test_fixed_ids() -> None:
    tok = make_tokenizer()
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    # <bos> '1' '2' '+' '3' '4' '='  ('0'..'9' are 4..13, then '+', '-', '*', '=', ' ')
    assert encode_prompt(tok, "12+34=") == [1, 5, 6, 14, 7, 8, 17]
    assert encode_response(tok, "-7") == [15, 11, 2]
    assert len(tok) == 19


@pytest.mark.parametrize("text", ["0", "99+99=", "3-10=", "12*11=", "-198", "1 2 3", "0123456789+-*= "])
def test_round_trip(text: str) -> None:
    tok = make_tokenizer()
    ids = encode_prompt(tok, text)
    assert len(ids) == 1 + len(text)
    assert decode_response(tok, ids[1:] + [tok.eos_token_id]) == text
    assert decode_response(tok, encode_response(tok, text)) == text


def test_decode_stops_at_eos_and_drops_specials_and_out_of_vocab() -> None:
    tok = make_tokenizer()
    assert decode_response(tok, [5, 0, 1, 6, 23, 2, 7, 8]) == "12"
    assert decode_response(tok, [2, 5]) == ""
    assert decode_response(tok, []) == ""


def test_decode_sees_a_token_added_after_its_first_call() -> None:
    """`decode_response` reads the tokenizer's facts once per tokenizer and size: a token added later is decoded,
    not dropped as out of the vocabulary."""
    tok = make_tokenizer()
    n = len(tok)
    assert decode_response(tok, [5, n]) == "1"  # id n does not exist yet
    tok.add_tokens(["Z"])
    assert tok.convert_tokens_to_ids("Z") == n
    assert decode_response(tok, [5, n]) == "1Z"
    tok.add_special_tokens({"additional_special_tokens": ["<x>"]})
    assert decode_response(tok, [5, n + 1, n]) == "1Z"  # a new special id is dropped


def test_unknown_characters_are_one_unk_each() -> None:
    tok = make_tokenizer()
    assert encode_prompt(tok, "a\n\nb") == [1, 3, 3, 3, 3]


def test_prompt_length_matches_task_bound() -> None:
    task = TaskConfig(max_operand=99)
    assert len(encode_prompt(make_tokenizer(), "99+99=")) == task.max_prompt_tokens() == 7


def test_saved_folder_loads_with_same_ids(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    for name in TOKENIZER_FILES:
        assert (tmp_path / name).is_file(), name
    assert json.loads((tmp_path / "special_tokens_map.json").read_text())["eos_token"] == "<eos>"
    built = make_tokenizer()
    loaded = load_tokenizer(tmp_path)
    plain = PreTrainedTokenizerFast(tokenizer_file=str(tmp_path / "tokenizer.json"))
    text = "87-93="
    assert encode_prompt(loaded, text) == encode_prompt(built, text)
    assert plain(text, add_special_tokens=False)["input_ids"] == encode_prompt(built, text)[1:]
    assert (loaded.bos_token_id, loaded.eos_token_id, loaded.pad_token_id) == (1, 2, 0)
    assert decode_response(loaded, encode_response(loaded, "-6")) == "-6"


def test_load_missing_folder_names_file(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="tokenizer.json"):
        load_tokenizer(tmp_path)


# ---- the text character set and its chat template (agentic tasks) ----

TWO_TURNS = [
    {"role": "user", "content": "P.\n.G"},
    {"role": "assistant", "content": "right"},
    {"role": "user", "content": ".P\n.G"},
    {"role": "assistant", "content": "down"},
]


def test_arithmetic_folder_has_no_chat_template(tmp_path: Path) -> None:
    build_tokenizer(tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(TOKENIZER_FILES)
    assert "chat_template" not in json.loads((tmp_path / "tokenizer_config.json").read_text())
    with pytest.raises(ValueError, match="chat_template"):
        chat_ids(load_tokenizer(tmp_path), TWO_TURNS[:1], add_generation_prompt=True)
    assert make_tokenizer("arithmetic").get_vocab() == make_tokenizer().get_vocab()


def test_text_charset_ids() -> None:
    tok = make_tokenizer("text")
    assert len(tok) == 103 and len(TEXT_EXTRA_CHARS) == 81
    assert (tok.pad_token_id, tok.bos_token_id, tok.eos_token_id, tok.unk_token_id) == (0, 1, 2, 3)
    # the arithmetic ids are unchanged ...
    arithmetic = make_tokenizer()
    assert encode_prompt(tok, "12+34= ") == encode_prompt(arithmetic, "12+34= ") == [1, 5, 6, 14, 7, 8, 17, 18]
    # ... then a..z (19..44), A..Z (45..70), punctuation, "\n" = 99, then the role tokens
    assert encode_prompt(tok, "az AZ.\n")[1:] == [19, 44, 18, 45, 70, 81, 99]
    assert tok.convert_tokens_to_ids(list(ROLE_TOKENS)) == [100, 101, 102]
    assert {100, 101, 102} <= set(tok.all_special_ids)
    assert tok("x<|user|>y", add_special_tokens=False)["input_ids"] == [42, 101, 43]
    assert encode_prompt(tok, "\t")[1:] == [3]  # not in the charset: <unk>


@pytest.mark.parametrize("text", ["P..H\n.H..\n...G", "Hello, World! (x=3; y<4?) [a_b] {c|d} ~`^@#$%&'\"\\/"])
def test_text_round_trip(text: str) -> None:
    tok = make_tokenizer("text")
    ids = encode_prompt(tok, text)
    assert len(ids) == 1 + len(text) and 3 not in ids
    assert decode_response(tok, encode_response(tok, text)) == text
    assert decode_response(tok, [*ids[1:4], 101, 2, 19]) == text[:3]  # role tokens dropped, stops at <eos>


def test_chat_template_exact_ids_after_save_and_load(tmp_path: Path) -> None:
    build_tokenizer(tmp_path, charset="text")
    assert json.loads((tmp_path / "tokenizer_config.json").read_text())["chat_template"] == CHAT_TEMPLATE
    tok = load_tokenizer(tmp_path)
    assert len(tok) == 103 and {100, 101, 102} <= set(tok.all_special_ids)
    # <bos> <|user|> P . \n . G <|assistant|> r i g h t <eos> <|user|> . P \n . G <|assistant|> d o w n <eos>
    full = [1, 101, 60, 81, 99, 81, 51, 102, 36, 27, 25, 26, 38, 2,
            101, 81, 60, 99, 81, 51, 102, 22, 33, 41, 32, 2]
    assert chat_ids(tok, TWO_TURNS, add_generation_prompt=False) == full
    assert chat_ids(tok, TWO_TURNS[:3], add_generation_prompt=True) == full[:21]
    assert chat_ids(tok, TWO_TURNS[:1], add_generation_prompt=True) == full[:8]
    system = [{"role": "system", "content": "Go"}, *TWO_TURNS[:1]]
    assert chat_ids(tok, system, add_generation_prompt=False) == [1, 100, 51, 33, *full[1:7]]
    assert chat_ids(make_tokenizer("text"), TWO_TURNS, add_generation_prompt=False) == full
    text = tok.apply_chat_template(TWO_TURNS[:1], tokenize=False, add_generation_prompt=True)
    assert text == "<bos><|user|>P.\n.G<|assistant|>"


def test_unknown_charset_is_named() -> None:
    with pytest.raises(ValueError, match="charset"):
        make_tokenizer("unicode")


def test_decode_uses_the_tokenizers_own_decoding_for_a_byte_level_bpe() -> None:
    """A user's model with a byte-level BPE (GPT-2/Qwen style): `Ġ` marks a space in the token strings; the decoded
    response must be the text, or exact-match scoring would never match."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    raw.decoder = decoders.ByteLevel()
    raw.train_from_iterator(["The answer is Paris.", "Paris is in France."] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=["<eos>"],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok = PreTrainedTokenizerFast(tokenizer_object=raw, eos_token="<eos>")
    ids = [*tok.encode(" Paris is in France", add_special_tokens=False), tok.eos_token_id, *tok.encode(" junk")]
    assert any(t.startswith("Ġ") for t in tok.convert_ids_to_tokens(ids))
    assert decode_response(tok, ids) == " Paris is in France"
