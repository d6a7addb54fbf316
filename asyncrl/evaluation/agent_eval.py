"""Held-out success of an agent task: the user's agent function on the held-out levels, its model calls answered
greedily by the generation servers through an episode endpoint of its own.

The held-out levels are seeds 0..env.num_eval-1 (`task["split"] == "eval"`); training levels start at 1,000,000.
Each level is played once. A model call is answered greedily from the exact recorded tokens (`AgentTranscript`),
with the run's limits on what a request may ask; an episode counts as a success when the agent's result says
`success: true`, or, without that key, when its reward is above 0. An episode whose agent fails counts as a failure
and is reported with its reason.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import httpx

from asyncrl.agents.agent_function import AgentFault, agent_task, call_agent, make_client, resolve_agent
from asyncrl.agents.chat_request import Limits, RequestError, template_renders_tools
from asyncrl.agents.endpoint import EpisodeEndpoint
from asyncrl.agents.session import TurnSession
from asyncrl.agents.transcript import AgentTranscript
from asyncrl.config import RunConfig
from asyncrl.generation.client import GenerationClient
from asyncrl.models.prompts import stop_token_ids


class _GreedySession(TurnSession):
    """One held-out episode's endpoint session: each request generated greedily on one server."""

    def __init__(self, gen: GenerationClient, tokenizer: Any, cfg: RunConfig, limits: Limits, renders_tools: bool,
                 tag: str, stop_ids: list[int]) -> None:
        super().__init__(tokenizer, limits, renders_tools, tag)
        self.gen, self.tok, self.cfg, self.stop_ids = gen, tokenizer, cfg, stop_ids
        self.transcript = AgentTranscript.for_tokenizer(tokenizer)
        self.versions: set[int] = set()

    async def turn(self, rendered: str, max_tokens: int) -> tuple[str, str, int, int]:
        env = self.cfg.env
        assert env is not None
        if self.turns >= env.max_turns:
            raise RequestError(f"episode: all env.max_turns = {env.max_turns} model calls are used",
                               kind="max_turns_exceeded")
        context = self.transcript.begin_turn(rendered)
        budget = min(max_tokens, self.cfg.generation.max_model_len - len(context))
        if budget <= 0:
            raise RequestError(f"messages: {len(context)} tokens leave no room in the model's context "
                               f"(generation.max_model_len = {self.cfg.generation.max_model_len})",
                               kind="context_length_exceeded")
        out = await self.gen.generate(f"{self.tag}-{self.turns}", context, max_tokens=budget, temperature=0.0,
                                      top_p=1.0, seed=0, stop_token_ids=self.stop_ids)
        self.transcript.add_generated(out.token_ids, out.logprobs, out.token_versions, out.start_version)
        self.versions.update(out.token_versions)
        self.turns += 1
        ids = list(out.token_ids)
        finish = "stop" if ids and ids[-1] in self.stop_ids else "length"
        return self.tok.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False), finish, \
            len(context), len(ids)


async def evaluate_agent(server_urls: list[str], cfg: RunConfig, tokenizer: Any, *, timeout_s: float,
                         concurrency: int = 32, tag: str = "eval", token: str | None = None,
                         model_folder: Path | None = None) -> dict[str, Any]:
    """Greedy held-out success rate of the agent with the servers' current weights (same result keys as
    `evaluate_agentic`). `token`: the servers' bearer token (default: `ASYNCRL_ROLE_TOKEN`); `model_folder`: where
    generation_config.json's end ids are read (the chat template's end of turn and the tokenizer's eos always)."""
    env = cfg.env
    if env is None or env.agent is None:
        raise ValueError("evaluate_agent: the config names no env.agent")
    if not server_urls:
        raise ValueError("evaluate_agent: no generation servers")
    agent = resolve_agent(env.agent)
    ro = cfg.rollout
    limits = Limits(ro.temperature, ro.top_p, ro.max_new_tokens)
    renders_tools = template_renders_tools(tokenizer)
    stop_ids = stop_token_ids(tokenizer, model_folder, chat=True)
    endpoint = EpisodeEndpoint(request_timeout_s=timeout_s)
    await endpoint.start()
    sem = asyncio.Semaphore(concurrency)
    faults: list[str] = []
    try:
        async with httpx.AsyncClient() as client:
            gens = [GenerationClient(u, client, timeout_s, token=token) for u in server_urls]

            async def one(seed: int) -> tuple[bool, int, set[int]]:
                async with sem:
                    session = _GreedySession(gens[seed % len(gens)], tokenizer, cfg, limits, renders_tools,
                                             f"{tag}-{seed}", stop_ids)
                    url = endpoint.open_episode(session)
                    task = agent_task(env, seed, "eval")
                    try:
                        result = await call_agent(agent, make_client(agent, url, timeout_s), task,
                                                  env.agent_timeout_s)
                    except AgentFault as fault:
                        faults.append(f"level {seed}: {fault.kind}: {fault}")
                        return False, session.turns, session.versions
                    finally:
                        endpoint.close_episode(url)
                    won = result.success if result.success is not None else result.reward > 0
                    return bool(won), session.turns, session.versions

            results = await asyncio.gather(*(one(seed) for seed in range(env.num_eval)))
    finally:
        await endpoint.stop()
    wins = sum(ok for ok, _, _ in results)
    return {"accuracy": wins / env.num_eval, "correct": wins, "n": env.num_eval,
            "mean_turns": sum(t for _, t, _ in results) / env.num_eval, "faults": faults,
            "versions": sorted({max(v) for _, _, v in results if v}), "mixed": sum(len(v) > 1 for _, _, v in results)}
