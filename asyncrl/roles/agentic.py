"""The episode sample kind: on an agentic task one sample is a multi-turn episode against an environment.

`EpisodeKind` is what one sample is for the `RolloutDriver` (which owns admission under α, routing, redundancy,
staleness, group writing, stats and the loop): an episode of turns. Each episode is its own asyncio task:
reset the environment (through `EnvExecutor`: off the event loop, with a per-call deadline and a per-environment
concurrency limit), then repeat: generate one turn on the server the scheduler chose, step the environment with the
decoded reply, render the observation with the model's chat template (`ChatFormat`) and ask the scheduler for the
next turn's server. While an episode waits for its environment it holds no generation request: the servers keep
decoding other episodes (environment-level asynchrony).

Level seeds: a group is one level; all its samples play it. Train levels are 1,000,000 + k (k counts this writer's
groups, offset per writer); the held-out levels 0..env.num_eval-1 are never trained on.

Faults: an environment call that raises, returns garbage or misses its deadline ends the episode as failed (counted
by kind, logged with the reason); the scheduler replaces it within its group (`rollout.replace_failed`) or aborts the
group, and admission replaces the group. A failed episode never reaches a written group. `ProgressWatch` reports
episodes without progress for `env.hang_report_s`.

Invariants:
- at most one task per (group, sample): a `Start` for a live episode (its next turn, or the re-sent continuation of
  its turn) is queued on that episode (`_Episode.starts`), never started as a second task;
- a level's record (`EpisodeLevel`) exists from admission until `group_for_emit` or `drop_group`; dropping a group or a
  sample cancels its episodes (except the one that is calling: it sees its group gone and returns);
- an episode's sample is stored in its level before `sample_scored` is reported; its environment is closed when its
  task ends, however it ends;
- the decisions of one batch that need no await (starts, drops, cancels) are applied before the awaited ones
  (aborts, the S3 write of an emitted group): episodes are cancelled, and next turns queued, before anything awaits.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass, field
from typing import Any

from asyncrl.envs.execution import EnvExecutor, EnvFault, EnvHandle
from asyncrl.envs.hang import ProgressWatch
from asyncrl.models.chat import ChatFormat
from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.roles.context import instance_index
from asyncrl.roles.generation_servers import log_lost
from asyncrl.roles.rollout_driver import RolloutDriver, sample_seed
from asyncrl.rollout.multiturn import MultiTurnTrajectory
from asyncrl.rollout.scheduler import DropGroup, DropSample, EmitGroup, Start
from asyncrl.rpc.http import RemoteError
from asyncrl.types import Group, Sample

log = logging.getLogger(__name__)

TRAIN_SEED_BASE = 1_000_000
WRITER_SEED_STRIDE = 10_000_000
MAX_FAILED_LISTED = 1000


def train_level_seed(env_seed: int, writer_index: int, k: int) -> int:
    """The k-th training level of a writer: never one of the held-out seeds 0..num_eval-1."""
    return TRAIN_SEED_BASE + env_seed * 100_003 + writer_index * WRITER_SEED_STRIDE + k


def injection_key(group_seq: int, sample_index: int) -> int:
    return group_seq * 4099 + sample_index


@dataclass
class EpisodeLevel:
    """One admitted group: the level all its episodes play, and its finished samples."""

    seed: int
    seq: int
    prompt_tokens: int  # the prompt length offered at admission (an estimate: the last episode's first prompt)
    samples: dict[int, Sample] = field(default_factory=dict)

    @property
    def prompt_index(self) -> int:
        return self.seed


@dataclass
class _Episode:
    task: asyncio.Task | None = None
    starts: list[Start] = field(default_factory=list)  # the scheduler's next Start for this episode, if any


class LevelEpisodes:
    """The level records and live episode tasks of a multi-turn sample kind, and the decisions that only touch them
    (shared by `EpisodeKind` and the agent kind, `asyncrl.roles.agent_episodes.AgentKind`). A subclass sets
    `env_cfg`, `writer_index`, `prompt_estimate` and `task_name` and keeps `episodes[key].task` up to date."""

    env_cfg: Any
    writer_index: int
    prompt_estimate: int
    task_name: str

    def __init__(self) -> None:
        self.levels: dict[str, EpisodeLevel] = {}
        self.episodes: dict[tuple[str, int], Any] = {}

    def next_group(self, seq: int) -> EpisodeLevel:
        return EpisodeLevel(train_level_seed(self.env_cfg.seed, self.writer_index, seq), seq, self.prompt_estimate)

    def admitted(self, group_id: str, record: EpisodeLevel) -> None:
        self.levels[group_id] = record

    def drop_group(self, d: DropGroup) -> None:
        self.levels.pop(d.group_id, None)
        self._cancel(lambda key, gid=d.group_id: key[0] == gid)

    def drop_sample(self, d: DropSample) -> None:
        self._cancel(lambda key, d=d: key == (d.group_id, d.sample_index))

    def _cancel(self, match: Any) -> None:
        """Cancel the episodes `match` selects, except the calling one (it sees its group gone and returns)."""
        me = asyncio.current_task()
        for key, ep in list(self.episodes.items()):
            if match(key) and ep.task is not None and ep.task is not me:
                ep.task.cancel()

    def group_for_emit(self, d: EmitGroup) -> Group:
        level = self.levels.pop(d.group_id)
        return Group(d.group_id, level.seed, self.task_name, [level.samples[i] for i in d.sample_indices])


class EpisodeKind(LevelEpisodes):
    """The `SampleKind` of an agentic task (see the module docstring)."""

    local_decisions_first = True  # cancel and queue episodes before awaiting an abort or a group's S3 write
    skipped_long_prompts = 0  # an episode's prompt is rendered from its environment, never skipped

    def __init__(self, driver: RolloutDriver) -> None:
        cfg = driver.cfg
        env = cfg.env
        assert env is not None
        super().__init__()
        self.driver, self.cfg, self.sched, self.gens, self.env_cfg = driver, cfg, driver.sched, driver.gens, env
        self.task_name = env.name
        self.tokenizer = load_tokenizer(driver.ctx.model_folder())
        self.eos_id = int(self.tokenizer.eos_token_id)
        self.chat = ChatFormat(self.tokenizer)
        self.executor = EnvExecutor(env.executor, env.max_concurrent_steps, env.step_timeout_s)
        self.watch = ProgressWatch(env.hang_report_s)
        self.writer_index = instance_index(driver.ctx.role_id)
        self.prompt_estimate = 64
        self.env_faults: dict[str, int] = {}
        self.failed_episodes: list[str] = []  # "<group>/<sample>: <reason>", the first MAX_FAILED_LISTED
        self.episodes_finished = self.successes = self.turns_total = self.stalled_reports = 0

    # ---- admission and decisions ---------------------------------------------------------------------
    def start(self, d: Start) -> asyncio.Task | None:
        key = (d.group_id, d.sample_index)
        ep = self.episodes.get(key)
        if ep is not None:  # the next turn, or a re-sent continuation, of a live episode
            ep.starts.append(d)
            return None
        if d.group_id not in self.levels:
            return None
        ep = self.episodes[key] = _Episode()
        ep.task = asyncio.create_task(self.run_episode(d))
        return ep.task

    # ---- one episode ---------------------------------------------------------------------------------
    async def run_episode(self, first: Start) -> None:
        gid, idx = first.group_id, first.sample_index
        key = (gid, idx)
        level = self.levels.get(gid)
        handle: EnvHandle | None = None
        try:
            if level is None:
                return
            env = self.env_cfg
            self.watch.touch(key, "reset")
            handle = await self.executor.open(env.name, env.params, env.injection, injection_key(level.seq, idx))
            observation, _ = await handle.reset(level.seed)
            traj = MultiTurnTrajectory(self.chat.prompt_ids(observation, env.system_prompt))
            self.prompt_estimate = len(traj.prompt_ids)
            start: Start | None = first
            turn = 0
            while start is not None:
                self.watch.touch(key, f"generate turn {turn}")
                aborted = await self._generate(start, level, traj, turn)
                start = None
                ep = self.episodes.get(key)
                if aborted or gid not in self.levels or ep is None:
                    start = ep.starts.pop(0) if ep is not None and ep.starts else None
                    continue  # a re-sent continuation of this turn, or the end (failed / group gone)
                self.watch.touch(key, f"env step {turn}")
                result = await handle.step(self.tokenizer.decode(traj.current_turn_ids(), skip_special_tokens=True))
                turn += 1
                room = self.cfg.generation.max_model_len - len(traj.context_ids) - self.cfg.rollout.max_new_tokens
                if result.done or turn >= env.max_turns or gid not in self.levels:
                    traj.end_turn(result.reward)
                    await self._finish(gid, idx, traj, result.info, "stop" if result.terminated else "length")
                    return
                between = self.chat.between_turns_ids(traj.current_turn_ids(), result.observation)
                if len(between) > room:  # the next observation does not fit the context: truncated here
                    traj.end_turn(result.reward)
                    await self._finish(gid, idx, traj, result.info, "length")
                    return
                traj.end_turn(result.reward, between)
                await self.driver.apply(self.sched.env_stepped(gid, idx, len(between), done=False))
                ep = self.episodes.get(key)
                start = ep.starts.pop(0) if ep is not None and ep.starts else None
        except EnvFault as fault:
            self.env_faults[fault.kind] = self.env_faults.get(fault.kind, 0) + 1
            log.warning("episode %s/%d failed in its environment: %s", gid, idx, fault)
            if len(self.failed_episodes) < MAX_FAILED_LISTED:
                self.failed_episodes.append(f"{gid}/{idx}: {fault}")
            await self.driver.apply(self.sched.env_failed(gid, idx))
        except RemoteError as err:
            self.driver.count_failure("generate", first, err)
            if len(self.failed_episodes) < MAX_FAILED_LISTED:
                self.failed_episodes.append(f"{gid}/{idx}: generate: {err}")
            await self.driver.apply(self.sched.sample_failed(gid, idx))
        except Exception as err:  # noqa: BLE001 - a bug or a bad setting must fail the episode, not hang its group
            log.exception("episode %s/%d failed: %s", gid, idx, err)
            if len(self.failed_episodes) < MAX_FAILED_LISTED:
                self.failed_episodes.append(f"{gid}/{idx}: internal: {err}")
            await self.driver.apply(self.sched.sample_failed(gid, idx))
        finally:
            self.episodes.pop(key, None)
            self.watch.forget(key)
            if handle is not None:
                await handle.close()

    async def _generate(self, d: Start, level: EpisodeLevel, traj: MultiTurnTrajectory, turn: int) -> bool:
        """One request of the open turn; True when it was aborted (the scheduler decides what follows)."""
        ro = self.cfg.rollout
        done_in_turn = len(traj.current_turn_ids()) if traj.turn_open else 0
        budget = min(ro.max_new_tokens - done_in_turn,
                     self.cfg.generation.max_model_len - len(traj.context_ids))
        if budget <= 0:
            raise RemoteError(f"episode {d.group_id}/{d.sample_index}: no token budget left in the context")
        try:
            out = await self.gens[d.server].generate(
                d.request_id, traj.context_ids, max_tokens=budget, temperature=ro.temperature, top_p=ro.top_p,
                seed=sample_seed(self.cfg.generation.seed + 1009 * d.turn, level.seq, d.sample_index,
                                 ro.samples_per_prompt),
                stop_token_ids=[self.eos_id], timeout_s=ro.request_timeout_s, min_version=d.start_version)
        except RemoteError as err:
            if not err.server_unavailable:
                raise
            log_lost(d, err)  # re-sent elsewhere: the scheduler's Start continues this turn
            await self.driver.apply(self.sched.request_lost(d.group_id, d.sample_index))
            while self.sched.is_parked(d.group_id, d.sample_index):  # every server is down: wait for one back
                await asyncio.sleep(0.2)
            return True
        traj.add_generated(out.token_ids, out.logprobs, out.token_versions, out.start_version)
        aborted = out.finish_reason == "abort"
        if not aborted and not out.token_ids:
            raise RemoteError(f"episode {d.group_id}/{d.sample_index}: the server returned no token")
        await self.driver.apply(self.sched.request_finished(d.group_id, d.sample_index, len(out.token_ids), aborted))
        return aborted

    async def _finish(self, gid: str, idx: int, traj: MultiTurnTrajectory, info: dict[str, Any],
                      finish_reason: str) -> None:
        level = self.levels.get(gid)
        if level is None:
            return
        sample = traj.to_sample(gid, idx, finish_reason)
        level.samples[idx] = sample
        self.episodes_finished += 1
        self.successes += int(bool(info.get("success", False)))
        self.turns_total += traj.num_turns
        self.driver.sample_finished(sample.reward)
        await self.driver.apply(self.sched.env_stepped(gid, idx, 0, done=True))
        await self.driver.apply(self.sched.sample_scored(gid, idx, sample.reward))

    # ---- metrics and shutdown ------------------------------------------------------------------------
    def extra_stats(self) -> dict[str, Any]:
        return {"failed_episodes": list(self.failed_episodes)}

    def extra_metrics(self) -> dict[str, float]:
        for key, idle, what in self.watch.stalled():
            self.stalled_reports += 1
            log.warning("episode %s/%d: no progress for %.0f s (waiting for %s)", key[0], key[1], idle, what)
        n = max(1, self.episodes_finished)
        metrics = {"env/episodes": float(self.episodes_finished),
                   "env/success_rate": self.successes / n, "env/mean_turns": self.turns_total / n,
                   "env/stalled_reports": float(self.stalled_reports),
                   "env/faults": float(sum(self.env_faults.values()))}
        metrics.update({f"env/faults_{k}": float(v) for k, v in sorted(self.env_faults.items())})
        return metrics

    async def close(self) -> None:
        """Close the environment executor (every episode task has ended: the driver cancelled and awaited them)."""
        await self.executor.aclose()
        log.info("episodes finished %d, success %d, environment faults %s", self.episodes_finished,
                 self.successes, self.env_faults or "none")
