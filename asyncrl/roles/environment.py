"""The environment role: drives the rollout scheduler with real generation and reward servers.

For single-turn verifiable tasks: takes prompts from the train split and offers them to the `RolloutScheduler`
(admission under α, replication, queue routing, redundancy, dynamic filtering, staleness; see its docstring), turns
its decisions into requests and aborts on the generation servers, scores each finished sample at once through the
reward role, and writes the kept groups to S3 as Parquet objects (`groups/<writer>/<seq>.parquet`; the groups that
finish together share one object, `write_group`). It follows
the trainer through `versions/latest.json` (version, and how many of this writer's groups it trained and read).
On an agentic task (`env` set) each sample is a multi-turn episode: see `asyncrl.roles.agentic`.
With `partial_rollout: resubmit` a request aborted for a weight update is re-sent with its partial tokens appended.
Every `stats_interval_s` it writes its rollout metrics (aborts, drops, in-flight, per-server busy fraction and
tokens/s) to `stats/<writer>.json` for the trainer to log. Stops when the run's `done` marker appears.

Run: `python -m asyncrl.roles.environment --run-url s3://bucket/prefix/run_id --id env0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import httpx

from asyncrl.config import RunConfig
from asyncrl.generation.client import Generated
from asyncrl.models.tiny import resolve_model_path
from asyncrl.models.tokenizer import decode_response, encode_prompt, load_tokenizer
from asyncrl.rewards.client import RewardClient
from asyncrl.roles.context import (
    RoleContext,
    base_url,
    instance_index,
    role_arg_parser,
    setup_logging,
    stop_when_over,
    wait_for_rendezvous_async,
)
from asyncrl.roles.generation_servers import GenerationServers, log_lost
from asyncrl.roles.liveness import RunOver
from asyncrl.rollout.scheduler import (
    Abort,
    Decision,
    DropGroup,
    EmitGroup,
    RolloutScheduler,
    SchedulerConfig,
    Start,
)
from asyncrl.rollout.workload import decode_budget, loss_mask_to_first_eos, server_rates
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.prompt_fit import prompts_that_fit
from asyncrl.transport.groups import GroupWriter
from asyncrl.transport.http import RemoteError
from asyncrl.types import Group, Sample

log = logging.getLogger(__name__)

MAX_GROUPS_PER_OBJECT = 64  # groups written as one S3 object at most (one PUT, one GET, whatever the group count)
POLL_S = 0.1  # how often the writer reads the trainer's versions/latest.json (admission waits for it)
DONE_CHECK_S = 1.0  # how often it looks for the run's done marker


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
class _Trajectory:
    """What one sample's requests produced so far (a resubmitted sample has several requests)."""

    budget: int
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    start_version: int | None = None
    finish_reason: str = "abort"

    def extend(self, out: Generated) -> None:
        if self.start_version is None:
            self.start_version = out.start_version
        self.token_ids += out.token_ids
        self.logprobs += out.logprobs
        self.versions += out.token_versions
        self.finish_reason = out.finish_reason


@dataclass
class _Pending:
    problem: Problem
    prompt_ids: list[int]
    seq: int
    trajectories: dict[int, _Trajectory] = field(default_factory=dict)
    samples: dict[int, Sample] = field(default_factory=dict)


def scheduler_config(cfg: RunConfig, num_servers: int, writer: str, incarnation: int = 0) -> SchedulerConfig:
    ro = cfg.rollout
    return SchedulerConfig(
        async_ratio=ro.async_ratio, prompts_per_step=ro.prompts_per_step // ro.num_writers,
        group_size=ro.samples_per_prompt, num_servers=num_servers, extra_samples=ro.extra_samples_per_prompt,
        extra_groups=ro.extra_groups, routing=ro.routing, replicate=ro.replicate_prompts,
        dynamic_filter=ro.dynamic_filter, partial_rollout=ro.partial_rollout, max_new_tokens=ro.max_new_tokens,
        writer=writer, replace_failed=ro.replace_failed, incarnation=incarnation,
    )


