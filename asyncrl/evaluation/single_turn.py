"""Held-out evaluation through the generation servers: greedy decoding, scored by the task's verifier (or the run's
`task.reward` function; a sample counts as correct when its reward is at least 1).

Run against the live servers, so it measures exactly the weights the servers hold (the warm start before
training, the last synced version after).
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from asyncrl.generation.client import GenerationClient
from asyncrl.models.tokenizer import decode_response, encode_prompt
from asyncrl.rewards.custom import Scorer, builtin_scorer
from asyncrl.tasks.arithmetic import Problem


async def evaluate(server_urls: list[str], problems: list[Problem], tokenizer: Any, *, task: str,
                   max_new_tokens: int, timeout_s: float, concurrency: int = 64, tag: str = "eval",
                   token: str | None = None, scorer: Scorer = builtin_scorer) -> dict[str, Any]:
    """Greedy accuracy of the servers' current weights on `problems`; requests are spread round-robin.
    `versions`: the weight versions that generated the last tokens; `mixed`: requests whose tokens span an update.
    `token`: the servers' bearer token (default: `ASYNCRL_ROLE_TOKEN`)."""
    if not server_urls:
        raise ValueError("evaluate: no generation servers")
    sem = asyncio.Semaphore(concurrency)
    eos = int(tokenizer.eos_token_id)
    async with httpx.AsyncClient() as client:
        gens = [GenerationClient(u, client, timeout_s, token=token) for u in server_urls]

        async def one(i: int, p: Problem) -> tuple[float, int, bool]:
            async with sem:
                out = await gens[i % len(gens)].generate(
                    f"{tag}-{i}", encode_prompt(tokenizer, p.prompt), max_tokens=max_new_tokens, temperature=0.0,
                    top_p=1.0, seed=0, stop_token_ids=[eos])
            reward, _ = scorer(task, p.prompt, decode_response(tokenizer, out.token_ids), p.answer)
            last = out.token_versions[-1] if out.token_versions else out.start_version
            return reward, last, len({out.start_version, *out.token_versions}) > 1

        results = await asyncio.gather(*(one(i, p) for i, p in enumerate(problems)))
    correct = sum(r >= 1.0 for r, _, _ in results)
    return {"accuracy": correct / len(problems), "correct": correct, "n": len(problems),
            "mean_reward": sum(r for r, _, _ in results) / len(problems),
            "versions": sorted({v for _, v, _ in results}), "mixed": sum(m for _, _, m in results)}
