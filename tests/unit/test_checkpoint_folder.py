"""The files a checkpoint copies from the run's model folder to be a complete Hugging Face folder."""

from __future__ import annotations

import json

import pytest

from asyncrl.models.checkpoint_folder import CheckpointFolderError, checkpoint_folder_files
from asyncrl.models.tokenizer import build_tokenizer


def test_config_generation_config_and_tokenizer_files_are_copied_byte_for_byte_weights_never(tmp_path):
    build_tokenizer(tmp_path, charset="text")
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "qwen2", "vocab_size": 40}))
    (tmp_path / "generation_config.json").write_text('{"eos_token_id": 2}')
    (tmp_path / "model.safetensors").write_bytes(b"weights")
    (tmp_path / "model.safetensors.index.json").write_text("{}")
    (tmp_path / "build_info.json").write_text("{}")
    files = checkpoint_folder_files(tmp_path)
    assert sorted(files) == ["chat_template.jinja", "config.json", "generation_config.json",
                             "special_tokens_map.json", "tokenizer.json", "tokenizer_config.json"]
    for name, data in files.items():
        assert data == (tmp_path / name).read_bytes(), name


def test_no_generation_config_is_fine(tmp_path):
    build_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    assert "generation_config.json" not in checkpoint_folder_files(tmp_path)


@pytest.mark.parametrize("missing", ["config.json", "tokenizer.json"])
def test_a_folder_without_config_or_tokenizer_is_refused_naming_the_file(tmp_path, missing):
    build_tokenizer(tmp_path)
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / missing).unlink()
    with pytest.raises(CheckpointFolderError, match=f"model folder {tmp_path}: {missing} missing"):
        checkpoint_folder_files(tmp_path)
