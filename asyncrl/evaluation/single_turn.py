"""Held-out evaluation through the generation servers: greedy decoding, scored by the run's scorer (`scorer_for`: the
task's verifier or the run's `task.reward` function; a sample counts as correct when its details say "correct", else
when its reward is at least 1: a format bonus never counts, `is_correct`), and pass@k: `pass_k` samples at
the rollout temperature for each of the first `pass_k_problems` problems, a problem passing when any of its samples
is correct (with exactly k samples drawn, the unbiased pass@k estimator is this indicator).

Run against the live servers, so it measures exactly the weights the servers hold (the warm start before
training, the last synced version after).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import httpx

from asyncrl.generation.client import GenerationClient
from asyncrl.models.prompts import PromptFormat
from asyncrl.models.tokenizer import decode_response
from asyncrl.rewards.custom import Scorer, builtin_scorer, is_correct
from asyncrl.tasks.arithmetic import Problem


async def evaluate(server_urls: list[str], problems: list[Problem], tokenizer: Any, *, task: str,
                   max_new_tokens: int, timeout_s: float, concurrency: int = 64, tag: str = "eval",
                   token: str | None = None, scorer: Scorer = builtin_scorer, pass_k: int = 0,
                   pass_k_problems: int = 0, temperature: float = 1.0, top_p: float = 1.0,
                   prompt: PromptFormat | None = None, stop_ids: list[int] | None = None) -> dict[str, Any]:
    """Greedy accuracy of the servers' current weights on `problems`; requests are spread round-robin.
    With `pass_k` > 0 also `pass_at_k` (and `k`, `pass_k_n`) over the first `pass_k_problems` problems (0: all),
    sampled at `temperature`/`top_p` with a distinct seed per sample.
    `versions`: the weight versions that generated the last tokens of every request (greedy and sampled); `mixed`:
    requests whose tokens span an update. `token`: the servers' bearer token (default: `ASYNCRL_ROLE_TOKEN`).
    `prompt`: how prompts become ids (default raw, `[bos] + tokens`); `stop_ids`: the ids that end an answer (default
    the tokenizer's eos)."""
    if not server_urls:
        raise ValueError("evaluate: no generation servers")
    sem = asyncio.Semaphore(concurrency)
    prompt = prompt or PromptFormat(tokenizer, "raw")
    stops = list(stop_ids) if stop_ids else [int(tokenizer.eos_token_id)]
    async with httpx.AsyncClient() as client:
        gens = [GenerationClient(u, client, timeout_s, token=token) for u in server_urls]

        async def one(i: int, p: Problem, sample: int = -1) -> tuple[float, int, bool, bool]:
            """Problem `i`, greedy (`sample` -1) or its sample number `sample` at the rollout temperature."""
            greedy = sample < 0
            async with sem:
                out = await gens[i % len(gens)].generate(
                    f"{tag}-{i}" if greedy else f"{tag}-{i}-s{sample}", prompt.ids(p.prompt),
                    max_tokens=max_new_tokens, temperature=0.0 if greedy else temperature,
                    top_p=1.0 if greedy else top_p, seed=0 if greedy else 1 + sample, stop_token_ids=stops)
            reward, details = scorer(task, p.prompt, decode_response(tokenizer, out.token_ids), p.answer)
            last = out.token_versions[-1] if out.token_versions else out.start_version
            return reward, last, len({out.start_version, *out.token_versions}) > 1, is_correct(reward, details)

        sampled_problems = problems[:pass_k_problems or len(problems)] if pass_k > 0 else []
        results, sampled = await asyncio.gather(
            asyncio.gather(*(one(i, p) for i, p in enumerate(problems))),
            asyncio.gather(*(one(i, p, j) for i, p in enumerate(sampled_problems) for j in range(pass_k))))
    correct = sum(c for *_, c in results)
    everything = [*results, *sampled]
    out: dict[str, Any] = {"accuracy": correct / len(problems), "correct": correct, "n": len(problems),
                           "mean_reward": sum(r for r, *_ in results) / len(problems),
                           "versions": sorted({v for _, v, *_ in everything}),
                           "mixed": sum(m for _, _, m, _ in everything)}
    if sampled_problems:
        out.update(pass_at_k=pass_at_k([1.0 if c else 0.0 for *_, c in sampled], pass_k), k=pass_k,
                   pass_k_n=len(sampled_problems))
    return out


def pass_at_k(rewards: Sequence[float], k: int) -> float:
    """Pure: the share of problems with at least one correct sample (reward >= 1), `rewards` holding each problem's
    `k` samples one problem after another."""
    if k < 1 or not rewards or len(rewards) % k:
        raise ValueError(f"pass_at_k: expected k >= 1 and a positive multiple of k rewards, got k={k}, "
                         f"{len(rewards)} rewards")
    problems = len(rewards) // k
    return sum(any(r >= 1.0 for r in rewards[i * k:(i + 1) * k]) for i in range(problems)) / problems
