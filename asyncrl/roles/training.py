"""The training role: reads groups from S3 in order, filters stale ones, trains, bumps the version, syncs weights.

One training step k (version k → k+1):
1. wait: take groups per writer in sequence order (per-writer cursors) until B fresh groups are in hand; a group
   with start_version < k − α (judged when taken) is dropped and counted (docs/algorithms.md §1), never trained on. A
   background thread reads ahead (`asyncrl.storage.group_prefetch`): up to B groups, during the other phases too;
   a group only read ahead is not consumed: neither in the published `consumed` counts nor in checkpoint cursors;
2. train (`Learner`): GRPO advantages, or GAE on the critics' values (AsyPPO: mini-critics and their masks), the
   critics' update, and the configured policy loss with the engine's behaviour log-probs, one optimizer step
   (DeepSpeed; attention credit rescales advantages inside it);
3. sync: broadcast the new weights in buckets to the generation servers of the weight group (they pause, load,
   resume); a lost server leaves the group and a restarted one joins it (`asyncrl.roles.weight_group`);
4. publish `versions/latest.json` (version, per-writer consumed counts, the weights' checksum at checkpoints and
   the last step, metrics), log to MLflow, and
   every `checkpoint_every` steps write a checkpoint (model, optimizer, cursors; `COMMITTED` last).
On start it resumes from the newest committed checkpoint, if any. At the end it writes the run's `done` marker.

Data parallel (`training.num_processes` = W > 1, one rank per GPU of the pod, or CPU processes): the same entrypoint
under torchrun. Rank 0 (the leader) alone reads S3 groups, runs the critic phase, publishes, logs to MLflow,
checkpoints and pushes weights; every rank runs the actor update on its share. The followers run `follow()`: they
obey the leader's commands on the control channel (`asyncrl.training.distributed`):
- "resume" (step = the checkpoint version, −1 for none): load that checkpoint from S3 (collective under ZeRO-3);
- "step": the actor update (`Learner.follow_step`), then the same collective call as the leader: the full weights
  (gathered for the push);
- "checkpoint" (sent after the push, which may take long): optimizer then model state, as the leader saves them;
- "stop": exit (the leader sends it at the end, and tries to when it fails between steps).
Each command says how long the followers may wait for the next one (`next_wait_s`); a missed deadline is an error.

Run: `python -m asyncrl.roles.training --run-url s3://bucket/prefix/run_id`, or
`torchrun --standalone --nnodes 1 --nproc-per-node W -m asyncrl.roles.training --run-url ... --id 0`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time
from typing import Any

import torch

from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.roles.context import RoleContext, role_arg_parser, setup_logging
from asyncrl.roles.role_metrics import read_role_metrics
from asyncrl.roles.step_reporter import StepReporter
from asyncrl.roles.weight_group import WeightGroup
from asyncrl.storage.checkpoints import (
    flatten_optimizer_state,
    latest_committed_version,
    load_checkpoint,
    load_checkpoint_tensors,
    save_checkpoint,
    unflatten_optimizer_state,
)
from asyncrl.storage.group_prefetch import GroupPrefetcher
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.training.batch import build_batch
from asyncrl.training.distributed import Command
from asyncrl.training.learner import Learner
from asyncrl.training.process_group import launcher_world_size
from asyncrl.training.staleness import split_stale, staleness_histogram, staleness_stats
from asyncrl.types import Group
from asyncrl.weights.sync import weights_checksum

log = logging.getLogger(__name__)

# MLflow gets the steps at most once a second, several per call: one database commit per call, not per step (a
# commit per step cost ~10 % of a core on a 2-core machine at ~2 steps/s). The last step is logged at once.
REPORT_EVERY_S = 1.0


class Counters:
    """Run-wide totals, saved in checkpoints so a resumed run reports the whole run."""

    def __init__(self, d: dict[str, Any] | None = None) -> None:
        d = d or {}
        self.groups_trained = int(d.get("groups_trained", 0))
        self.samples_trained = int(d.get("samples_trained", 0))
        self.groups_dropped_stale = int(d.get("groups_dropped_stale", 0))
        # objects the reader moved aside or skipped in earlier attempts of the run (a resume starts a new reader)
        self.quarantined_objects = int(d.get("quarantined_objects", 0))
        # the groups those objects held (an object may hold several; runs before that: one each)
        self.quarantined_groups = int(d.get("quarantined_groups", self.quarantined_objects))
        self.gaps_skipped = int(d.get("gaps_skipped", 0))
        self.samples_dropped_stale = int(d.get("samples_dropped_stale", 0))
        self.staleness_sum = float(d.get("staleness_sum", 0.0))
        self.staleness_max = int(d.get("staleness_max", 0))
        self.train_wall_s = float(d.get("train_wall_s", 0.0))
        # steady state: every step but the first of a (re)start, whose wait includes filling the rollout pipeline
        self.steady_steps = int(d.get("steady_steps", 0))
        self.steady_samples = int(d.get("steady_samples", 0))
        self.steady_wall_s = float(d.get("steady_wall_s", 0.0))
        # per writer: groups trained in completed steps (the rollout scheduler's admission slots, see scheduler.py)
        self.trained_by_writer: dict[str, int] = {str(k): int(v) for k, v in d.get("trained_by_writer", {}).items()}

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


def check_world_size(num_processes: int, world_size: int) -> None:
    """The launcher's WORLD_SIZE must be the configured number of training ranks."""
    if world_size != num_processes:
        raise ValueError(f"training.num_processes is {num_processes} but the launcher started {world_size} rank(s) "
                         f"(WORLD_SIZE={world_size}): start the role under `torchrun --nproc-per-node "
                         f"{num_processes}` (a lone process when it is 1)")


