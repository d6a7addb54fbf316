"""The training role: reads groups from S3 in order, filters stale ones, trains, bumps the version, syncs weights.

One training step k (version k → k+1):
1. wait: take groups per writer in sequence order (per-writer cursors) until B fresh groups are in hand; a group
   with start_version < k − α (judged when taken) is dropped and counted (docs/algorithms.md §1), never trained on. A
   background thread reads ahead (`asyncrl.storage.group_prefetch`): up to B groups, during the other phases too;
   a group only read ahead is not consumed: neither in the published `consumed` counts nor in checkpoint cursors;
2. train (`Learner`): GRPO advantages, or GAE on the critics' values (AsyPPO: mini-critics and their masks), the
   critics' update, and the configured policy loss with the engine's behaviour log-probs, one optimizer step
   (DeepSpeed; or `training.mini_batches` x `training.epochs` mini-batch updates; attention credit rescales
   advantages inside it);
3. sync: broadcast the new weights in buckets to the generation servers of the weight group (they pause, load,
   resume); a lost server leaves the group and a restarted one joins it (`asyncrl.roles.weight_group`);
4. publish `versions/latest.json` (version, per-writer consumed counts, the weights' checksum at checkpoints and
   the last step, metrics), log to MLflow (`asyncrl.roles.training_report`, after the step), and
   every `checkpoint_every` steps write a checkpoint (model, optimizer, cursors, and the start folder's config and
   tokenizer files so that it is a complete Hugging Face folder; `COMMITTED` last).
On start it resumes from the newest committed checkpoint, if any. At the end it writes the run's `done` marker.

Data parallel (`training.num_processes` = W > 1, one rank per GPU of the pod, or CPU processes): the same entrypoint
under torchrun, and every rank runs the same `start()` and `step()` (SPMD). The invariant: every rank calls the same
collectives in the same order, each with a deadline. Rank 0 alone does the I/O (S3, the generation servers, MLflow)
and what only it can decide reaches the others in one broadcast (`asyncrl.training.distributed.Decisions.share`):
- start: "resume" (rank 0 found the newest committed checkpoint, −1 for none); every rank loads it (collective
  under ZeRO-3), then gathers the weights (`PolicyTrainer.snapshot`); rank 0 pushes them to the servers;
- each step: rank 0 takes the groups, builds the batch and runs the critic phase, then shares "step" (the prepared
  batch; `checkpoint`: a checkpoint is due after it) or "stop" (the last step is done); every rank then runs the
  actor update (collective) and the snapshot (the weights, and at a checkpoint the optimizer state: the gathers
  ZeRO needs, before the push, so a long push never holds a training collective past its deadline); then rank 0
  alone pushes, publishes, and writes the checkpoint from the snapshot (`checkpoint()`, a no-op elsewhere).
Rank-0-only I/O inside calls every rank makes: `step()` (collect, push), `checkpoint()`, the report after the step.
A rank that fails makes the others miss a deadline (they raise `ChannelTimeout` or the training group's timeout);
rank 0 failing while the others wait for its next decision tells them "stop" at once. The others wait for that
decision up to `step_wait_s` (twice after a checkpoint step: the push, the checkpoint write and the next batch).

Stopped by SIGTERM/SIGINT (Kubernetes stopping the pod; torchrun forwards it to every rank): every rank abandons the
step under way (`asyncrl.roles.stop_signal.RoleStopped`; a checkpoint cut short has no `COMMITTED` and is never
read, every committed one stays), rank 0 flushes the steps already made to MLflow (`STOP_FLUSH_S` at most) and,
before the run is done, records the stop in `stopped.json` and ends the MLflow run as KILLED
(`asyncrl.run.stop.end_tracking_killed`), so a run cancelled from the Kubeflow UI ends KILLED even when the
pipeline's exit step never runs. No `done` marker is written: the run stays resumable.

Run: `python -m asyncrl.roles.training --run-url s3://bucket/prefix/run_id`, or
`torchrun --standalone --nnodes 1 --nproc-per-node W -m asyncrl.roles.training --run-url ... --id 0`.
"""

from __future__ import annotations

import contextlib
import logging
import os
import time

import torch

from asyncrl.models.checkpoint_folder import checkpoint_folder_files
from asyncrl.models.lora_export import LORA_FILE, lora_description
from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.roles.context import RoleContext, role_arg_parser, setup_logging
from asyncrl.roles.stop_signal import STOP_S3_TIMEOUT_S, RoleStopped, StopSignal, bounded
from asyncrl.roles.training_report import Counters, StepResult, Taken, TrainingReport
from asyncrl.roles.weight_group import WeightGroup
from asyncrl.run.stop import end_tracking_killed
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
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.distributed import Command, Decisions
from asyncrl.training.heap import keep_freed_memory
from asyncrl.training.learner import Learner
from asyncrl.training.policy import Snapshot
from asyncrl.training.process_group import launcher_world_size
from asyncrl.training.staleness import split_stale
from asyncrl.types import Group

