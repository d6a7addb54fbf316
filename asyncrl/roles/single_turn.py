"""The single-turn sample kind: one sample is one response to a task prompt, scored by the reward role.

Owns (for the `RolloutDriver`, which owns the scheduler, the writing and the loop):
- the prompt stream: the train split's prompts that fit the context (`prompts_that_fit`; the others are skipped and
  counted), reshuffled every epoch, deterministic per writer; a restarted writer moves on past the groups it wrote;
- the requests of each sample: one, or several with `partial_rollout: resubmit` (a request aborted for a weight
  update is re-sent with its partial tokens appended), each with its own seed and the sample's decode budget
  (`rollout.length_tail`);
- scoring: each finished sample is scored at once through the reward role, then `rollout.overlong` applies to it
  (`asyncrl.rollout.overlong`: a truncated sample's loss mask zeroed, or the soft length penalty added to the reward)
  before the scheduler sees its reward; the multi-turn path (`asyncrl.roles.agentic`) does not apply it; each scored
  sample's details are counted (`asyncrl.rewards.components`: `reward/correct`, `reward/format` in the metrics);
- the samples of each live group, until the driver emits or drops it.

Invariants:
- a group's record (`_Pending`) exists from admission until `group_for_emit` or `drop_group`; a request whose group
  is gone does nothing, and a sample whose group went while it decoded is not scored;
- a sample is scored only after its last request finished without an abort, and it is stored in its group's record
  before `sample_scored` is reported, so an `EmitGroup` finds every kept sample;
- a failed request or score is reported (`sample_failed`), never turned into a default reward; a server that did not
  answer is reported as lost (`request_lost`: the scheduler re-sends the request elsewhere).
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.generation.client import Generated
from asyncrl.models.prompts import prompt_format, stop_token_ids
from asyncrl.models.tokenizer import decode_response, load_tokenizer
from asyncrl.rewards.components import RewardComponents
from asyncrl.roles.context import instance_index
from asyncrl.roles.generation_servers import log_lost
from asyncrl.roles.rollout_driver import ROLE_LOGGER, RolloutDriver, sample_seed
from asyncrl.rollout.overlong import OverlongShaper
from asyncrl.rollout.scheduler import DropGroup, DropSample, EmitGroup, Start
from asyncrl.rollout.workload import decode_budget, loss_mask_to_first_eos
from asyncrl.rpc.http import RemoteError
from asyncrl.tasks.arithmetic import Problem
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.prompt_fit import prompts_that_fit
from asyncrl.types import Group, Sample

log = logging.getLogger(ROLE_LOGGER)


def prompt_stream(num_problems: int, seed: int) -> Iterator[int]:
    """Problem indices, reshuffled every epoch, deterministic for a seed."""
    rng = random.Random(seed)
    epoch = list(range(num_problems))
    while True:
        rng.shuffle(epoch)
        yield from epoch


def sample_budget(cfg: RunConfig, seq: int, sample_index: int) -> int:
    """How many tokens sample `sample_index` of this writer's `seq`-th group decodes at most: `max_new_tokens`, or
    its draw from `rollout.length_tail`."""
    ro = cfg.rollout
    if ro.length_tail is None:
        return ro.max_new_tokens
    seed = sample_seed(cfg.generation.seed + 17, seq, sample_index, ro.samples_per_prompt)
    return decode_budget(seed, ro.length_tail.median_tokens, ro.length_tail.sigma, ro.max_new_tokens)


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
    """One admitted group: its prompt, its samples' trajectories, and its scored samples."""

    problem: Problem
    prompt_ids: list[int]
    seq: int
    trajectories: dict[int, _Trajectory] = field(default_factory=dict)
    samples: dict[int, Sample] = field(default_factory=dict)

    @property
    def prompt_index(self) -> int:
        return self.problem.index

    @property
    def prompt_tokens(self) -> int:
        return len(self.prompt_ids)


