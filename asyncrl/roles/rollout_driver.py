"""The rollout driver: one environment writer's `RolloutScheduler`, driven with real servers, for any sample kind.

What one *sample* is belongs to a `SampleKind` (below): a scored response to a task prompt
(`asyncrl.roles.single_turn`) or a multi-turn episode against an environment (`asyncrl.roles.agentic`). Everything
else belongs to `RolloutDriver`, whatever the kind:
- the scheduler: built from the run config; after a restart the groups this writer already wrote count toward the
  α bound, new group ids carry the restart, and the groups in flight at the stop are counted as lost
  (`rollout/lost_at_restart_groups`);
- admission: while the scheduler admits, the kind names the next group and the driver offers it;
- turning decisions into work: `Start`, `DropGroup`, `DropSample` go to the kind; `Abort` goes to the generation
  server; `EmitGroup` takes the kind's `Group` and writes it to S3 (`write_group`: the groups that finish together
  share one object, `groups/<writer>/<seq>.parquet`);
- the asyncio tasks the kind starts: tracked, each end wakes the main loop, all cancelled at shutdown;
- following the trainer through `versions/latest.json` (version, and how many of this writer's groups it trained and
  read), and reporting generation servers that came back. A long poll of a generation server's weights version
  (`watch_versions`) says when the trainer has just pushed a new version; the file is then read at once (every
  `HINT_POLL_S` until it shows it), so admission under α starts within milliseconds of the push. The trainer
  publishes the file only after a push, so while that watch is healthy the file is read every `WATCHED_POLL_S` (a
  safety net), else every `POLL_S` (`follow_interval`);
- stats: every `rollout.stats_interval_s` its rollout metrics (aborts, drops, in-flight, per-server busy fraction
  and tokens/s, plus the kind's own) go to `stats/<writer>.json` for the trainer to log; the main loop and shutdown.

Invariants: the scheduler is only ever told what happened through `apply(self.sched.<event>(...))`, so every
decision it returns is performed; a group the kind emits is written before `apply` returns for its `EmitGroup`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from asyncrl.config import RunConfig
from asyncrl.rewards.client import RewardClient
from asyncrl.roles.bounded_stop import cancel_all
from asyncrl.roles.context import RoleContext
from asyncrl.roles.generation_servers import GenerationServers
from asyncrl.rollout.scheduler import (
    Abort,
    Decision,
    DropGroup,
    DropSample,
    EmitGroup,
    RolloutScheduler,
    Start,
)
from asyncrl.rollout.workload import server_rates
from asyncrl.rpc.http import RemoteError
from asyncrl.storage.groups import GroupWriter
from asyncrl.types import Group

ROLE_LOGGER = "asyncrl.roles.environment"  # the environment role's log lines keep this name, whichever module logs
log = logging.getLogger(ROLE_LOGGER)

MAX_GROUPS_PER_OBJECT = 64  # groups written as one S3 object at most (one PUT, one GET, whatever the group count)
POLL_S = 0.1  # how often the writer reads the trainer's versions/latest.json (admission waits for it)
WATCHED_POLL_S = 1.0  # how often while the version watch is healthy (a push is then announced by the watch)
HINT_POLL_S = 0.01  # how often it reads it while a generation server already runs a version latest.json lacks
HINT_WINDOW_S = 2.0  # for at most this long after the hint: past it, POLL_S again (the hint is never trusted alone)
VERSION_WAIT_S = 30.0  # one long poll of a generation server's weights version (GET /weights/version)
DONE_CHECK_S = 1.0  # how often it looks for the run's done marker
SHUTDOWN_TASKS_S = 5.0  # how long the tracked tasks get to end once cancelled at the run's end


def sample_seed(base: int, group_seq: int, sample_index: int, n: int) -> int:
    """The generation seed of one request of sample `sample_index` of this writer's `group_seq`-th group."""
    return (base * 1_000_003 + group_seq * n + sample_index) % (2**31 - 1)


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


