"""The pre-flight check of a jsonl, file or reasoning_gym task's rows, run by `asyncrl validate`, `build-model` and
`run` before any process starts (the config schema cannot: a role re-validates the config on a machine without the
files).

Owns what "the dataset can be used for this run" means:
- jsonl and file: both files exist, hold the mapped fields (file) and at least one valid row each; reasoning_gym:
  both splits can be generated (`asyncrl.tasks.materialised.prepare`, which also registers them for this process);
  else a `DatasetError` naming the task field and the file or dataset;
- with a tokenizer (the built-in one when model.path is empty, else the model folder's): at least one train prompt
  fits in generation.max_model_len - rollout.max_new_tokens tokens (the others are skipped by the environment
  role and counted), and, when the run evaluates on the held-out split (eval.every_steps > 0), every eval prompt does (a
  server refuses a prompt that does not, so the eval would fail after the warm start);
- warnings, not errors: a prompt in both files; characters the built-in tokenizer does not have (they become
  <unk>, and an answer holding one can never be produced).
Without a tokenizer (model.path on S3, or a model folder that is not there) the token checks are left to the
environment role (`asyncrl.tasks.prompt_fit`).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.config.schema import RunConfig
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError

log = logging.getLogger(__name__)


@dataclass
class DatasetReport:
    """What the check found: split sizes, train prompts too long (skipped at run time), notes worth a warning."""

    num_train: int
    num_eval: int
    train_too_long: int = 0
    warnings: list[str] = field(default_factory=list)


def unknown_chars(problems: Sequence[Problem], vocab: set[str]) -> tuple[int, int, list[str]]:
    """Pure: (prompts, answers) holding a character outside `vocab`, and the first few such characters."""
    seen: list[str] = []
    n_prompts = n_answers = 0
    for p in problems:
        for text, is_answer in ((p.prompt, False), (p.answer, True)):
            bad = [c for c in text if c not in vocab]
            if bad:
                n_answers += is_answer
                n_prompts += not is_answer
                seen.extend(c for c in bad if c not in seen and len(seen) < 5)
    return n_prompts, n_answers, seen


def _tokenizer(cfg: RunConfig) -> Any | None:
    """The run's tokenizer if it can be had here without a download, else None."""
    from asyncrl.models.tokenizer import charset, load_tokenizer, make_tokenizer

    if not cfg.model.path:
        return make_tokenizer(charset(cfg))
    if cfg.model.path.startswith("s3://") or not (Path(cfg.model.path) / "tokenizer.json").is_file():
        return None
    try:
        return load_tokenizer(cfg.model.path)
    except (OSError, ValueError) as err:
        log.warning("model.path %s: tokenizer not loaded (%s); prompt lengths are checked when the run starts",
                    cfg.model.path, err)
        return None


def check_dataset(cfg: RunConfig, tokenizer: Any | None = None, use_model_tokenizer: bool = True) -> DatasetReport:
    """Check a jsonl, file or reasoning_gym task's rows for this run (see the module docstring); a no-op report for
    other tasks. `tokenizer`: the one to count tokens with (default: the run's, when `use_model_tokenizer`)."""
    if cfg.env is not None or cfg.task.name not in ("jsonl", "file", "reasoning_gym"):
        return DatasetReport(0, 0)
    from asyncrl.tasks.materialised import prepare

    prepare(cfg)  # reasoning_gym, file: both splits made here and registered (generation or field errors raise)
    train, evals = load_split(cfg.task, "train"), load_split(cfg.task, "eval")
    report = DatasetReport(len(train), len(evals))
    same = {p.prompt for p in train} & {p.prompt for p in evals}
    if same:
        report.warnings.append(f"task.eval_path: {len(same)} eval prompt(s) also in task.train_path (the eval is "
                               f"not held out)")
    if tokenizer is None and use_model_tokenizer:
        tokenizer = _tokenizer(cfg)
    if tokenizer is not None:
        _check_lengths(cfg, tokenizer, train, evals, report)
        if not cfg.model.path:
            n_p, n_a, chars = unknown_chars([*train, *evals], set(tokenizer.get_vocab()))
            if n_p or n_a:
                report.warnings.append(f"task: {n_p} prompt(s) and {n_a} answer(s) hold characters the built-in "
                                       f"tokenizer does not have (e.g. {chars}); they read as <unk>, and such an "
                                       f"answer can never be produced")
    for w in report.warnings:
        log.warning("%s", w)
    return report


def _check_lengths(cfg: RunConfig, tokenizer: Any, train: list[Problem], evals: list[Problem],
                   report: DatasetReport) -> None:
    from asyncrl.models.prompts import prompt_format
    from asyncrl.tasks.prompt_fit import describe

    fmt = prompt_format(cfg, tokenizer)
    limit = cfg.generation.max_model_len - cfg.rollout.max_new_tokens
    within = f"generation.max_model_len - rollout.max_new_tokens = {limit} tokens{describe(fmt)}"
    train_lengths = [len(fmt.ids(p.prompt)) for p in train]
    report.train_too_long = sum(n > limit for n in train_lengths)
    if report.train_too_long == len(train):
        raise DatasetError(f"{_where(cfg, 'train')}: no train prompt fits in {within} (the shortest has "
                           f"{min(train_lengths)}); raise generation.max_model_len or shorten the prompts")
    if report.train_too_long:
        report.warnings.append(f"{_where(cfg, 'train', with_path=False)}: {report.train_too_long} of {len(train)} train prompts are "
                               f"longer than {within}; the run skips them")
    if not cfg.eval.every_steps:
        return
    too_long = [(n, p.index) for p in evals if (n := len(fmt.ids(p.prompt))) > limit]
    if too_long:
        n, index = max(too_long)
        raise DatasetError(f"{_where(cfg, 'eval')}: {len(too_long)} of {len(evals)} eval prompts are longer than "
                           f"{within} (the longest, valid row {index} counting from 0, has {n}); raise "
                           f"generation.max_model_len, shorten them, or set eval.every_steps: 0")


def _where(cfg: RunConfig, split: str, with_path: bool = True) -> str:
    """The field (and file) of a split for messages ("task.train_path: data.jsonl"), or the task for generated
    ones."""
    path = cfg.task.train_path if split == "train" else cfg.task.eval_path
    if path:
        return f"task.{split}_path: {path}" if with_path else f"task.{split}_path"
    return f"task {cfg.task.name} ({split} split)"