def restart_losses(ctx: RoleContext, written_before: int) -> int:
    """Groups this writer had in flight when it last stopped (admitted, not yet written: their work is lost and
    counted as `rollout/lost_at_restart_groups`), from its last published stats; 0 on a first start."""
    if written_before == 0:
        return 0
    doc = ctx.store.get_json(ctx.paths.rollout_stats(ctx.role_id)) or {}
    live = int(doc.get("metrics", {}).get("rollout/live_groups", 0))
    previous = int(doc.get("metrics", {}).get("rollout/lost_at_restart_groups", 0))
    log.warning("restarted with %d groups already written; %d groups in flight at the stop are lost", written_before,
                live)
    return previous + live


class EnvironmentRunner:
    """Owns the scheduler, the in-flight requests and the group writer of one environment instance."""

    def __init__(self, ctx: RoleContext, gens: GenerationServers, reward: RewardClient) -> None:
        cfg: RunConfig = ctx.cfg
        self.ctx, self.cfg, self.gens, self.reward = ctx, cfg, gens, reward
        self.writer = GroupWriter(ctx.store, ctx.paths, ctx.role_id)
        # a restarted writer (the run resumed): its groups already in S3 count toward the α bound, new group ids
        # carry the restart so they never collide with those, and the prompt stream moves on past them
        before = self.writer.next_seq
        self.sched = RolloutScheduler(scheduler_config(cfg, len(gens), ctx.role_id, incarnation=before))
        self.sched.restore_emitted(before)
        self.lost_at_restart = restart_losses(ctx, before)
        self.problems = load_split(cfg.task, "train")
        self.tokenizer = load_tokenizer(resolve_model_path(cfg))
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.skipped_long_prompts = 0
        if cfg.env is None:  # an agentic writer builds its prompts from the environment instead
            self.problems, self.skipped_long_prompts = prompts_that_fit(cfg, self.tokenizer, self.problems)
        self.prompts = prompt_stream(len(self.problems), cfg.task.seed + 7919 * instance_index(ctx.role_id))
        for _ in range(before):
            next(self.prompts)
        self.pending: dict[str, _Pending] = {}
        self.tasks: set[asyncio.Task] = set()
        self._task_ended = asyncio.Event()  # set when a tracked task ends: the main loop looks at admission again
        self.written = 0
        self.rewards_sum = 0.0
        self.samples_done = 0
        self.failures: dict[str, int] = {}
        self.emit_lock = asyncio.Lock()
        self.to_write: list[Group] = []  # emitted, not yet written (see write_group)
        self.objects_written = 0
        self._health: list[dict[str, Any]] | None = None

    # ---- decisions -----------------------------------------------------------------------------------
    def track(self, task: asyncio.Task) -> None:
        """Keep `task` (a request or an episode) until it ends; its end wakes the main loop."""
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._task_ended.set()

    async def apply(self, decisions: list[Decision]) -> None:
        for d in decisions:
            if isinstance(d, Start):
                self.track(asyncio.create_task(self.run_request(d)))
            elif isinstance(d, Abort):
                if not d.resubmit:
                    log.debug("abort %s: %s", d.request_id, d.reason)
                try:
                    await self.gens[d.server].abort(d.request_id)
                except RemoteError as err:
                    log.warning("abort %s failed: %s", d.request_id, err)
            elif isinstance(d, DropGroup):
                self.pending.pop(d.group_id, None)
            elif isinstance(d, EmitGroup):
                await self.emit(d)

    def admit(self) -> list[Decision]:
        decisions: list[Decision] = []
        while self.sched.can_admit():
            problem = self.problems[next(self.prompts)]
            prompt_ids = encode_prompt(self.tokenizer, problem.prompt)
            seq = self.sched.stats.admitted
            out = self.sched.offer_prompt(problem.index, len(prompt_ids))
            gid = out[0].group_id  # type: ignore[union-attr]
            self.pending[gid] = _Pending(problem, prompt_ids, seq)
            log.debug("admitted %s (version %d)", gid, self.sched.version)
            decisions += out
        return decisions

    def _budget(self, seq: int, sample_index: int) -> int:
        ro = self.cfg.rollout
        if ro.length_tail is None:
            return ro.max_new_tokens
        seed = sample_seed(self.cfg.generation.seed + 17, seq, sample_index, ro.samples_per_prompt)
        return decode_budget(seed, ro.length_tail.median_tokens, ro.length_tail.sigma, ro.max_new_tokens)

    async def run_request(self, d: Start) -> None:
        """One request of one sample: generate, then (when the sample is complete) score it."""
        pending = self.pending.get(d.group_id)
        if pending is None:
            return
        ro = self.cfg.rollout
        traj = pending.trajectories.setdefault(d.sample_index, _Trajectory(self._budget(pending.seq, d.sample_index)))
        remaining = traj.budget - len(traj.token_ids)
        ended = ro.length_tail is None and self.eos_id in traj.token_ids
        try:
            if remaining > 0 and not ended:
                out = await self.gens[d.server].generate(
                    d.request_id, pending.prompt_ids + traj.token_ids, max_tokens=remaining,
                    temperature=ro.temperature, top_p=ro.top_p,
                    seed=sample_seed(self.cfg.generation.seed + 1009 * d.turn, pending.seq, d.sample_index,
                                     ro.samples_per_prompt),
                    stop_token_ids=[] if ro.length_tail else [self.eos_id], ignore_eos=ro.length_tail is not None,
                    timeout_s=ro.request_timeout_s,
                )
            else:  # a resubmit raced the end of the request: nothing left to decode
                out = Generated([], [], [], traj.finish_reason if ended else "length", traj.start_version or 0)
        except RemoteError as err:
            if err.server_unavailable:  # the server is gone or cannot serve: re-send the request elsewhere
                log_lost(d, err)
                await self.apply(self.sched.request_lost(d.group_id, d.sample_index))
                return
            self._count_failure("generate", d, err)
            await self.apply(self.sched.sample_failed(d.group_id, d.sample_index))
            return
        traj.extend(out)
        aborted = out.finish_reason == "abort"
        await self.apply(self.sched.request_finished(d.group_id, d.sample_index, len(out.token_ids), aborted))
        if not aborted and d.group_id in self.pending:
            await self.score(d, pending, traj)

    async def score(self, d: Start, pending: _Pending, traj: _Trajectory) -> None:
        text = decode_response(self.tokenizer, traj.token_ids)
        try:
            reward, _ = await self.reward.score(self.cfg.task.name, pending.problem.prompt, text,
                                                {"answer": pending.problem.answer})
            sample = Sample(
                group_id=d.group_id, sample_index=d.sample_index, prompt_token_ids=pending.prompt_ids,
                token_ids=traj.token_ids, logprobs=traj.logprobs, token_versions=traj.versions,
                start_version=traj.start_version if traj.start_version is not None else d.start_version,
                reward=reward, finish_reason=traj.finish_reason,
                loss_mask=loss_mask_to_first_eos(traj.token_ids, self.eos_id) if self.cfg.rollout.length_tail else None,
            )
            sample.validate()
        except (RemoteError, ValueError) as err:
            self._count_failure("score", d, err)
            await self.apply(self.sched.sample_failed(d.group_id, d.sample_index))
            return
        pending.samples[d.sample_index] = sample
        self.samples_done += 1
        self.rewards_sum += reward
        await self.apply(self.sched.sample_scored(d.group_id, d.sample_index, reward))

    def _count_failure(self, where: str, d: Start, err: Exception) -> None:
        self.failures[where] = self.failures.get(where, 0) + 1
        log.warning("sample %s %s failed: %s", d.request_id, where, err)

    async def emit(self, d: EmitGroup) -> None:
        pending = self.pending.pop(d.group_id)
        await self.write_group(Group(d.group_id, pending.problem.index, self.cfg.task.name,
                                     [pending.samples[i] for i in d.sample_indices]))

    async def write_group(self, group: Group) -> None:
        """Queue `group` for S3 and write what is queued: the groups emitted in the same event-loop iteration, or
        while the previous write was in flight, go as one object (at most `MAX_GROUPS_PER_OBJECT`). Returns once
        `group` is written (by this call or by an earlier caller's write)."""
        self.to_write.append(group)
        await asyncio.sleep(0)  # let the other groups this iteration emits queue up first
        async with self.emit_lock:  # one write at a time: objects are numbered in stream order
            if not any(g is group for g in self.to_write):
                return  # an earlier caller wrote it
            while self.to_write:
                batch = self.to_write[:MAX_GROUPS_PER_OBJECT]
                key = await asyncio.to_thread(self.writer.write_many, batch)
                del self.to_write[:len(batch)]
                self.written += len(batch)
                self.objects_written += 1
                log.debug("wrote %s (%d groups)", key, len(batch))
                if all(g is not group for g in self.to_write):
                    return

    # ---- metrics -------------------------------------------------------------------------------------
    async def publish_stats(self) -> dict[str, float]:
        """Write this writer's rollout metrics to S3 (`stats/<writer>.json`); the trainer logs them to MLflow."""
        health: list[dict[str, Any]] = []
        for g in self.gens:
            try:
                health.append(await g.health())
            except RemoteError:
                health.append({})
        s, counts = self.sched.stats, self.sched.counts()
        metrics: dict[str, float] = {
            "rollout/admitted_groups": s.admitted, "rollout/written_groups": self.written,
            "rollout/written_objects": self.objects_written,
            "rollout/lost_at_restart_groups": self.lost_at_restart,
            "rollout/aborted_stale_groups": s.aborted_stale_groups,
            "rollout/aborted_failed_groups": s.aborted_failed_groups,
            "rollout/aborted_redundant_groups": s.aborted_surpassed_groups,
            "rollout/filtered_groups": s.filtered_groups, "rollout/aborted_samples": s.samples_aborted,
            "rollout/dropped_samples": s.samples_dropped, "rollout/failed_samples": s.samples_failed,
            "rollout/resubmits": s.resubmits, "rollout/requests_in_flight": counts["running_requests"],
            "rollout/live_groups": counts["live_groups"], "rollout/version": self.sched.version,
            "rollout/reward_retries": self.reward.retries,
            "rollout/score_failed_samples": self.failures.get("score", 0),
            "rollout/lost_requests": s.requests_lost, "rollout/lost_servers": s.servers_lost,
            "rollout/returned_servers": s.servers_returned, "rollout/down_servers": len(self.sched.servers_down),
            "rollout/skipped_long_prompts": self.skipped_long_prompts,
        }
        if self._health is not None:
            for i, rates in enumerate(server_rates(self._health, health)):
                for k, v in rates.items():
                    metrics[f"rollout/server{i}/{k}"] = v
        for i, n in enumerate(self.sched.server_requests):
            metrics[f"rollout/server{i}/requests_in_flight"] = n
        metrics.update(self.extra_metrics())
        self._health = health
        doc = {"writer": self.ctx.role_id, "time": time.time(), "metrics": metrics, **self.extra_stats()}
        await asyncio.to_thread(self.ctx.store.put_json, self.ctx.paths.rollout_stats(self.ctx.role_id), doc)
        return metrics

    def extra_stats(self) -> dict[str, Any]:
        """Documents a subclass adds to `stats/<writer>.json` beside the metrics."""
        return {}

    def extra_metrics(self) -> dict[str, float]:
        """Metrics a subclass adds to the published rollout stats."""
        return {"rollout/replaced_samples": float(self.sched.stats.samples_replaced)}

    # ---- main loop -----------------------------------------------------------------------------------
    async def follow_trainer(self) -> None:
        latest = await asyncio.to_thread(self.ctx.store.get_json, self.ctx.paths.versions_latest())
        if not latest:
            return
        me = self.ctx.role_id
        version = int(latest.get("version", 0))
        consumed = int(latest.get("consumed", {}).get(me, 0))
        trained = int(latest.get("trained", {}).get(me, 0))
        if (version, trained, consumed) != (self.sched.version, self.sched.trained, self.sched.consumed):
            await self.apply(self.sched.version_advanced(version, trained, consumed))

    async def run(self) -> None:
        interval = self.cfg.rollout.stats_interval_s
        last_stats = time.monotonic()
        await self.publish_stats()
        last_done_check = last_follow = float("-inf")
        while True:
            # the loop wakes whenever a request ends; the S3 reads it makes are paced by time, not by requests
            now = time.monotonic()
            if now - last_done_check >= DONE_CHECK_S:
                last_done_check = now
                if await asyncio.to_thread(self.ctx.is_done):
                    break
            if now - last_follow >= POLL_S:
                last_follow = now
                await self.follow_trainer()
            for server in await self.gens.returned(self.sched.servers_down, self.sched.min_trainable_version()):
                await self.apply(self.sched.server_returned(server))
            await self.apply(self.admit())
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._task_ended.wait(), POLL_S)
            self._task_ended.clear()
            if time.monotonic() - last_stats > interval:
                last_stats = time.monotonic()
                m = await self.publish_stats()
                log.info("version %d admitted %d written %d aborted %d in-flight %d mean reward %.3f",
                         self.sched.version, m["rollout/admitted_groups"], self.written,
                         self.sched.stats.aborted_groups, m["rollout/requests_in_flight"],
                         self.rewards_sum / max(1, self.samples_done))
        await self.shutdown()

    async def shutdown(self) -> None:
        for task in list(self.tasks):
            task.cancel()
        await asyncio.gather(*self.tasks, return_exceptions=True)
        log.info("stopped: admitted %d, wrote %d groups", self.sched.stats.admitted, self.written)


