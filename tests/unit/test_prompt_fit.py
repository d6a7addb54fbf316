"""Prompts longer than the generation context allows are left out of a writer's prompt stream and counted."""

import pytest

from asyncrl.config import RunConfig
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.prompt_fit import prompts_that_fit


class _Chars:
    """One token per character: lengths are exact."""

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        return [ord(c) for c in text]


def test_long_prompts_are_skipped_and_counted(monkeypatch):
    monkeypatch.setattr("asyncrl.tasks.prompt_fit.encode_prompt", lambda tok, text: tok.encode(text))
    cfg = RunConfig.model_validate({"generation": {"max_model_len": 20}, "rollout": {"max_new_tokens": 12}})
    problems = [Problem(0, "1+2=", "3"), Problem(1, "123456789", "x"), Problem(2, "12345678", "y")]
    fits, skipped = prompts_that_fit(cfg, _Chars(), problems)  # limit 20 - 12 = 8 tokens
    assert [p.index for p in fits] == [0, 2] and skipped == 1
    with pytest.raises(ValueError, match=r"no train prompt fits in generation.max_model_len - rollout.max_new_tokens "
                                         r"= 8 tokens \(of 1 prompts\)"):
        prompts_that_fit(cfg, _Chars(), [problems[1]])
