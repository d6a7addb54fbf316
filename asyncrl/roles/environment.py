"""The environment role: drives the rollout scheduler with real generation and reward servers.

This module is the role's entry point: it waits for the generation and reward servers, picks what one sample is,
and runs one `RolloutDriver` (`asyncrl.roles.rollout_driver`) until the run is over:
- a single-turn verifiable task: `SingleTurnKind` (`asyncrl.roles.single_turn`): prompts from the train split, each
  finished sample scored at once through the reward role;
- an agentic task (`env` set): `EpisodeKind` (`asyncrl.roles.agentic`): each sample is a multi-turn episode;
- an agent task (`env.agent` set): `AgentKind` (`asyncrl.roles.agent_episodes`): each sample is one call of the
  user's agent function, whose model calls come through the episode endpoint (docs/agents.md).
The driver offers groups to the `RolloutScheduler` (admission under α, replication, queue routing, redundancy,
dynamic filtering, staleness; see its docstring), turns its decisions into requests and aborts on the generation
servers, and writes the kept groups to S3 as Parquet objects (`groups/<writer>/<seq>.parquet`; the groups that
finish together share one object). It follows the trainer through `versions/latest.json` (version, and how many of
this writer's groups it trained and read). With `partial_rollout: resubmit` a request aborted for a weight update
is re-sent with its partial tokens appended. Every `stats_interval_s` it writes its rollout metrics (aborts, drops,
in-flight, per-server busy fraction and tokens/s) to `stats/<writer>.json` for the trainer to log. The first
writer also evaluates the servers' weights on the held-out split every `eval.every_steps` versions
(`asyncrl.roles.periodic_eval`). Stops when the run's `done` marker appears, or when the trainer failed or is gone;
on SIGTERM/SIGINT its work is cancelled (the group objects already written stay; one is written whole or not at
all) and the stop recorded (`asyncrl.roles.stop_signal`). Every wait of that stop has a deadline
(`asyncrl.roles.bounded_stop`), whatever was in flight: the pod's grace period ends with SIGKILL.

Run: `python -m asyncrl.roles.environment --run-url s3://bucket/prefix/run_id --id env0`.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import httpx

from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.rewards.client import RewardClient
from asyncrl.roles.agent_episodes import AgentKind
from asyncrl.roles.agentic import EpisodeKind
from asyncrl.roles.bounded_stop import cancel_all, cancel_until_done, run_bounded
from asyncrl.roles.context import (
    RoleContext,
    base_url,
    role_arg_parser,
    setup_logging,
    stop_when_over,
    wait_for_rendezvous_async,
)
from asyncrl.roles.generation_servers import GenerationServers
from asyncrl.roles.liveness import RunOver
from asyncrl.roles.periodic_eval import PeriodicEval
from asyncrl.roles.rollout_driver import RolloutDriver
from asyncrl.roles.single_turn import SingleTurnKind
from asyncrl.roles.stop_signal import StopSignal

log = logging.getLogger(__name__)

FIRST_WRITER = "env0"  # the writer that runs the periodic held-out evaluation (`eval.every_steps`)
STOP_WORK_S = 5.0  # how long the writer's work (requests, the evaluation, S3 calls) gets to end once stopped
GC_THRESHOLDS = (10_000, 10, 10)  # CPython's cyclic collector: generation 0 every 10k allocations (default 700)


async def run_environment(ctx: RoleContext) -> None:
    cfg = ctx.cfg
    wait_s = cfg.timeouts.rendezvous_s
    gen_docs = await wait_for_rendezvous_async(ctx.store, ctx.paths, "generation", cfg.generation.num_servers, wait_s)
    reward_docs = await wait_for_rendezvous_async(ctx.store, ctx.paths, "reward", 1, wait_s)
    limits = httpx.Limits(max_connections=1024, max_keepalive_connections=256)
    async with httpx.AsyncClient(limits=limits) as client:
        gens = GenerationServers(ctx, client, gen_docs, cfg.timeouts.http_s)
        reward_s, reward_items = cfg.reward_call
        reward = RewardClient(base_url(reward_docs[0]), client, reward_s, attempts=cfg.rollout.reward_attempts,
                              max_batch_items=reward_items)
        kind = SingleTurnKind if cfg.env is None else AgentKind if cfg.env.agent is not None else EpisodeKind
        driver = RolloutDriver(ctx, gens, reward, kind)
        evaluator = None
        if cfg.eval.every_steps and ctx.role_id == FIRST_WRITER:  # held-out curves: one writer evaluates
            folder = ctx.model_folder()
            evaluator = PeriodicEval(ctx, [base_url(d) for d in gen_docs], load_tokenizer(folder), folder)
        # the start-up's objects (imports, tokenizer, datasets: ~500k) out of the cyclic collector's reach: with
        # thousands of samples in flight, full collections walking them took 18-42% of this process's CPU
        gc.freeze()
        # and collections ~14x rarer: each sample allocates dozens of containers, so with CPython's default (700)
        # the collector ran many times a step; it still took ~9% of the busy event loop on the default job (py-spy,
        # `make bench-control-plane`), 0.5-1.6% with these. Cyclic garbage lingers longer, a few MB at most.
        gc.set_threshold(*GC_THRESHOLDS)
        evaluating = None
        if evaluator is not None:
            await evaluator.point(0)  # the warm start, before any rollout (the trainer cannot step before)
            evaluating = asyncio.create_task(evaluator.run())
        try:
            await driver.run()
        finally:
            if evaluating is not None:
                await cancel_until_done(evaluating, deadline_s=STOP_WORK_S)


async def run_until_over(ctx: RoleContext, signals: StopSignal | None = None) -> RunOver | None:
    """Run the environment writer until it stops at the run's `done` marker (None), until the trainer failed or is
    gone (the `RunOver` that says so), or, with `signals`, until a stop signal (None, the signal noted in
    `signals`); in the last two cases the writer's work is cancelled."""
    signalled = asyncio.Event()
    if signals is not None:
        signals.on_loop(asyncio.get_running_loop(), signalled)
    watch = asyncio.create_task(stop_when_over(ctx, "exit", asyncio.Event()))
    work = asyncio.create_task(run_environment(ctx))
    stopped = asyncio.create_task(signalled.wait())
    finished, _ = await asyncio.wait({watch, work, stopped}, return_when=asyncio.FIRST_COMPLETED)
    if work not in finished and not await cancel_until_done(work, deadline_s=STOP_WORK_S):
        log.warning("the writer's work still runs %.0f s after the stop; exiting without it", STOP_WORK_S)
    await cancel_all([watch, stopped], deadline_s=STOP_WORK_S)
    if work in finished:
        work.result()  # the writer's own error, if any
        return None
    return None if stopped in finished else watch.result()


def run_role(ctx: RoleContext, signals: StopSignal | None = None) -> RunOver | None:
    """`run_until_over` on an event loop of its own whose teardown is bounded as well (`run_bounded`)."""
    return run_bounded(run_until_over(ctx, signals))


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("environment").parse_args(argv)
    setup_logging(args.log_level, "environment", args.id)
    ctx = RoleContext.from_args("environment", args)
    ctx.load_task_data()  # a reasoning_gym or file task: the run's copy of its rows, before any split is read
    signals = StopSignal()
    code = 0
    with ctx.heartbeat() as heartbeat:
        over = run_role(ctx, signals)
        if signals.signum is not None:
            code = signals.finish(ctx.store, ctx.paths, "environment", args.id, heartbeat.stop)
    if code:
        raise SystemExit(code)
    if over is not None and over.exit_code:
        raise SystemExit(f"environment[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