log = logging.getLogger(__name__)

STOP_FLUSH_S = 5.0  # stopped by a signal: how long the steps already made may take to reach MLflow


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
        # how long the other ranks wait for rank 0's next decision (see the module docstring): a step's batch, plus
        # its weight push, which may re-form the generation group (a failed push, a join of up to 2 deadlines, the
        # push again) or wait for a generation server to answer
        push_s = 4 * t.collective_s + 60.0
        self.step_wait_s = t.batch_wait_s + push_s + t.rendezvous_s
        self.start_wait_s = t.rendezvous_s + t.batch_wait_s + push_s
        self.model_path = ctx.model_folder()
        self.pad_id = int(load_tokenizer(self.model_path).pad_token_id)
        self.learner = Learner(self.model_path, self.cfg.training, timeout_s=t.collective_s,
                               control_timeout_s=2 * self.step_wait_s)
        self.policy = self.learner.policy
        self.decisions = Decisions(self.policy.channel, t.collective_s)
        self.is_rank0 = self.policy.is_leader
        self.version = 0
        # rank 0's I/O (None on the other ranks): the groups read ahead from S3 (`start` starts the thread; from then
        # on the reader is the prefetch thread's alone), the generation servers' weight group, the report
        self.groups: GroupPrefetcher | None = None
        self.weights: WeightGroup | None = None
        self.report: TrainingReport | None = None
        # rank 0: the start folder's config and tokenizer files, copied into every checkpoint (a complete HF folder)
        self.folder_files: dict[str, bytes] = {}
        if self.is_rank0:
            self.folder_files = checkpoint_folder_files(self.model_path)
            if self.cfg.training.lora is not None:  # the checkpoint's model file holds adapters: say so, and of what
                lora = self.cfg.training.lora
                self.folder_files[LORA_FILE] = lora_description(lora.rank, lora.alpha, lora.target_modules,
                                                                str(self.model_path))
            tracking = ctx.store.get_json(ctx.paths.tracking())
            tracker = Tracker.attach(tracking["tracking_uri"], tracking["mlflow_run_id"]) if tracking else None
            self.groups = GroupPrefetcher.for_run(ctx.store, ctx.paths, self.cfg.rollout.num_writers,
                                                  self.cfg.rollout.prompts_per_step, t.group_gap_wait_s)
            self.weights = WeightGroup(ctx, self.policy.device)
            self.report = TrainingReport(ctx, self.groups, self.weights, tracker)

    # ---- start (every rank) ------------------------------------------------------------------------------
    def start(self) -> None:
        """Every rank: resume from the checkpoint rank 0 found (one broadcast), gather the weights; rank 0 then
        connects the generation servers (and brings them to the resumed version)."""
        if self.report is not None:
            self.report.start()
        decision = None
        if self.is_rank0:
            latest = latest_committed_version(self.ctx.store, self.ctx.paths)
            decision = Command("resume", -1 if latest is None else latest)
        # the other ranks wait from the common DeepSpeed init: rank 0 reads the tracking document meanwhile
        cmd, _ = self.decisions.share(decision, None, self.cfg.timeouts.collective_s)
        if cmd.step >= 0:
            self.resume(cmd.step)
        if self.groups is not None:
            self.groups.start()  # read ahead from the (restored) cursors while the weights connect
        snapshot = self.policy.snapshot()  # collective under ZeRO-3
        self.decisions.peers_idle()
        if snapshot is not None:
            self.connect_generation(snapshot.weights)

    def resume(self, v: int) -> None:
        """Every rank: load checkpoint `v`'s model and optimizer into the actor (collective under ZeRO-3); rank 0
        also the critics, the groups' cursors and the run's counters."""
        model_state, opt_tensors, meta = load_checkpoint(self.ctx.store, self.ctx.paths, v)
        self.policy.load_state(model_state, unflatten_optimizer_state(opt_tensors, meta["optimizer_skeleton"]))
        self.version = v
        if self.report is None or self.groups is None:
            log.info("rank %d: resumed from checkpoint %d", self.policy.rank, v)
            return
        extra = {name: load_checkpoint_tensors(self.ctx.store, self.ctx.paths, v, name)
                 for name in self.learner.extra_file_names()}
        self.learner.load_extra(extra)
        self.groups.restore(meta["cursors"])
        self.report.counters = Counters(meta["counters"])
        log.info("resumed from checkpoint %d (cursors %s)", v, meta["cursors"])

    def connect_generation(self, weights: list[tuple[str, torch.Tensor]]) -> None:
        """Rank 0: form the weight-sync group with the generation servers; `weights` = the actor's at `self.version`.

        The push backend is NCCL where CUDA is available (the tensors go through the rank's GPU), else gloo.
        Servers lost or back later re-form the group (`asyncrl.roles.weight_group`).
        """
        assert self.weights is not None and self.report is not None
        self.weights.connect()
        if self.version > 0:
            self.push(weights)  # resumed: the servers started from the warm start, bring them to this version
        else:
            self.report.checksum = self.weights.checksum(weights)  # servers load the same folder, in their dtype
        self.report.publish(self.version, {})

    # ---- one step (every rank) -----------------------------------------------------------------------------
    def collect(self, step: int) -> Taken:
        """Rank 0: take groups until B fresh ones are in hand (kept, dropped as stale, kept per writer). Staleness is
        judged here, when a group is taken; the wait (on the prefetch buffer, no polling here) ends by
        `batch_wait_s`."""
        assert self.groups is not None and self.report is not None
        t0, cpu0 = time.monotonic(), time.process_time()
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
                    self.report.publish(self.version, self.report.last_metrics, kept_by_writer=by_writer)
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
        return Taken(kept, dropped, by_writer, time.monotonic() - t0, time.process_time() - cpu0)

    def checkpoint_due(self, version: int) -> bool:
        return version % self.cfg.training.checkpoint_every == 0 or version == self.cfg.training.steps

    def decide(self, step: int, wait_s: float) -> tuple[Command, TrainBatch | None, Taken | None, dict[str, float]]:
        """Every rank: rank 0's decision for `step`, shared in one broadcast: "stop" after the last step, else "step"
        with the prepared batch (rank 0 takes the groups, builds the batch, runs the critic phase). The others wait
        up to `wait_s`; rank 0 also returns what it took and the critic phase's metrics."""
        if not self.is_rank0:
            cmd, batch = self.decisions.share(None, None, wait_s)
            return cmd, batch, None, {}
        if step >= self.cfg.training.steps:
            return self.decisions.share(Command("stop", step, {"failed": False}), None, wait_s) + (None, {})
        taken = self.collect(step)
        batch = build_batch(taken.kept, norm_std=self.cfg.training.norm_std, pad_id=self.pad_id)
        metrics = self.learner.prepare(batch, step)
        cmd = Command("step", step, {"checkpoint": self.checkpoint_due(step + 1)})
        self.decisions.share(cmd, batch if self.learner.trains_actor(step) else None, wait_s)
        return cmd, batch, taken, metrics

    def step(self, step: int, wait_s: float) -> StepResult | None:
        """Every rank, the same collectives in the same order: rank 0's decision (one broadcast), the actor update,
        the snapshot's gathers; then rank 0 alone pushes the weights. None when rank 0 said "stop"."""
        t0 = time.monotonic()
        cmd, batch, taken, metrics = self.decide(step, wait_s)
        t1 = t0 + taken.wait_s if taken is not None else time.monotonic()  # rank 0: train_s from the batch's build
        if cmd.command == "stop":
            (log.warning if cmd.info.get("failed") else log.info)(
                "rank %d: rank 0 said stop%s (step %d)", self.policy.rank,
                " after a failure" if cmd.info.get("failed") else "", cmd.step)
            return None
        if cmd.step != step:
            raise RuntimeError(f"training rank {self.policy.rank}: at step {step}, rank 0 sent step {cmd.step}")
        metrics |= self.learner.update_actor(batch, step, temperature=self.cfg.rollout.temperature)
        t2 = time.monotonic()
        self.version = step + 1
        checkpoint = bool(cmd.info["checkpoint"])
        # the gathers every rank takes part in: the weights to push, at checkpoints the optimizer state too
        snapshot = self.policy.snapshot(optimizer=checkpoint)  # in time/sync_s, as the weights' gather always was
        self.decisions.peers_idle()
        if snapshot is not None:
            # versions/latest.json of the new version goes out while the weights are pushed (not at checkpoints: they
            # publish the weights' checksum, known after the push), so the writers' next requests are at the servers,
            # held for that version, when the push ends (`TrainingReport.publish_ahead`)
            ahead = None
            if self.report is not None and taken is not None and not checkpoint:
                ahead = self.report.publish_ahead(self.version, taken)
            try:
                # the checksum (published in versions/latest.json) only where it is compared: at checkpoints and the
                # last step (the launcher compares the servers' with it); elsewhere {} (on a GPU it would copy every
                # weight to the host at every step)
                self.push(snapshot.weights, checksum=checkpoint)
            finally:
                if ahead is not None:
                    ahead.join(STOP_S3_TIMEOUT_S)
        return StepResult(step, checkpoint, metrics, taken, snapshot, train_s=t2 - t1, sync_s=time.monotonic() - t2)

    def push(self, weights: list[tuple[str, torch.Tensor]], checksum: bool = True) -> None:
        """Rank 0: the weights of `self.version` to the generation servers."""
        assert self.weights is not None and self.report is not None
        self.report.checksum = self.weights.push(self.version, weights, checksum=checksum)

    def checkpoint(self, result: StepResult) -> None:
        """Every rank, after the step: rank 0 writes the checkpoint of `result.version` when one is due, from the
        step's snapshot (no collective: the ranks took part in its gathers)."""
        snap: Snapshot | None = result.snapshot
        if not result.checkpoint or snap is None:
            return
        assert snap.optimizer is not None and self.groups is not None and self.report is not None
        self.report.flush_before_checkpoint()
        opt_tensors, skeleton = flatten_optimizer_state(snap.optimizer)
        meta = {"version": result.version, "cursors": self.groups.cursors, "counters": self.report.run_counters(),
                "optimizer_skeleton": skeleton}
        save_checkpoint(self.ctx.store, self.ctx.paths, result.version, snap.model_state(), opt_tensors, meta,
                        extra=self.learner.checkpoint_extra(), folder_files=self.folder_files)
        log.info("checkpoint %d committed", result.version)

    # ---- the run (every rank) --------------------------------------------------------------------------------
    def run(self) -> None:
        """Every rank: start, then steps until rank 0 says "stop"; rank 0 reports after each step and writes the run's
        `done` marker at the end."""
        try:
            self.start()
            step, wait_s = self.version, self.start_wait_s
            while (result := self.step(step, wait_s)) is not None:
                if self.report is not None:
                    self.report.after_step(result)
                self.checkpoint(result)
                step += 1
                # the push, after a checkpoint step the checkpoint's write too, and the next batch
                wait_s = self.step_wait_s * (2 if result.checkpoint else 1)
        except BaseException:
            self.decisions.stop_peers(self.version)
            raise
        if self.report is not None:
            self.report.finish(self.version)

    def close(self, flush_s: float | None = None) -> None:
        """Close rank 0's I/O; the steps already made reach MLflow within `flush_s` (default: one MLflow
        call's deadline, `tracking.retry_deadline_s`, and a spool write)."""
        if self.report is not None:
            self.report.close(flush_s)
        if self.groups is not None:
            self.groups.close()  # first: no S3 reads behind a closing role
        if self.weights is not None:
            self.weights.close()
        self.learner.close()


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("training").parse_args(argv)
    rank = int(os.environ.get("RANK", "0"))
    setup_logging(args.log_level, "training", args.id if rank == 0 else f"{args.id}.rank{rank}")
    ctx = RoleContext.from_args("training", args)
    if ctx.cfg.training.cpu_threads:
        torch.set_num_threads(ctx.cfg.training.cpu_threads)
    keep_freed_memory()  # a step's freed activations stay mapped for the next (asyncrl.training.heap)
    signals = StopSignal()
    signals.raise_in_main()  # SIGTERM/SIGINT: RoleStopped, once, wherever the main thread is
    # rank 0 alone beats the run's trainer heartbeat (the other roles exit when it says "failed" or "stopped", or goes
    # silent); it starts before the model loads, so a slow start is not taken for a dead trainer
    heartbeat = ctx.heartbeat() if rank == 0 else None
    try:
        with heartbeat or contextlib.nullcontext():
            runner = TrainingRunner(ctx)
            try:
                runner.run()
            finally:
                runner.close(STOP_FLUSH_S if signals.signum is not None else None)
    except RoleStopped:
        code = 128 + (signals.signum or 0)
        if heartbeat is not None:  # rank 0: the run's record of the stop, and its MLflow run
            code = signals.finish(ctx.store, ctx.paths, "training", args.id, heartbeat.stop)
            if code:
                bounded(lambda: end_tracking_killed(ctx.store, ctx.paths), "training: end the MLflow run as KILLED",
                        STOP_S3_TIMEOUT_S)
        raise SystemExit(code) from None


if __name__ == "__main__":
    main()
