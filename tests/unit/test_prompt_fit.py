"""Prompts longer than the generation context allows are left out of a writer's prompt stream and counted; a prompt
is counted as the model gets it (chat-rendered with a model folder's template)."""

import pytest

from asyncrl.config import RunConfig
from asyncrl.models.tokenizer import make_tokenizer
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.prompt_fit import prompts_that_fit


def test_long_prompts_are_skipped_and_counted():
    cfg = RunConfig.model_validate({"generation": {"max_model_len": 20}, "rollout": {"max_new_tokens": 12}})
    problems = [Problem(0, "1+2=", "3"), Problem(1, "12345678", "x"), Problem(2, "1234567", "y")]
    fits, skipped = prompts_that_fit(cfg, make_tokenizer(), problems)  # limit 20 - 12 = 8 tokens: bos + 7 chars
    assert [p.index for p in fits] == [0, 2] and skipped == 1
    with pytest.raises(ValueError, match=r"no train prompt fits in generation.max_model_len - rollout.max_new_tokens "
                                         r"= 8 tokens \(of 1 prompts; the shortest has 9\)"):
        prompts_that_fit(cfg, make_tokenizer(), [problems[1]])


def test_chat_rendered_prompts_count_the_template_tokens():
    # the built-in text tokenizer's template: <bos> <|user|> prompt <|assistant|> = 3 tokens more than the characters
    cfg = RunConfig.model_validate({"model": {"path": "some/model"}, "generation": {"max_model_len": 20},
                                    "rollout": {"max_new_tokens": 12}, "task": {"prompt_format": "chat"}})
    problems = [Problem(0, "12345", "x"), Problem(1, "123456", "y")]
    fits, skipped = prompts_that_fit(cfg, make_tokenizer("text"), problems)
    assert [p.index for p in fits] == [0] and skipped == 1
    with pytest.raises(ValueError, match=r"= 8 tokens once chat-rendered \(of 1 prompts; the shortest has 9\)"):
        prompts_that_fit(cfg, make_tokenizer("text"), [problems[1]])