class SingleTurnKind:
    """The `SampleKind` of a single-turn task (see the module docstring)."""

    local_decisions_first = False  # today's order: every decision performed as it comes

    def __init__(self, driver: RolloutDriver) -> None:
        cfg = driver.cfg
        self.driver, self.cfg, self.sched, self.gens = driver, cfg, driver.sched, driver.gens
        self.problems = load_split(cfg.task, "train")
        folder = driver.ctx.model_folder()
        self.tokenizer = load_tokenizer(folder)
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.prompt_format = prompt_format(cfg, self.tokenizer)
        self.stop_ids = stop_token_ids(self.tokenizer, folder, chat=self.prompt_format.format == "chat")
        self.problems, self.skipped_long_prompts = prompts_that_fit(cfg, self.tokenizer, self.problems)
        self.prompts = prompt_stream(len(self.problems), cfg.task.seed + 7919 * instance_index(driver.ctx.role_id))
        ro = cfg.rollout
        self.overlong = OverlongShaper(ro.overlong, ro.max_new_tokens, ro.overlong_cache_tokens)
        self.components = RewardComponents()  # the reward role's details of each scored sample, counted
        for _ in range(driver.written_before):
            next(self.prompts)
        self.pending: dict[str, _Pending] = {}

    # ---- admission and decisions ---------------------------------------------------------------------
    def next_group(self, seq: int) -> _Pending:
        problem = self.problems[next(self.prompts)]
        return _Pending(problem, self.prompt_format.ids(problem.prompt), seq)

    def admitted(self, group_id: str, record: _Pending) -> None:
        self.pending[group_id] = record
        log.debug("admitted %s (version %d)", group_id, self.sched.version)

    def start(self, d: Start) -> asyncio.Task:
        return asyncio.create_task(self.run_request(d))

    def drop_group(self, d: DropGroup) -> None:
        self.pending.pop(d.group_id, None)

    def drop_sample(self, d: DropSample) -> None:
        """Nothing runs for a dropped sample: its request already finished (or was aborted by the scheduler)."""

    def group_for_emit(self, d: EmitGroup) -> Group:
        pending = self.pending.pop(d.group_id)
        return Group(d.group_id, pending.problem.index, self.cfg.task.name,
                     [pending.samples[i] for i in d.sample_indices])

    # ---- one request ---------------------------------------------------------------------------------
    async def run_request(self, d: Start) -> None:
        """One request of one sample: generate, then (when the sample is complete) score it."""
        pending = self.pending.get(d.group_id)
        if pending is None:
            return
        ro = self.cfg.rollout
        traj = pending.trajectories.setdefault(
            d.sample_index, _Trajectory(sample_budget(self.cfg, pending.seq, d.sample_index)))
        remaining = traj.budget - len(traj.token_ids)
        ended = ro.length_tail is None and any(t in self.stop_ids for t in traj.token_ids[-1:])
        try:
            if remaining > 0 and not ended:
                out = await self.gens[d.server].generate(
                    d.request_id, pending.prompt_ids + traj.token_ids, max_tokens=remaining,
                    temperature=ro.temperature, top_p=ro.top_p,
                    seed=sample_seed(self.cfg.generation.seed + 1009 * d.turn, pending.seq, d.sample_index,
                                     ro.samples_per_prompt),
                    stop_token_ids=[] if ro.length_tail else self.stop_ids, ignore_eos=ro.length_tail is not None,
                    timeout_s=ro.request_timeout_s, min_version=d.start_version,
                )
            else:  # a resubmit raced the end of the request: nothing left to decode
                out = Generated([], [], [], traj.finish_reason if ended else "length", traj.start_version or 0)
        except RemoteError as err:
            if err.server_unavailable:  # the server is gone or cannot serve: re-send the request elsewhere
                log_lost(d, err)
                await self.driver.apply(self.sched.request_lost(d.group_id, d.sample_index))
                return
            self.driver.count_failure("generate", d, err)
            await self.driver.apply(self.sched.sample_failed(d.group_id, d.sample_index))
            return
        traj.extend(out)
        aborted = out.finish_reason == "abort"
        await self.driver.apply(self.sched.request_finished(d.group_id, d.sample_index, len(out.token_ids), aborted))
        if not aborted and d.group_id in self.pending:
            await self.score(d, pending, traj)

    async def score(self, d: Start, pending: _Pending, traj: _Trajectory) -> None:
        text = decode_response(self.tokenizer, traj.token_ids)
        try:
            reward, details = await self.driver.reward.score(self.cfg.task.name, pending.problem.prompt, text,
                                                             {"answer": pending.problem.answer})
            sample = Sample(
                group_id=d.group_id, sample_index=d.sample_index, prompt_token_ids=pending.prompt_ids,
                token_ids=traj.token_ids, logprobs=traj.logprobs, token_versions=traj.versions,
                start_version=traj.start_version if traj.start_version is not None else d.start_version,
                reward=reward, finish_reason=traj.finish_reason,
                loss_mask=loss_mask_to_first_eos(traj.token_ids, self.eos_id) if self.cfg.rollout.length_tail else None,
            )
            sample.validate()
            reward = self.overlong.apply(sample)  # rollout.overlong: its reward and loss mask, in place
        except (RemoteError, ValueError) as err:
            self.driver.count_failure("score", d, err)
            await self.driver.apply(self.sched.sample_failed(d.group_id, d.sample_index))
            return
        pending.samples[d.sample_index] = sample
        self.driver.sample_finished(reward)
        self.components.add(details)  # reward/correct, reward/format in this writer's rollout metrics
        await self.driver.apply(self.sched.sample_scored(d.group_id, d.sample_index, reward))

    # ---- metrics and shutdown ------------------------------------------------------------------------
    def extra_metrics(self) -> dict[str, float]:
        return {**self.overlong.metrics(), **self.components.metrics()}

    def extra_stats(self) -> dict[str, Any]:
        return {}

    async def close(self) -> None:
        """Nothing to release: the driver cancelled every request task."""
