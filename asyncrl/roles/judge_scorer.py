"""The reward role's judge (`task.judge`): the `JudgeClient` of asyncrl.rewards.judge wired to the run.

With `task.judge.url`, the judge is that OpenAI-compatible server. With `task.judge.model_path`, it is the run's
judge role (`asyncrl.roles.judge`): its address is read from its rendezvous on the first judgment (waiting up to
`timeouts.rendezvous_s`), it is called with the run's bearer token, and its tokenizer and end ids are read from the
model folder here. Items of another task than the run's are refused, as with every scorer.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from asyncrl.models.prompts import stop_token_ids
from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.rewards.custom import Scorer, for_task
from asyncrl.rewards.judge import JudgeClient, JudgeTransport, OpenAIJudge, ServedJudge
from asyncrl.roles.context import RoleContext, base_url
from asyncrl.rpc.auth import role_token


def run_scorer(ctx: RoleContext) -> tuple[Scorer, int, Callable[[], dict[str, float]]]:
    """(scorer, items judged at once, the judge's figures for the heartbeat) of the run's `task.judge`."""
    cfg = ctx.cfg.task.judge
    assert cfg is not None
    http = httpx.Client(limits=httpx.Limits(max_connections=cfg.max_concurrency + 4))
    transport: JudgeTransport
    if cfg.url is not None:
        transport = OpenAIJudge(cfg, http)
    else:
        folder = Path(cfg.model_path or "")
        tokenizer = load_tokenizer(folder)
        chat = bool(getattr(tokenizer, "chat_template", None))
        transport = ServedJudge(
            cfg, http, lambda: base_url(ctx.wait_for_peers("judge", 1, ctx.cfg.timeouts.rendezvous_s)[0]),
            role_token(), tokenizer, stop_token_ids(tokenizer, folder, chat=chat))
    client = JudgeClient(cfg, transport)

    def judged(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        return client.score(prompt, response, answer)

    return for_task((ctx.cfg.task.name,), judged), cfg.max_concurrency, client.stats
