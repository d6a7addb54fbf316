"""A task prompt reaches the model raw ([bos] + tokens) or rendered by the tokenizer's chat template, and a response
ends at any of the model's end ids."""

import json
from pathlib import Path

import pytest

from asyncrl.config import RunConfig
from asyncrl.models.prompts import PromptFormat, prompt_format, resolve_format, stop_token_ids
from asyncrl.models.tokenizer import TEXT_VOCAB, VOCAB, make_tokenizer


def test_raw_is_bos_and_one_id_per_character():
    tok = make_tokenizer()
    assert PromptFormat(tok, "raw").ids("12+7=") == [1, *(VOCAB[c] for c in "12+7=")]
    assert PromptFormat(tok, "raw").text("1+2=") == "<bos>1+2="


def test_chat_renders_the_template_with_the_generation_prompt():
    tok = make_tokenizer("text")
    ids = PromptFormat(tok, "chat").ids("hi")
    assert ids == [1, TEXT_VOCAB["<|user|>"], TEXT_VOCAB["h"], TEXT_VOCAB["i"], TEXT_VOCAB["<|assistant|>"]]
    with_system = PromptFormat(tok, "chat", "Be").ids("hi")
    assert with_system == [1, TEXT_VOCAB["<|system|>"], TEXT_VOCAB["B"], TEXT_VOCAB["e"], *ids[1:]]
    assert PromptFormat(tok, "chat", "Be").text("hi") == "<bos><|system|>Be<|user|>hi<|assistant|>"


def test_auto_is_chat_only_for_a_model_folder_with_a_template():
    text, arithmetic = make_tokenizer("text"), make_tokenizer()
    assert resolve_format("auto", text, has_model_path=True) == "chat"
    assert resolve_format("auto", text, has_model_path=False) == "raw"  # the built-in tiny model: raw
    assert resolve_format("auto", arithmetic, has_model_path=True) == "raw"
    assert resolve_format("raw", text, has_model_path=True) == "raw"
    with pytest.raises(ValueError, match=r"task.prompt_format: 'chat' needs a tokenizer with a chat template"):
        resolve_format("chat", arithmetic, has_model_path=True)


def test_the_run_config_chooses_the_format_and_system_prompt():
    cfg = RunConfig.model_validate({"model": {"path": "m"}, "task": {"system_prompt": "Be"}})
    fmt = prompt_format(cfg, make_tokenizer("text"))
    assert (fmt.format, fmt.system_prompt) == ("chat", "Be")
    raw = prompt_format(RunConfig.model_validate({"task": {"system_prompt": "Be"}}), make_tokenizer("text"))
    assert (raw.format, raw.system_prompt) == ("raw", "")  # a system prompt only exists in the chat format


def test_stop_ids_are_every_end_id_once(tmp_path: Path):
    tok = make_tokenizer("text")
    assert stop_token_ids(tok) == [2]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": [7, 2, 9]}))
    assert stop_token_ids(tok, tmp_path) == [2, 7, 9]
    (tmp_path / "generation_config.json").write_text(json.dumps({"eos_token_id": 5}))
    assert stop_token_ids(tok, tmp_path, chat=True) == [2, 5]  # the text template ends a turn with <eos> (2) itself
    (tmp_path / "generation_config.json").write_text("not json")
    assert stop_token_ids(tok, tmp_path) == [2]