class GroupOffer(Protocol):
    """A kind's record of one group it wants admitted: what the scheduler is offered for it."""

    @property
    def prompt_index(self) -> int:
        """The group's prompt as the scheduler and the written `Group` know it (problem index, level seed)."""
        ...

    @property
    def prompt_tokens(self) -> int:
        """The prompt's length in tokens (an estimate where the prompt is only known once the episode starts)."""
        ...


G = TypeVar("G", bound=GroupOffer)


class SampleKind(Protocol[G]):
    """What one sample is. The driver calls these from its event loop; none of them but `close` awaits.

    Contract:
    - `next_group(seq)` returns the record of the group to admit next (`seq`: how many groups this writer admitted
      before it, restarts included); the driver offers it and files it with `admitted(group_id, record)` before
      any decision for that group is applied. The kind keeps the record until `group_for_emit` or `drop_group`.
    - `start(d)` performs a `Start` without awaiting: it either begins the sample's work as a new task (returned;
      the driver tracks it) or hands `d` to the sample's live task (None). Work for a group the kind no longer
      holds does nothing.
    - The kind's tasks report every event to the scheduler through `driver.apply(driver.sched.<event>(...))`, and
      a sample's result is in its group's record before `sample_scored` is reported for it.
    - `drop_group(d)` forgets the group (its running work notices and ends); `drop_sample(d)` ends one sample's
      work if it still runs. Neither is called for a group after `group_for_emit`.
    - `group_for_emit(d)` removes the group's record and returns the `Group` to write: the samples `d.sample_indices`,
      in that order.
    - `local_decisions_first`: True applies a batch's Start/DropGroup/DropSample decisions before its awaited ones
      (Abort, EmitGroup); False applies the batch strictly in order.
    - `skipped_long_prompts`: prompts left out of the stream because they do not fit the context.
    - `extra_metrics()` adds to the published metrics, `extra_stats()` adds documents beside them; `close()`
      releases the kind's resources once every tracked task has ended.
    """

    local_decisions_first: bool
    skipped_long_prompts: int

    def next_group(self, seq: int) -> G: ...

    def admitted(self, group_id: str, record: G) -> None: ...

    def start(self, d: Start) -> asyncio.Task | None: ...

    def drop_group(self, d: DropGroup) -> None: ...

    def drop_sample(self, d: DropSample) -> None: ...

    def group_for_emit(self, d: EmitGroup) -> Group: ...

    def extra_metrics(self) -> dict[str, float]: ...

    def extra_stats(self) -> dict[str, Any]: ...

    async def close(self) -> None: ...