class TrainingRunner:
    def __init__(self, ctx: RoleContext) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        check_world_size(self.cfg.training.num_processes, launcher_world_size())
        t = self.cfg.timeouts
        # the followers' waits for the leader's next command (see the module docstring): a step's batch, plus its
        # weight push, which may re-form the generation group (a failed push, a join of up to 2 deadlines, the push
        # again) or wait for a generation server to answer
        push_s = 4 * t.collective_s + 60.0
        self.step_wait_s = t.batch_wait_s + push_s + t.rendezvous_s
        self.start_wait_s = t.rendezvous_s + t.batch_wait_s + push_s
        self.model_path = ctx.model_folder()
        self.pad_id = int(load_tokenizer(self.model_path).pad_token_id)
        self.learner = Learner(self.model_path, self.cfg.training, timeout_s=t.collective_s,
                               control_timeout_s=self.start_wait_s)
        self.policy = self.learner.policy
        self.channel = self.policy.channel
        self.is_leader = self.policy.is_leader
        self.tracker: Tracker | None = None
        self.reporter: StepReporter | None = None  # the leader's, started by `lead`
        tracking = ctx.store.get_json(ctx.paths.tracking()) if self.is_leader else None
        if tracking:
            self.tracker = Tracker.attach(tracking["tracking_uri"], tracking["mlflow_run_id"])
        # the leader's read-ahead (started by `lead`); from then on its reader is the prefetch thread's alone
        self.groups = GroupPrefetcher.for_run(ctx.store, ctx.paths, self.cfg.rollout.num_writers,
                                              self.cfg.rollout.prompts_per_step, self.cfg.timeouts.group_gap_wait_s)
        self.reader = self.groups.reader
        self._followers_idle = False  # the followers wait for a command: a "stop" cannot cross another collective
        self.version = 0
        self.counters = Counters()
        self.weights = WeightGroup(ctx, self.policy.device)
        self.checksum: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.first_step = 0

    # ---- start ---------------------------------------------------------------------------------------
    def _command(self, command: str, step: int, next_wait_s: float) -> None:
        """Leader: send a tensor-less command to the followers (nothing with W = 1)."""
        if self.channel is not None:
            self._followers_idle = False
            self.channel.send(Command(command, step, {"next_wait_s": next_wait_s}), None, self.cfg.timeouts.collective_s)

    def _load_policy_state(self, v: int) -> dict[str, Any]:
        """Every rank: load checkpoint `v`'s model and optimizer into the actor (collective under ZeRO-3)."""
        model_state, opt_tensors, meta = load_checkpoint(self.ctx.store, self.ctx.paths, v)
        self.policy.load_state(model_state, unflatten_optimizer_state(opt_tensors, meta["optimizer_skeleton"]))
        return meta

    def resume(self) -> None:
        v = latest_committed_version(self.ctx.store, self.ctx.paths)
        self._command("resume", -1 if v is None else v, self.start_wait_s)
        if v is None:
            return
        meta = self._load_policy_state(v)
        extra = {name: load_checkpoint_tensors(self.ctx.store, self.ctx.paths, v, name)
                 for name in self.learner.extra_file_names()}
        self.learner.load_extra(extra)
        self.groups.restore(meta["cursors"])
        self.counters = Counters(meta["counters"])
        self.version = v
        log.info("resumed from checkpoint %d (cursors %s)", v, meta["cursors"])

    def connect_generation(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Form the weight-sync group with the generation servers; `weights` = the actor's weights at `self.version`.

        The push backend is NCCL where CUDA is available (the tensors go through the rank's GPU), else gloo.
        Servers lost or back later re-form the group (`asyncrl.roles.weight_group`).
        """
        self.weights.connect()
        if self.version > 0:
            self.push(weights)  # resumed: the servers started from the warm start, bring them to this version
        else:
            self.checksum = weights_checksum(weights)  # servers load the same folder
        self.publish({})

    # ---- one step ------------------------------------------------------------------------------------
    def collect(self, step: int) -> tuple[list[Group], list[Group], dict[str, int]]:
        """Take groups until B fresh ones are in hand: (kept, dropped as stale, kept per writer). Staleness is judged
        here, when a group is taken; the wait (on the prefetch buffer, no polling here) ends by `batch_wait_s`."""
        need = self.cfg.rollout.prompts_per_step
        kept: list[Group] = []
        dropped: list[Group] = []
        by_writer: dict[str, int] = {}
        deadline = time.monotonic() + self.cfg.timeouts.batch_wait_s
        announced = 0
        while len(kept) < need:
            got = self.groups.take(need - len(kept))
            if not got:
                if len(dropped) > announced:
                    announced = len(dropped)
                    self.publish(self.last_metrics, kept_by_writer=by_writer)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(
                        f"step {step}: {len(kept)} of {need} groups arrived within {self.cfg.timeouts.batch_wait_s:.0f}s"
                    )
                got = self.groups.take(need - len(kept), timeout_s=remaining)
            alpha = self.cfg.rollout.async_ratio
            for writer, _, group in got:
                fresh, stale = split_stale([group], step, alpha)
                kept += fresh
                dropped += stale
                if fresh:
                    by_writer[writer] = by_writer.get(writer, 0) + 1
        return kept, dropped, by_writer

    def push(self, weights: list[tuple[str, torch.Tensor]], checksum: bool = True) -> None:
        self.checksum = self.weights.push(self.version, weights, checksum=checksum)

    def sync_weights(self) -> dict[str, float]:
        # collective under ZeRO-3: the followers gather too. The checksum (published in versions/latest.json) only
        # where it is compared: at checkpoints and the last step (the launcher compares the servers' with it);
        # elsewhere {} (on a GPU it would copy every weight to the host at every step)
        self.push(self.policy.named_weights(), checksum=self.checkpoint_due(self.version))
        return self.checksum

    def checkpoint_due(self, version: int) -> bool:
        return version % self.cfg.training.checkpoint_every == 0 or version == self.cfg.training.steps

    def step(self, step: int) -> dict[str, float]:
        t0, cpu0 = time.monotonic(), time.process_time()
        kept, dropped, by_writer = self.collect(step)
        t1, wait_cpu_s = time.monotonic(), time.process_time() - cpu0  # the whole process: the prefetch thread too
        batch = build_batch(kept, norm_std=self.cfg.training.norm_std, pad_id=self.pad_id)
        self._followers_idle = False
        train_metrics = self.learner.train_step(
            batch, step, temperature=self.cfg.rollout.temperature,
            info={"next_wait_s": self.step_wait_s},
        )
        t2 = time.monotonic()
        self.version = step + 1
        self.sync_weights()
        t3 = time.monotonic()

        c = self.counters
        n_samples = sum(len(g.samples) for g in kept)
        stale = staleness_stats(kept, step)
        c.groups_trained += len(kept)
        c.samples_trained += n_samples
        c.groups_dropped_stale += len(dropped)
        c.samples_dropped_stale += sum(len(g.samples) for g in dropped)
        c.staleness_sum += stale["staleness_mean"] * n_samples
        c.staleness_max = max(c.staleness_max, int(stale["staleness_max"]))
        c.train_wall_s += t3 - t0
        if step > self.first_step:
            c.steady_steps += 1
            c.steady_samples += n_samples
            c.steady_wall_s += t3 - t0
        for writer, n in by_writer.items():
            c.trained_by_writer[writer] = c.trained_by_writer.get(writer, 0) + n
        rewards = [s.reward for g in kept for s in g.samples]
        metrics = {
            **{(k if "/" in k else f"train/{k}"): float(v) for k, v in train_metrics.items()},
            "reward/mean": sum(rewards) / len(rewards),
            "reward/accuracy": sum(r >= 1.0 for r in rewards) / len(rewards),
            "staleness/mean": stale["staleness_mean"],
            "staleness/max": stale["staleness_max"],
            "staleness/dropped_groups_total": c.groups_dropped_stale,
            "staleness/dropped_samples_total": c.samples_dropped_stale,
            "storage/quarantined_objects_total": c.quarantined_objects + len(self.groups.quarantined),
            "storage/gaps_skipped_total": c.gaps_skipped + len(self.groups.gaps_skipped),
            "storage/retries_total": self.ctx.store.stats.retries,
            "storage/gave_up_total": self.ctx.store.stats.gave_up,
            "throughput/samples_per_s": n_samples / (t3 - t0),
            "time/wait_s": t1 - t0,
            "time/wait_cpu_s": wait_cpu_s,
            "time/train_s": t2 - t1,
            "time/sync_s": t3 - t2,
            "time/step_s": t3 - t0,
            "version": self.version,
        }
        for k, v in stale.items():
            if k not in ("staleness_mean", "staleness_max"):
                metrics[f"staleness/{k}"] = float(v)
        for lag, count in staleness_histogram(kept, step, self.cfg.rollout.async_ratio).items():
            metrics[f"staleness/hist_{lag}"] = float(count)
        metrics.update(self.weights.metrics())
        return metrics

    def external_metrics(self) -> dict[str, float]:
        """The other roles' figures: the writers' rollout stats and every role's heartbeat metrics (S3 reads: the
        step reporter's thread calls this, never the step)."""
        return {**self.rollout_metrics(), **read_role_metrics(self.ctx.store, self.ctx.paths)}

    def rollout_metrics(self) -> dict[str, float]:
        """The environment writers' latest rollout metrics (`stats/<writer>.json`), summed over writers for
        counters, per writer for the per-server figures."""
        out: dict[str, float] = {}
        for writer in sorted(self.groups.cursors):
            doc = self.ctx.store.get_json(self.ctx.paths.rollout_stats(writer))
            for k, v in (doc or {}).get("metrics", {}).items():
                if not isinstance(v, int | float):
                    continue
                if "/server" in k:
                    out[k.replace("rollout/", f"rollout/{writer}/", 1)] = float(v)
                elif k != "rollout/version":
                    out[k] = out.get(k, 0.0) + float(v)
        return out

    def publish(self, metrics: dict[str, float], kept_by_writer: dict[str, int] | None = None) -> None:
        """Write `versions/latest.json`. `kept_by_writer` (mid-step, after stale drops): the groups read for the
        step under way, left out of `consumed`, so that consumed − trained is exactly what was dropped as stale and
        a writer whose whole window went stale may admit again instead of waiting for a step that cannot fill."""
        kept = kept_by_writer or {}
        self.last_metrics = metrics
        doc = {
            "version": self.version,
            "consumed": {w: n - kept.get(w, 0) for w, n in self.groups.cursors.items()},
            "trained": self.counters.trained_by_writer,
            "counters": self.run_counters(),
            "checksum": self.checksum,
            "weight_group": self.weights.document(),
            "metrics": metrics,
            "time": time.time(),
        }
        self.ctx.store.put_json(self.ctx.paths.versions_latest(), doc)

    def run_counters(self) -> dict[str, Any]:
        """The run-wide counters, with this attempt's quarantined objects and skipped gaps added."""
        c = self.counters.as_dict()
        c["quarantined_objects"] += len(self.groups.quarantined)
        c["quarantined_groups"] += sum(r.groups or 1 for r in self.groups.quarantined)
        c["gaps_skipped"] += len(self.groups.gaps_skipped)
        return c

    def checkpoint(self) -> None:
        # optimizer, then model state: the followers' `_checkpoint_collectives` order
        opt_tensors, skeleton = flatten_optimizer_state(self.policy.optimizer_state())
        meta = {"version": self.version, "cursors": self.groups.cursors, "counters": self.run_counters(),
                "optimizer_skeleton": skeleton}
        save_checkpoint(self.ctx.store, self.ctx.paths, self.version, self.policy.model_state(), opt_tensors, meta,
                        extra=self.learner.checkpoint_extra())
        log.info("checkpoint %d committed", self.version)

    def run(self) -> None:
        """The leader's run (the whole run with W = 1); a follower's `follow()`."""
        if not self.is_leader:
            self.follow()
            return
        try:
            self.lead()
        except BaseException:
            if self.channel is not None and self._followers_idle:
                try:
                    self._command("stop", -1, 0.0)
                except Exception as e:  # the original error is the one to raise
                    log.warning("could not tell the followers to stop: %s", e)
            raise
        self._command("stop", self.cfg.training.steps, 0.0)

    def lead(self) -> None:
        tracker = self.tracker
        self.reporter = StepReporter(
            self.external_metrics,
            tracker.log_steps if tracker is not None else None,
            read_every_s=min(self.cfg.rollout.stats_interval_s, self.cfg.timeouts.heartbeat_s),
            log_every_s=REPORT_EVERY_S)
        self.resume()
        self.groups.start()  # read ahead from the (restored) cursors while the weights connect
        weights = self.policy.named_weights()  # collective under ZeRO-3: the followers gather after "resume" too
        self._followers_idle = True
        self.connect_generation(weights)
        steps = self.cfg.training.steps
        self.first_step = self.version
        for step in range(self.version, steps):
            metrics = self.step(step)
            assert self.reporter is not None
            self.publish({**metrics, **self.reporter.external()})
            self.reporter.submit(metrics, self.version, fresh=self.version == steps)
            if self.checkpoint_due(self.version):
                # after the push: the followers join the checkpoint's collectives only when told, so a long push
                # (the generation group re-formed) never runs a training collective past its deadline
                self._command("checkpoint", self.version, self.step_wait_s)
                self.checkpoint()
            self._followers_idle = True
            log.info("step %d/%d reward %.3f acc %.3f loss %.4f staleness %.2f/%d %.1f samples/s",
                     self.version, steps, metrics["reward/mean"], metrics["reward/accuracy"],
                     metrics.get("train/loss", float("nan")), metrics["staleness/mean"],
                     int(metrics["staleness/max"]), metrics["throughput/samples_per_s"])
        self.reporter.flush(self.cfg.timeouts.http_s)  # every step in MLflow before the run is marked done
        self.ctx.store.put_json(self.ctx.paths.done(), {"version": self.version, "time": time.time()})

    # ---- followers (ranks 1..W-1) ----------------------------------------------------------------------
    def follow(self) -> None:
        """Obey the leader's commands until "stop"; a missed deadline raises `ChannelTimeout`."""
        assert self.channel is not None
        wait_s = self.cfg.timeouts.collective_s  # the leader sends "resume" right after the common DeepSpeed init
        while True:
            cmd, tensors = self.channel.receive(wait_s)
            wait_s = float(cmd.info.get("next_wait_s", self.step_wait_s))
            log.debug("rank %d: %s step %d", self.policy.rank, cmd.command, cmd.step)
            if cmd.command == "stop":
                log.info("rank %d: the leader said stop (step %d)", self.policy.rank, cmd.step)
                return
            if cmd.command == "checkpoint":
                self._checkpoint_collectives()
                continue
            if cmd.command == "resume":
                if cmd.step >= 0:
                    self._load_policy_state(cmd.step)
                    log.info("rank %d: resumed from checkpoint %d", self.policy.rank, cmd.step)
            else:
                self.learner.follow_step(cmd, tensors)
            if self.policy.stage == 3:
                self.policy.named_weights()  # the leader gathers the weights to push

    def _checkpoint_collectives(self) -> None:
        """A follower's part of the leader's `checkpoint()`: the same state calls, in the same order."""
        if self.policy.stage > 0:
            self.policy.optimizer_state()
        if self.policy.stage == 3:
            self.policy.model_state()

    def close(self) -> None:
        if self.reporter is not None:
            self.reporter.close(self.cfg.timeouts.http_s)
        self.groups.close()  # first: no S3 reads behind a closing role
        self.weights.close()
        self.learner.close()


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("training").parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(args.log_level, "training", args.id if rank == 0 else f"{args.id}.rank{rank}")
    ctx = RoleContext.from_args("training", args)
    if ctx.cfg.training.cpu_threads:
        torch.set_num_threads(ctx.cfg.training.cpu_threads)
    # rank 0 alone beats the run's trainer heartbeat (the other roles exit when it says "failed" or goes silent);
    # it starts before the model loads, so a slow start is not taken for a dead trainer
    heartbeat = ctx.heartbeat() if rank == 0 else contextlib.nullcontext()
    with heartbeat:
        runner = TrainingRunner(ctx)
        try:
            runner.run()
        finally:
            runner.close()


if __name__ == "__main__":
    main()
