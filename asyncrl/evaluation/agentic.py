"""Held-out success rate of an agentic task through the generation servers: greedy multi-turn episodes.

The held-out levels are seeds 0..env.num_eval-1 (training levels start at 1,000,000). Each level is played once,
greedily, with the same chat formatting and turn limits as training, and with no injected latency or faults: it
measures the policy, not the environment. An episode whose environment fails counts as a failure and is reported.
"""

from __future__ import annotations

import asyncio
from typing import Any

import httpx

from asyncrl.config import RunConfig
from asyncrl.envs.execution import EnvExecutor, EnvFault
from asyncrl.generation.client import GenerationClient
from asyncrl.models.chat import ChatFormat
from asyncrl.rollout.multiturn import MultiTurnTrajectory


async def evaluate_agentic(server_urls: list[str], cfg: RunConfig, tokenizer: Any, *, timeout_s: float,
                           concurrency: int = 32, tag: str = "eval", token: str | None = None) -> dict[str, Any]:
    """Greedy success rate of the servers' current weights on the held-out levels. `token`: the servers' bearer
    token (default: `ASYNCRL_ROLE_TOKEN`)."""
    env = cfg.env
    if env is None:
        raise ValueError("evaluate_agentic: the config has no env section")
    if not server_urls:
        raise ValueError("evaluate_agentic: no generation servers")
    chat, eos = ChatFormat(tokenizer), int(tokenizer.eos_token_id)
    ro, max_len = cfg.rollout, cfg.generation.max_model_len
    sem = asyncio.Semaphore(concurrency)
    executor = EnvExecutor(env.executor, env.max_concurrent_steps, env.step_timeout_s)
    faults: list[str] = []
    try:
        async with httpx.AsyncClient() as client:
            gens = [GenerationClient(u, client, timeout_s, token=token) for u in server_urls]

            async def one(seed: int) -> tuple[bool, int, int, bool]:
                async with sem:
                    handle = await executor.open(env.name, env.params)
                    try:
                        obs, _ = await handle.reset(seed)
                        traj = MultiTurnTrajectory(chat.prompt_ids(obs, env.system_prompt))
                        for turn in range(env.max_turns):
                            budget = min(ro.max_new_tokens, max_len - len(traj.context_ids))
                            if budget <= 0:
                                break
                            out = await gens[seed % len(gens)].generate(
                                f"{tag}-{seed}-{turn}", traj.context_ids, max_tokens=budget, temperature=0.0,
                                top_p=1.0, seed=0, stop_token_ids=[eos])
                            traj.add_generated(out.token_ids, out.logprobs, out.token_versions, out.start_version)
                            if not out.token_ids:
                                break
                            result = await handle.step(
                                tokenizer.decode(traj.current_turn_ids(), skip_special_tokens=True))
                            between = chat.between_turns_ids(traj.current_turn_ids(), result.observation)
                            if result.done or len(traj.context_ids) + len(between) + 1 > max_len:
                                return bool(result.info.get("success", False)), turn + 1, _last_version(traj), \
                                    _mixed(traj)
                            traj.end_turn(result.reward, between)
                        return False, traj.num_turns, _last_version(traj), _mixed(traj)
                    except EnvFault as fault:
                        faults.append(f"level {seed}: {fault.kind}: {fault}")
                        return False, 0, -1, False
                    finally:
                        await handle.close()

            results = await asyncio.gather(*(one(seed) for seed in range(env.num_eval)))
    finally:
        await executor.aclose()
    wins = sum(ok for ok, _, _, _ in results)
    return {"accuracy": wins / env.num_eval, "correct": wins, "n": env.num_eval,
            "mean_turns": sum(t for _, t, _, _ in results) / env.num_eval, "faults": faults,
            "versions": sorted({v for _, _, v, _ in results if v >= 0}), "mixed": sum(m for *_, m in results)}


def _last_version(traj: MultiTurnTrajectory) -> int:
    return traj.versions[-1] if traj.versions else (traj.start_version or 0)


def _mixed(traj: MultiTurnTrajectory) -> bool:
    """Whether the episode's generated tokens came from more than one weight version."""
    return len(set(traj.versions)) > 1
