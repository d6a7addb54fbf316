"""What a checkpoint takes from the run's model folder to be a complete Hugging Face folder itself.

A checkpoint holds the trained weights (`model.safetensors`, Hugging Face names) and, from the folder the run
started from, the files that describe the model and its tokenizer: `config.json`, the tokenizer's files and, when
the folder has one, `generation_config.json`. With them, `AutoModelForCausalLM.from_pretrained(<checkpoint copy>)`
loads the trained model and `PreTrainedTokenizerFast.from_pretrained(<checkpoint copy>)` its tokenizer.

`checkpoint_folder_files` reads those files once (the trainer's rank 0, at start); they are copied byte for byte.
Weights of the start folder (safetensors, shard indexes) are never copied: the checkpoint has its own.
"""

from __future__ import annotations

from pathlib import Path

# The files a Hugging Face folder describes its model and tokenizer with (those present are copied).
CONFIG_FILES = ("config.json", "generation_config.json")
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "chat_template.jinja",
    "chat_template.json",
    "vocab.json",
    "merges.txt",
    "tokenizer.model",
)
REQUIRED = ("config.json", "tokenizer.json")
MAX_FILE_BYTES = 64 * 1024 * 1024  # a tokenizer file above this is not a tokenizer file


class CheckpointFolderError(FileNotFoundError):
    """The run's model folder lacks a file every checkpoint must carry; the message names the folder and file."""


def checkpoint_folder_files(model_folder: Path) -> dict[str, bytes]:
    """{file name: bytes} of the config, generation config and tokenizer files of `model_folder` (those it has;
    `config.json` and `tokenizer.json` are required)."""
    missing = [name for name in REQUIRED if not (model_folder / name).is_file()]
    if missing:
        raise CheckpointFolderError(f"model folder {model_folder}: {', '.join(missing)} missing; every checkpoint "
                                    f"copies it to be a complete Hugging Face folder")
    out: dict[str, bytes] = {}
    for name in (*CONFIG_FILES, *TOKENIZER_FILES):
        path = model_folder / name
        if not path.is_file():
            continue
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise CheckpointFolderError(f"model folder {model_folder}: {name} is {size} bytes; expected at most "
                                        f"{MAX_FILE_BYTES} for a config or tokenizer file")
        out[name] = path.read_bytes()
    return out
