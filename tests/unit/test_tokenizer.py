"""The built-in character tokenizer: fixed ids, round trips, and the saved folder."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from transformers import PreTrainedTokenizerFast

from asyncrl.config.schema import TaskConfig
from asyncrl.models.tokenizer import (
    TOKENIZER_FILES,
    build_tokenizer,
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