async def run_environment(ctx: RoleContext) -> None:
    cfg = ctx.cfg
    wait_s = cfg.timeouts.rendezvous_s
    gen_docs = await wait_for_rendezvous_async(ctx.store, ctx.paths, "generation", cfg.generation.num_servers, wait_s)
    reward_docs = await wait_for_rendezvous_async(ctx.store, ctx.paths, "reward", 1, wait_s)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        gens = GenerationServers(ctx, client, gen_docs, cfg.timeouts.http_s)
        reward = RewardClient(base_url(reward_docs[0]), client, cfg.timeouts.http_s,
                              attempts=cfg.rollout.reward_attempts)
        if cfg.env is not None:
            from asyncrl.roles.agentic import AgenticRunner  # the agentic runner builds on this module

            await AgenticRunner(ctx, gens, reward).run()
        else:
            await EnvironmentRunner(ctx, gens, reward).run()


async def run_until_over(ctx: RoleContext) -> RunOver | None:
    """Run the environment writer until it stops at the run's `done` marker (None), or until the trainer failed or
    is gone (the `RunOver` that says so; the writer's work is cancelled)."""
    watch = asyncio.create_task(stop_when_over(ctx, "exit", asyncio.Event()))
    work = asyncio.create_task(run_environment(ctx))
    finished, _ = await asyncio.wait({watch, work}, return_when=asyncio.FIRST_COMPLETED)
    if work in finished:
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)
        work.result()  # the writer's own error, if any
        return None
    work.cancel()
    await asyncio.gather(work, return_exceptions=True)
    return watch.result()


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("environment").parse_args(argv)
    setup_logging(args.log_level, "environment", args.id)
    ctx = RoleContext.from_args("environment", args)
    with ctx.heartbeat():
        over = asyncio.run(run_until_over(ctx))
    if over is not None and over.exit_code:
        raise SystemExit(f"environment[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
