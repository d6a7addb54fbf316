"""The environment role: drives the rollout scheduler with real generation and reward servers.

For single-turn verifiable tasks: takes prompts from the train split, admits them under the async ratio
(`RolloutScheduler`), sends each of a prompt's n samples as its own request to the least-loaded generation
server, scores each finished sample at once through the reward role, and writes each finished group to S3 as one
Parquet object (`groups/<writer>/<seq>.parquet`). It follows the trainer through `versions/latest.json`
(version and how many of this writer's groups it consumed) and aborts requests that became too stale.
Stops when the run's `done` marker appears.

Run: `python -m asyncrl.roles.environment --run-url s3://bucket/prefix/run_id --id env0`.
"""

from __future__ import annotations

import asyncio
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

import httpx

from asyncrl.config import RunConfig
from asyncrl.models.tiny import resolve_model_path
from asyncrl.models.tokenizer import decode_response, encode_prompt, load_tokenizer
from asyncrl.roles.context import RoleContext, base_url, instance_index, role_arg_parser, setup_logging
from asyncrl.rollout.clients import GenerationClient, RemoteError, RewardClient
from asyncrl.rollout.scheduler import Abort, Decision, EmitGroup, RolloutScheduler, Start
from asyncrl.tasks.arithmetic import Problem, load_split
from asyncrl.transport.groups import GroupWriter
from asyncrl.types import Group, Sample

log = logging.getLogger(__name__)

POLL_S = 0.1


def prompt_stream(num_problems: int, seed: int) -> Iterator[int]:
    """Problem indices, reshuffled every epoch, deterministic for a seed."""
    rng = random.Random(seed)
    epoch = list(range(num_problems))
    while True:
        rng.shuffle(epoch)
        yield from epoch


def sample_seed(base: int, group_seq: int, sample_index: int, n: int) -> int:
    return (base * 1_000_003 + group_seq * n + sample_index) % (2**31 - 1)


@dataclass
class _Pending:
    problem: Problem
    prompt_ids: list[int]
    samples: dict[int, Sample] = field(default_factory=dict)