class RolloutDriver:
    """Owns the scheduler, the tracked tasks and the group writer of one environment instance (module docstring).

    `kind` builds the sample kind from the driver, once the scheduler exists; the kind reaches the scheduler, the
    servers and the counters through the driver."""

    def __init__(self, ctx: RoleContext, gens: GenerationServers, reward: RewardClient,
                 kind: Callable[[RolloutDriver], SampleKind[Any]]) -> None:
        cfg: RunConfig = ctx.cfg
        self.ctx, self.cfg, self.gens, self.reward = ctx, cfg, gens, reward
        self.writer = GroupWriter(ctx.store, ctx.paths, ctx.role_id)
        # a restarted writer (the run resumed): its groups already in S3 count toward the α bound, new group ids
        # carry the restart so they never collide with those, and the prompt stream moves on past them
        self.written_before = self.writer.next_seq
        self.sched = RolloutScheduler(cfg.rollout.scheduler_config(len(gens), ctx.role_id,
                                                                   incarnation=self.written_before))
        self.sched.restore_emitted(self.written_before)
        self.lost_at_restart = restart_losses(ctx, self.written_before)
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
        self.version_hint, self._hint_until = 0, 0.0  # the newest version a server reported (`watch_versions`)
        self._watch_seen, self._watch_ok_until = -1, 0.0  # the watched server's last answer; healthy until then
        self._watcher: asyncio.Task | None = None
        self.kind = kind(self)

    # ---- what the kind reports -----------------------------------------------------------------------
    def sample_finished(self, reward: float) -> None:
        """A sample finished with `reward` (for the mean reward in the progress line)."""
        self.samples_done += 1
        self.rewards_sum += reward

    def count_failure(self, where: str, d: Start, err: Exception) -> None:
        """A sample's `where` ("generate", "score") failed with `err`: counted and logged."""
        self.failures[where] = self.failures.get(where, 0) + 1
        log.warning("sample %s %s failed: %s", d.request_id, where, err)

    # ---- decisions -----------------------------------------------------------------------------------
    def track(self, task: asyncio.Task) -> None:
        """Keep `task` (a request or an episode) until it ends; its end wakes the main loop."""
        self.tasks.add(task)
        task.add_done_callback(self._ended)

    def _ended(self, task: asyncio.Task) -> None:
        self.tasks.discard(task)
        self._task_ended.set()

    async def apply(self, decisions: list[Decision]) -> None:
        """Perform the scheduler's `decisions` (in order; see `SampleKind.local_decisions_first`)."""
        awaited: list[Decision] = []
        for d in decisions:
            if isinstance(d, Start):
                task = self.kind.start(d)
                if task is not None:
                    self.track(task)
            elif isinstance(d, DropGroup):
                self.kind.drop_group(d)
            elif isinstance(d, DropSample):
                self.kind.drop_sample(d)
            elif self.kind.local_decisions_first:
                awaited.append(d)
            else:
                await self._perform(d)
        for d in awaited:
            await self._perform(d)

    async def _perform(self, d: Decision) -> None:
        if isinstance(d, Abort):
            if not d.resubmit:
                log.debug("abort %s: %s", d.request_id, d.reason)
            try:
                await self.gens[d.server].abort(d.request_id)
            except RemoteError as err:
                log.warning("abort %s failed: %s", d.request_id, err)
        elif isinstance(d, EmitGroup):
            await self.write_group(self.kind.group_for_emit(d))

    def admit(self) -> list[Decision]:
        decisions: list[Decision] = []
        while self.sched.can_admit():
            record = self.kind.next_group(self.sched.stats.admitted)
            out = self.sched.offer_prompt(record.prompt_index, record.prompt_tokens)
            self.kind.admitted(out[0].group_id, record)  # type: ignore[union-attr]
            decisions += out
        return decisions

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
            "rollout/aborted_stale_groups": s.aborted_stale_groups, "rollout/aborted_samples": s.samples_aborted,
            "rollout/aborted_failed_groups": s.aborted_failed_groups,
            "rollout/aborted_redundant_groups": s.aborted_surpassed_groups,
            "rollout/filtered_groups": s.filtered_groups, "rollout/refill_exhausted_groups": s.refill_exhausted_groups,
            "rollout/dropped_samples": s.samples_dropped, "rollout/failed_samples": s.samples_failed,
            "rollout/resubmits": s.resubmits, "rollout/requests_in_flight": counts["running_requests"],
            "rollout/live_groups": counts["live_groups"], "rollout/version": self.sched.version,
            "rollout/reward_retries": self.reward.retries,
            # calls and what they carried: items / calls is the mean batch size of each kind of call
            "rollout/reward_calls": self.reward.calls, "rollout/reward_items": self.reward.items,
            "rollout/generate_calls": sum(g.batch_calls for g in self.gens),
            "rollout/generate_requests": sum(g.requests for g in self.gens),
            # this writer's S3 requests (every attempt), and the GETs among them that found nothing
            "rollout/s3_requests": self.ctx.store.stats.requests_total(),
            "rollout/s3_get_missing": self.ctx.store.stats.missing_gets(),
            "rollout/score_failed_samples": self.failures.get("score", 0),
            "rollout/lost_requests": s.requests_lost, "rollout/lost_servers": s.servers_lost,
            "rollout/returned_servers": s.servers_returned, "rollout/down_servers": len(self.sched.servers_down),
            "rollout/skipped_long_prompts": self.kind.skipped_long_prompts,
        }
        if self._health is not None:
            for i, rates in enumerate(server_rates(self._health, health)):
                for k, v in rates.items():
                    metrics[f"rollout/server{i}/{k}"] = v
        for i, n in enumerate(self.sched.server_requests):
            metrics[f"rollout/server{i}/requests_in_flight"] = n
        metrics["rollout/replaced_samples"] = float(s.samples_replaced)
        metrics.update(self.kind.extra_metrics())
        self._health = health
        doc = {"writer": self.ctx.role_id, "time": time.time(), "metrics": metrics, **self.kind.extra_stats()}
        await asyncio.to_thread(self.ctx.store.put_json, self.ctx.paths.rollout_stats(self.ctx.role_id), doc)
        return metrics

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

    def hinted(self, now: float) -> bool:
        """Whether a generation server runs a version newer than the trainer's latest.json showed, recently enough
        that latest.json should show it any moment."""
        return self.version_hint > self.sched.version and now < self._hint_until

    def follow_interval(self, now: float) -> float:
        """Seconds between reads of latest.json: `HINT_POLL_S` while hinted; `WATCHED_POLL_S` while the watch's long
        poll opened within `VERSION_WAIT_S` + 5 s and its server is not behind the file (a server left out of the
        weight group would never announce a push); else `POLL_S`."""
        if self.hinted(now):
            return HINT_POLL_S
        if now < self._watch_ok_until and self._watch_seen >= self.sched.version:
            return WATCHED_POLL_S
        return POLL_S

    async def watch_versions(self) -> None:
        """Long-poll a live generation server's weights version; a version above the writer's wakes the main loop
        (`hinted`). A server that fails the call is left for a second and the next live one asked. Nothing is
        decided on the hint: admission still follows latest.json alone."""
        turn = 0
        while True:
            live = [i for i in range(len(self.gens)) if i not in self.sched.servers_down]
            if not live:  # nothing to watch: not healthy, the file is read every POLL_S
                self._watch_ok_until = 0.0
                await asyncio.sleep(1.0)
                continue
            server = live[turn % len(live)]
            self._watch_ok_until = time.monotonic() + VERSION_WAIT_S + 5.0
            try:
                version = await self.gens[server].wait_version(max(self.sched.version, self.version_hint),
                                                               VERSION_WAIT_S)
            except RemoteError as err:
                log.debug("version watch of server %d: %s", server, err)
                self._watch_ok_until, self._watch_seen = 0.0, -1
                turn += 1
                await asyncio.sleep(1.0)
                continue
            self._watch_seen = version
            if version > max(self.sched.version, self.version_hint):
                self.version_hint, self._hint_until = version, time.monotonic() + HINT_WINDOW_S
                self._task_ended.set()

    async def run(self) -> None:
        interval = self.cfg.rollout.stats_interval_s
        last_stats = time.monotonic()
        await self.publish_stats()
        self._watcher = asyncio.create_task(self.watch_versions(), name="version-watch")
        last_done_check = last_follow = float("-inf")
        while True:
            # the loop wakes whenever a tracked task ends or a server reports a new version; the S3 reads it makes
            # are paced by time, not by requests
            now = time.monotonic()
            if now - last_done_check >= DONE_CHECK_S:
                last_done_check = now
                if await asyncio.to_thread(self.ctx.is_done):
                    break
            if now - last_follow >= self.follow_interval(now):
                last_follow = now
                await self.follow_trainer()
            for server in await self.gens.returned(self.sched.servers_down, self.sched.min_trainable_version()):
                await self.apply(self.sched.server_returned(server))
            await self.apply(self.admit())
            with contextlib.suppress(TimeoutError):  # not wait_for: Python 3.11's drops a cancel meeting a set event
                async with asyncio.timeout(HINT_POLL_S if self.hinted(time.monotonic()) else POLL_S):
                    await self._task_ended.wait()
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
        watcher = [self._watcher] if self._watcher is not None else []
        if left := await cancel_all([*watcher, *self.tasks], deadline_s=SHUTDOWN_TASKS_S):
            log.warning("%d tasks still running %.0f s after cancelled; stopping without them", len(left), SHUTDOWN_TASKS_S)
        log.info("stopped: admitted %d, wrote %d groups", self.sched.stats.admitted, self.written)
        await self.kind.close()
