"""What `asyncrl validate` shows of a single-turn task: the first train prompt exactly as the model will see it.

Owns the preview text: the prompt format (chat or raw), the rendered prompt (the decoded ids, special tokens
included), its length in tokens, the ids that end an answer, and the expected answer. The tokenizer is the run's
(the model folder's, or the built-in one when `model.path` is empty); a model on S3 is not fetched for a preview.
A chat format that the tokenizer cannot render is a `ValueError` naming `task.prompt_format`.
"""

from __future__ import annotations

from pathlib import Path

from asyncrl.config.schema import RunConfig
from asyncrl.models.prompts import prompt_format, stop_token_ids
from asyncrl.tasks.datasets import load_split


def prompt_preview(cfg: RunConfig) -> str | None:
    """The preview of the first train prompt, or None when there is nothing to show here (an agentic task, or a
    model whose tokenizer is not on this machine)."""
    from asyncrl.tasks.dataset_check import _tokenizer

    if cfg.env is not None:
        return None
    tokenizer = _tokenizer(cfg)
    if tokenizer is None:
        return None
    problem = load_split(cfg.task, "train")[0]
    fmt = prompt_format(cfg, tokenizer)
    ids = fmt.ids(problem.prompt)
    folder = Path(cfg.model.path) if cfg.model.path else None
    stops = stop_token_ids(tokenizer, folder, chat=fmt.format == "chat")
    names = ", ".join(f"{i} {tokenizer.convert_ids_to_tokens(i)!r}" for i in stops)
    limit = cfg.generation.max_model_len - cfg.rollout.max_new_tokens
    return (f"train prompt 0 as the model sees it ({fmt.format} format, {len(ids)} tokens of at most {limit}; "
            f"an answer ends at: {names}):\n{fmt.text(problem.prompt)}\n(expected answer: {problem.answer!r})")
