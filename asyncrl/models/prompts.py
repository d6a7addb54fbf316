"""What the model sees of a single-turn task prompt, and which tokens end its answer.

Owns `PromptFormat` (a task prompt -> the prompt token ids), the resolution of `task.prompt_format`, and
`stop_token_ids` (every id that ends a response). Every place that turns a task prompt into ids goes through here:
the environment role, the held-out evaluation, the prompt-length checks and the benchmarks, so the model is asked
in one format everywhere.

Invariants:
- raw: the ids are `[bos] + tokens(prompt)` (`asyncrl.models.tokenizer.encode_prompt`), what the built-in tiny
  model was trained on;
- chat: the ids are the tokenizer's chat template applied to `[system?, user: prompt]` with the generation prompt,
  tokenized without adding special tokens again (the template writes its own); an empty system prompt is left out,
  so the template's default system message (if any) applies;
- `task.prompt_format: auto` is chat when the run's model is a model folder (`model.path`) whose tokenizer has a
  chat template, else raw; chat asked of a tokenizer without a template is a `ValueError` naming the field;
- `stop_token_ids`: the tokenizer's eos id first, then every other id of generation_config.json's `eos_token_id`
  (an int or a list) and, for chat, the template's end-of-turn token, without repeats. A response ends at the
  first of them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from asyncrl.models.tokenizer import encode_prompt

log = logging.getLogger(__name__)

Format = Literal["chat", "raw"]


@dataclass(frozen=True)
class PromptFormat:
    """How a task prompt becomes the prompt ids: `format` "chat" or "raw", and the chat system prompt."""

    tokenizer: Any
    format: Format
    system_prompt: str = ""

    def messages(self, prompt: str) -> list[dict[str, str]]:
        """The chat messages of one prompt (chat format)."""
        system = [{"role": "system", "content": self.system_prompt}] if self.system_prompt else []
        return [*system, {"role": "user", "content": prompt}]

    def text(self, prompt: str) -> str:
        """The prompt as text, exactly what the ids encode (for a person to read)."""
        if self.format == "raw":
            return str(self.tokenizer.decode(self.ids(prompt), skip_special_tokens=False))
        out = self.tokenizer.apply_chat_template(self.messages(prompt), tokenize=False, add_generation_prompt=True)
        return str(out)

    def ids(self, prompt: str) -> list[int]:
        """The prompt token ids the generation servers get."""
        if self.format == "raw":
            return encode_prompt(self.tokenizer, prompt)
        return [int(i) for i in self.tokenizer(self.text(prompt), add_special_tokens=False)["input_ids"]]


def resolve_format(requested: str, tokenizer: Any, has_model_path: bool) -> Format:
    """`task.prompt_format` ("auto", "chat" or "raw") for this tokenizer; ValueError naming the field when chat is
    asked of a tokenizer without a chat template."""
    has_template = bool(getattr(tokenizer, "chat_template", None))
    if requested == "raw":
        return "raw"
    if requested == "chat":
        if not has_template:
            raise ValueError("task.prompt_format: 'chat' needs a tokenizer with a chat template (tokenizer_config.json "
                             "`chat_template` or chat_template.jinja in the model folder); this one has none: set "
                             "task.prompt_format: raw, or use an instruct model's folder")
        return "chat"
    if requested != "auto":
        raise ValueError(f"task.prompt_format: expected 'auto', 'chat' or 'raw', got {requested!r}")
    return "chat" if has_model_path and has_template else "raw"


def prompt_format(cfg: Any, tokenizer: Any) -> PromptFormat:
    """The run's `PromptFormat` (`cfg` a RunConfig) for the run's tokenizer."""
    fmt = resolve_format(cfg.task.prompt_format, tokenizer, bool(cfg.model.path))
    return PromptFormat(tokenizer, fmt, cfg.task.system_prompt if fmt == "chat" else "")


def _generation_eos(model_folder: Path | None) -> list[int]:
    """generation_config.json's `eos_token_id` as a list (empty when absent or unreadable)."""
    if model_folder is None:
        return []
    path = Path(model_folder) / "generation_config.json"
    try:
        value = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        return []
    values = value if isinstance(value, list) else [value]
    return [int(v) for v in values if isinstance(v, int) and not isinstance(v, bool)]


def _turn_end_id(tokenizer: Any) -> int | None:
    """The first token the chat template writes after an assistant message's content, when it is a special token
    (ChatML's `<|im_end|>`); None without a template or when it is plain text."""
    if not getattr(tokenizer, "chat_template", None):
        return None
    try:
        from asyncrl.models.chat import ChatFormat

        end = ChatFormat(tokenizer).turn_end_ids
    except (ValueError, TypeError) as err:
        log.debug("no turn end from the chat template: %s", err)
        return None
    if end and end[0] in set(tokenizer.all_special_ids):
        return int(end[0])
    return None


def stop_token_ids(tokenizer: Any, model_folder: Path | None = None, chat: bool = False) -> list[int]:
    """Every id that ends a response: the tokenizer's eos, generation_config.json's eos ids, and with `chat` the
    template's end of turn (see the module docstring)."""
    ids: list[int] = []
    candidates: Sequence[int | None] = [tokenizer.eos_token_id, *_generation_eos(model_folder),
                                        _turn_end_id(tokenizer) if chat else None]
    for i in candidates:
        if i is not None and int(i) not in ids:
            ids.append(int(i))
    return ids