class EnvironmentRunner:
    """Owns the scheduler, the in-flight requests and the group writer of one environment instance."""

    def __init__(self, ctx: RoleContext, gens: list[GenerationClient], reward: RewardClient) -> None:
        cfg: RunConfig = ctx.cfg
        self.ctx, self.cfg, self.gens, self.reward = ctx, cfg, gens, reward
        ro = cfg.rollout
        self.sched = RolloutScheduler(
            async_ratio=ro.async_ratio, prompts_per_step=ro.prompts_per_step // ro.num_writers,
            samples_per_prompt=ro.samples_per_prompt, num_servers=len(gens), writer=ctx.role_id,
        )
        self.problems = load_split(cfg.task, "train")
        self.tokenizer = load_tokenizer(resolve_model_path(cfg))
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.prompts = prompt_stream(len(self.problems), cfg.task.seed + 7919 * instance_index(ctx.role_id))
        self.writer = GroupWriter(ctx.store, ctx.paths, ctx.role_id)
        self.pending: dict[str, _Pending] = {}
        self.tasks: set[asyncio.Task] = set()
        self.written = 0
        self.rewards_sum = 0.0
        self.samples_done = 0

    # ---- decisions -----------------------------------------------------------------------------------
    async def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Start):
                task = asyncio.create_task(self.run_sample(d))
                self.tasks.add(task)
                task.add_done_callback(self.tasks.discard)
            elif isinstance(d, Abort):
                self.pending.pop(d.group_id, None)
                try:
                    await self.gens[d.server].abort(f"{d.group_id}-{d.sample_index}")
                except RemoteError as err:
                    log.warning("abort %s-%s failed: %s", d.group_id, d.sample_index, err)
            elif isinstance(d, EmitGroup):
                await self.emit(d)

    def admit(self) -> list[Decision]:
        decisions: list[Decision] = []
        while self.sched.can_admit():
            index = next(self.prompts)
            problem = self.problems[index]
            seq = self.sched.stats.admitted
            out = self.sched.admit(problem.index)
            gid = out[0].group_id  # type: ignore[union-attr]
            self.pending[gid] = _Pending(problem, encode_prompt(self.tokenizer, problem.prompt))
            log.debug("admitted %s (seq %d, version %d)", gid, seq, self.sched.version)
            decisions += out
        return decisions

    async def run_sample(self, d: Start) -> None:
        pending = self.pending.get(d.group_id)
        if pending is None:
            return
        ro = self.cfg.rollout
        seq = int(d.group_id.rsplit("-", 1)[-1])
        try:
            out = await self.gens[d.server].generate(
                f"{d.group_id}-{d.sample_index}", pending.prompt_ids, max_tokens=ro.max_new_tokens,
                temperature=ro.temperature, top_p=ro.top_p,
                seed=sample_seed(self.cfg.generation.seed, seq, d.sample_index, ro.samples_per_prompt),
                stop_token_ids=[self.eos_id], timeout_s=ro.request_timeout_s,
            )
            if out.finish_reason == "abort":
                await self.apply(self.sched.sample_failed(d.group_id, d.sample_index))
                return
            text = decode_response(self.tokenizer, out.token_ids)
            reward, _ = await self.reward.score(self.cfg.task.name, pending.problem.prompt, text,
                                                {"answer": pending.problem.answer})
        except RemoteError as err:
            log.warning("sample %s-%d failed: %s", d.group_id, d.sample_index, err)
            await self.apply(self.sched.sample_failed(d.group_id, d.sample_index))
            return
        pending.samples[d.sample_index] = Sample(
            group_id=d.group_id, sample_index=d.sample_index, prompt_token_ids=pending.prompt_ids,
            token_ids=out.token_ids, logprobs=out.logprobs, token_versions=out.token_versions,
            start_version=out.start_version,
            reward=reward, finish_reason=out.finish_reason,
        )
        self.samples_done += 1
        self.rewards_sum += reward
        await self.apply(self.sched.sample_finished(d.group_id, d.sample_index))

    async def emit(self, d: EmitGroup) -> None:
        pending = self.pending.pop(d.group_id)
        group = Group(d.group_id, pending.problem.index, self.cfg.task.name,
                      [pending.samples[i] for i in sorted(pending.samples)])
        key = await asyncio.to_thread(self.writer.write, group)
        self.written += 1
        log.debug("wrote %s (%d samples, start_version %d)", key, len(group.samples), group.start_version)

    # ---- main loop -----------------------------------------------------------------------------------
    async def follow_trainer(self) -> None:
        latest = await asyncio.to_thread(self.ctx.store.get_json, self.ctx.paths.versions_latest())
        if not latest:
            return
        version = int(latest.get("version", 0))
        consumed = int(latest.get("consumed", {}).get(self.ctx.role_id, 0))
        if version != self.sched.version or consumed != self.sched.consumed:
            await self.apply(self.sched.version_advanced(version, consumed))

    async def run(self) -> None:
        last_log = time.monotonic()
        while True:
            if await asyncio.to_thread(self.ctx.is_done):
                break
            await self.follow_trainer()
            await self.apply(self.admit())
            if self.tasks:
                await asyncio.wait(self.tasks, timeout=POLL_S, return_when=asyncio.FIRST_COMPLETED)
            else:
                await asyncio.sleep(POLL_S)
            if time.monotonic() - last_log > 10:
                last_log = time.monotonic()
                s = self.sched.stats
                log.info("version %d admitted %d written %d aborted %d in-flight %d mean reward %.3f",
                         self.sched.version, s.admitted, self.written, s.aborted_groups, self.sched.running_groups,
                         self.rewards_sum / max(1, self.samples_done))
        await self.shutdown()

    async def shutdown(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        log.info("stopped: admitted %d, wrote %d groups", self.sched.stats.admitted, self.written)


async def run_environment(ctx: RoleContext) -> None:
    cfg = ctx.cfg
    gen_docs = await asyncio.to_thread(ctx.wait_for_peers, "generation", cfg.generation.num_servers)
    reward_docs = await asyncio.to_thread(ctx.wait_for_peers, "reward", 1)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        gens = [GenerationClient(base_url(d), client, cfg.timeouts.http_s) for d in gen_docs]
        reward = RewardClient(base_url(reward_docs[0]), client, cfg.timeouts.http_s)
        await EnvironmentRunner(ctx, gens, reward).run()


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("environment").parse_args(argv)
    setup_logging(args.log_level, "environment", args.id)
    ctx = RoleContext.from_args("environment", args)
    asyncio.run(run_environment(ctx))


if __name__ == "__main__":
    main()
