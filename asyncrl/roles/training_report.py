"""Rank 0's account of the training run: the run-wide counters, each step's metrics, `versions/latest.json`, MLflow.

The training role calls `after_step` after each step (never inside it; rank 0 alone has a report): it adds the
step to the counters, builds the step's metrics, publishes `versions/latest.json` (version, per-writer consumed and
trained counts, the run's counters, the weights' checksum, the weight group, metrics) and hands the metrics to the
`StepReporter` thread (MLflow, the other roles' figures: the job's run gets the steps and the writers' summed rollout
counters, each role instance's child run its own figures, `asyncrl.tracking.child_runs`, made and found by the
reporter's thread). MLflow gets them through a `SpoolingLog`: retried until
`tracking.retry_deadline_s`, then kept in S3 under the run (`tracking/spool/`) and logged once MLflow is back, so an MLflow
outage never stops training; its counters (`tracking/*`) go with every step's metrics, and once more at the last
step after its own call when MLflow took that call (`finish`). `publish` is also called mid-step, when groups taken
for the step were dropped as stale (see `TrainingRunner.collect`), and once the generation servers are connected.

Invariants: `consumed` counts only groups taken by a step, never groups only read ahead; the counters of a resumed
run continue the checkpoint's (`Counters` is saved in checkpoints), plus this attempt's quarantined objects and
skipped gaps (`run_counters`).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from asyncrl.rewards.components import combined_shares
from asyncrl.roles.context import RoleContext
from asyncrl.roles.role_metrics import heartbeat_metrics, instance_figures, read_heartbeats
from asyncrl.roles.step_reporter import Figures, StepReporter
from asyncrl.roles.weight_group import WeightGroup
from asyncrl.storage.eval_points import eval_key, unseen_points
from asyncrl.storage.group_prefetch import GroupPrefetcher
from asyncrl.tracking.child_runs import ChildRuns, child_key
from asyncrl.tracking.mlflow_calls import REQUEST_TIMEOUT_S
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.tracking.spool import MetricSpool
from asyncrl.tracking.spooling_log import SpoolingLog
from asyncrl.training.length_metrics import response_length_metrics
from asyncrl.training.policy import Snapshot
from asyncrl.training.staleness import staleness_histogram, staleness_stats
from asyncrl.types import Group

log = logging.getLogger(__name__)

# MLflow gets the steps at most once a second, several per call: one database commit per call, not per step (a
# commit per step cost ~10 % of a core on a 2-core machine at ~2 steps/s). The last step is logged at once.
REPORT_EVERY_S = 1.0
FINAL_EVAL_GRACE_S = 10.0  # beyond the evaluation's own request deadline: the writer's polls
FINAL_EVAL_POLL_S = 0.2


def final_eval_wait_s(cfg: Any) -> float:
    """How long the trainer waits for the final version's evaluation point: one evaluation's request deadline
    (`RunConfig.eval_request_timeout_s`: its answers may be as long as a rollout's) and a few polls of the writer."""
    return float(cfg.eval_request_timeout_s) + FINAL_EVAL_GRACE_S


class Counters:
    """Run-wide totals, saved in checkpoints so a resumed run reports the whole run."""

    def __init__(self, d: dict[str, Any] | None = None) -> None:
        d = d or {}
        self.groups_trained = int(d.get("groups_trained", 0))
        self.samples_trained = int(d.get("samples_trained", 0))
        self.tokens_trained = int(d.get("tokens_trained", 0))  # response tokens with loss mask 1
        self.groups_dropped_stale = int(d.get("groups_dropped_stale", 0))
        # objects the reader moved aside or skipped in earlier attempts of the run (a resume starts a new reader)
        self.quarantined_objects = int(d.get("quarantined_objects", 0))
        # the groups those objects held (an object may hold several; runs before that: one each)
        self.quarantined_groups = int(d.get("quarantined_groups", self.quarantined_objects))
        self.gaps_skipped = int(d.get("gaps_skipped", 0))
        self.samples_dropped_stale = int(d.get("samples_dropped_stale", 0))
        self.staleness_sum = float(d.get("staleness_sum", 0.0))
        self.staleness_max = int(d.get("staleness_max", 0))
        self.train_wall_s = float(d.get("train_wall_s", 0.0))  # the steps' wait + train + sync, summed
        # steady state: every step but the first of a (re)start, whose wait includes filling the rollout pipeline;
        # `steady_wall_s` is wall-clock time, each steady step's from the end of the step before (so the rank-0
        # bookkeeping between steps counts: publishing latest.json, queueing metrics, checkpoints)
        self.steady_steps = int(d.get("steady_steps", 0))
        self.steady_samples = int(d.get("steady_samples", 0))
        self.steady_wall_s = float(d.get("steady_wall_s", 0.0))
        # per writer: groups trained in completed steps (the rollout scheduler's admission slots, see scheduler.py)
        self.trained_by_writer: dict[str, int] = {str(k): int(v) for k, v in d.get("trained_by_writer", {}).items()}

    def as_dict(self) -> dict[str, Any]:
        return dict(vars(self))


@dataclass
class Taken:
    """The groups rank 0 took for a step: kept, dropped as stale, kept per writer, and the wait for them."""

    kept: list[Group]
    dropped: list[Group]
    by_writer: dict[str, int]
    wait_s: float = 0.0
    wait_cpu_s: float = 0.0  # the whole process: the prefetch thread too


@dataclass
class StepResult:
    """One finished step as every rank knows it; `taken`, `snapshot` and the times are rank 0's (None elsewhere)."""

    step: int
    checkpoint: bool  # a checkpoint of version step + 1 is due (and the weights' checksum is published)
    train_metrics: dict[str, float]
    taken: Taken | None = None
    snapshot: Snapshot | None = None
    train_s: float = 0.0
    sync_s: float = 0.0

    @property
    def version(self) -> int:
        return self.step + 1


class TrainingReport:
    def __init__(self, ctx: RoleContext, groups: GroupPrefetcher, weights: WeightGroup,
                 tracker: Tracker | None = None) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.groups, self.weights, self.tracker = groups, weights, tracker
        self.counters = Counters()
        self.checksum: dict[str, float] = {}
        self.last_metrics: dict[str, float] = {}
        self.last_metrics_version = 0  # the version whose step produced last_metrics
        # monotonic time of the last step counted in this process; None until the first step of this (re)start,
        # which is never steady (its wait includes filling the rollout pipeline)
        self._last_step_end: float | None = None
        self.reporter: StepReporter | None = None
        self.eval_seen: set[int] = set()  # the evaluation points already handed to the reporter
        self._eval_lock = threading.Lock()  # the reporter's thread and `finish` both hand points on, each once
        self.tracking: SpoolingLog | None = None

    def start(self) -> None:
        """Start the reporting thread (MLflow, through the spooling log, and the other roles' figures)."""
        if self.tracker is not None:
            self.tracking = SpoolingLog(ChildRuns(self.tracker, self.ctx.store, self.ctx.paths).send,
                                        MetricSpool(self.ctx.store, self.ctx.paths),
                                        deadline_s=self.cfg.tracking.retry_deadline_s)
        self.reporter = StepReporter(
            self.external_metrics, self.tracking.log_runs if self.tracking is not None else None,
            read_every_s=min(self.cfg.rollout.stats_interval_s, self.cfg.timeouts.heartbeat_s),
            log_every_s=REPORT_EVERY_S)

    def log_call_s(self) -> float:
        """The longest one MLflow call of the reporter takes: the retry deadline, the request in flight when it
        passes, and a spool write to S3 (its own retry deadline)."""
        return self.cfg.tracking.retry_deadline_s + REQUEST_TIMEOUT_S + self.cfg.timeouts.storage_s

    def after_step(self, r: StepResult) -> dict[str, float]:
        """Count step `r` in, publish its metrics in `versions/latest.json`, queue them for MLflow; the metrics."""
        assert r.taken is not None and self.reporter is not None
        metrics = self.step_metrics(r)
        self.publish(r.version, {**metrics, **self.reporter.external()})
        steps = self.cfg.training.steps
        self.reporter.submit(metrics, r.version, fresh=r.version == steps)
        log.info("step %d/%d reward %.3f acc %.3f loss %.4f staleness %.2f/%d %.1f samples/s",
                 r.version, steps, metrics["reward/mean"], metrics["reward/accuracy"],
                 metrics.get("train/loss", float("nan")), metrics["staleness/mean"],
                 int(metrics["staleness/max"]), metrics["throughput/samples_per_s"])
        return metrics

    def step_metrics(self, r: StepResult) -> dict[str, float]:
        """Add step `r` to the counters; its metrics."""
        assert r.taken is not None
        kept, dropped, step, c = r.taken.kept, r.taken.dropped, r.step, self.counters
        step_s = r.taken.wait_s + r.train_s + r.sync_s
        n_samples = sum(len(g.samples) for g in kept)
        stale = staleness_stats(kept, step)
        c.groups_trained += len(kept)
        c.samples_trained += n_samples
        # the step's trained tokens (loss mask 1), rows of zero advantage included though not computed
        # (asyncrl.training.zero_advantage); 0 in a critic warm-up step
        trained_tokens = r.train_metrics.get("batch_tokens", r.train_metrics.get("tokens", 0.0))
        c.tokens_trained += int(trained_tokens)
        c.groups_dropped_stale += len(dropped)
        c.samples_dropped_stale += sum(len(g.samples) for g in dropped)
        c.staleness_sum += stale["staleness_mean"] * n_samples
        c.staleness_max = max(c.staleness_max, int(stale["staleness_max"]))
        c.train_wall_s += step_s
        now = time.monotonic()
        if self._last_step_end is not None:  # not the first step of this (re)start
            c.steady_steps += 1
            c.steady_samples += n_samples
            c.steady_wall_s += now - self._last_step_end
        self._last_step_end = now
        for writer, n in r.taken.by_writer.items():
            c.trained_by_writer[writer] = c.trained_by_writer.get(writer, 0) + n
        rewards = [s.reward for g in kept for s in g.samples]
        metrics = {
            **{(k if "/" in k else f"train/{k}"): float(v) for k, v in r.train_metrics.items()},
            "reward/mean": sum(rewards) / len(rewards),
            "reward/accuracy": sum(x >= 1.0 for x in rewards) / len(rewards),
            "staleness/mean": stale["staleness_mean"],
            "staleness/max": stale["staleness_max"],
            "staleness/dropped_groups_total": c.groups_dropped_stale,
            "staleness/dropped_samples_total": c.samples_dropped_stale,
            "storage/quarantined_objects_total": c.quarantined_objects + len(self.groups.quarantined),
            "storage/gaps_skipped_total": c.gaps_skipped + len(self.groups.gaps_skipped),
            "storage/retries_total": self.ctx.store.stats.retries,
            "storage/gave_up_total": self.ctx.store.stats.gave_up,
            "storage/requests_total": self.ctx.store.stats.requests_total(),  # the trainer's (rank 0's) S3 requests
            "storage/get_missing_total": self.ctx.store.stats.missing_gets(),
            "throughput/samples_per_s": n_samples / step_s,
            "throughput/train_tokens_per_s": trained_tokens / r.train_s if r.train_s > 0 else 0.0,
            "time/wait_s": r.taken.wait_s,
            "time/wait_cpu_s": r.taken.wait_cpu_s,
            "time/train_s": r.train_s,
            "time/sync_s": r.sync_s,
            "time/step_s": step_s,
            "version": r.version,
            "progress/samples_trained": c.samples_trained,  # the x axis "samples" of `asyncrl compare`
        }
        for k, v in stale.items():
            if k not in ("staleness_mean", "staleness_max"):
                metrics[f"staleness/{k}"] = float(v)
        for lag, count in staleness_histogram(kept, step, self.cfg.rollout.async_ratio).items():
            metrics[f"staleness/hist_{lag}"] = float(count)
        metrics.update(response_length_metrics(kept, self.cfg.rollout.overlong))
        metrics.update(self.weights.metrics())
        if self.tracking is not None:
            metrics.update(self.tracking.counters())
        return metrics

    def external_metrics(self) -> Figures:
        """The other roles' figures: the writers' rollout stats and every role's heartbeat metrics, for the job's
        run and each instance's child run (S3 reads: the step reporter's thread calls this, never the step)."""
        self.submit_eval_points()
        summed, per_writer = self.rollout_metrics()
        beats = read_heartbeats(self.ctx.store, self.ctx.paths)
        children = instance_figures(beats)
        published = {**summed, **heartbeat_metrics(beats)}
        for writer, figures in per_writer.items():
            published.update({k.replace("rollout/", f"rollout/{writer}/", 1): v for k, v in figures.items()})
            children.setdefault(child_key("environment", writer), {}).update(figures)
        return Figures(job=summed, children=children, published=published)

    def rollout_metrics(self) -> tuple[dict[str, float], dict[str, dict[str, float]]]:
        """The environment writers' latest rollout metrics (`stats/<writer>.json`): the counters summed over
        writers (the job's run) and, per writer, its per-server figures (`rollout/server<i>/...`, its child run)."""
        summed: dict[str, float] = {}
        per_writer: dict[str, dict[str, float]] = {}
        for writer in sorted(self.groups.cursors):
            doc = self.ctx.store.get_json(self.ctx.paths.rollout_stats(writer))
            for k, v in (doc or {}).get("metrics", {}).items():
                if not isinstance(v, int | float):
                    continue
                if "/server" in k:
                    per_writer.setdefault(writer, {})[k] = float(v)
                elif k != "rollout/version":
                    summed[k] = summed.get(k, 0.0) + float(v)
        summed.update(combined_shares(summed))  # reward/correct, reward/format: shares over all writers, not sums
        return summed, per_writer

    def publish(self, version: int, metrics: dict[str, float], kept_by_writer: dict[str, int] | None = None) -> None:
        """Write `versions/latest.json`. `kept_by_writer` (mid-step, after stale drops): the groups read for the
        step under way, left out of `consumed`, so that consumed − trained is exactly what was dropped as stale and
        a writer whose whole window went stale may admit again instead of waiting for a step that cannot fill."""
        kept = kept_by_writer or {}
        self.last_metrics, self.last_metrics_version = metrics, version
        consumed = {w: n - kept.get(w, 0) for w, n in self.groups.cursors.items()}
        doc = self._latest_doc(version, consumed, self.counters.trained_by_writer, self.checksum, metrics, version)
        self.ctx.store.put_json(self.ctx.paths.versions_latest(), doc)

    def _latest_doc(self, version: int, consumed: dict[str, int], trained: dict[str, int],
                    checksum: dict[str, float], metrics: dict[str, float], metrics_version: int) -> dict[str, Any]:
        """The `versions/latest.json` document (`publish`, `publish_ahead`). `metrics_version`: the version whose
        step the metrics describe (the previous one in a document published ahead of its push), so a reader never
        labels one step's figures with another's number."""
        return {"version": version, "consumed": consumed, "trained": trained, "counters": self.run_counters(),
                "checksum": checksum, "weight_group": self.weights.document(), "metrics": metrics,
                "metrics_version": metrics_version, "time": time.time()}

    def publish_ahead(self, version: int, taken: Taken) -> threading.Thread:
        """Write `versions/latest.json` for `version` from a thread, while its weights are being pushed (a step that
        writes no checkpoint); the caller joins the thread. The document is built here, before the push: the version
        and the trained and consumed counts that admission reads, with this step's groups in them; the run counters
        and metrics are the previous step's until `after_step` publishes again. The writers may then send that
        version's requests during the push: each carries it as its `min_version`, and a server holds it until it
        serves those weights (docs/data_plane.md). A failed write is logged; `after_step` writes the file again."""
        trained = dict(self.counters.trained_by_writer)
        for writer, n in taken.by_writer.items():
            trained[writer] = trained.get(writer, 0) + n
        doc = self._latest_doc(version, self.groups.cursors, trained, {}, self.last_metrics,
                               self.last_metrics_version)

        def put() -> None:
            try:
                self.ctx.store.put_json(self.ctx.paths.versions_latest(), doc)
            except Exception as err:  # noqa: BLE001 - after_step publishes again; admission waits until then
                log.warning("versions/latest.json for version %d ahead of its push: %s", version, err)

        thread = threading.Thread(target=put, name="publish-ahead", daemon=True)
        thread.start()
        return thread

    def run_counters(self) -> dict[str, Any]:
        """The run-wide counters, with this attempt's quarantined objects and skipped gaps added."""
        c = self.counters.as_dict()
        c["quarantined_objects"] += len(self.groups.quarantined)
        c["quarantined_groups"] += sum(r.groups or 1 for r in self.groups.quarantined)
        c["gaps_skipped"] += len(self.groups.gaps_skipped)
        return c

    def flush_before_checkpoint(self) -> None:
        """The steps submitted so far in MLflow before a checkpoint commits, so that a crash after the commit loses
        none of the steps the resumed run will not train again (it retrains only those after the checkpoint). With
        MLflow down (the spool behind) the steps go to the spool in the reporter's own time: no wait here."""
        if self.reporter is not None and not (self.tracking is not None and self.tracking.behind):
            self.reporter.flush(self.log_call_s() + 5.0)

    def submit_eval_points(self) -> None:
        """Hand the evaluation points not yet handed on to the reporter, each at its own step."""
        if self.cfg.eval.every_steps and self.reporter is not None:
            with self._eval_lock:
                for metrics, version in unseen_points(self.ctx.store, self.ctx.paths, self.eval_seen):
                    self.reporter.submit(metrics, version)

    def wait_for_final_eval(self, version: int) -> bool:
        """With periodic evaluation on, wait (bounded: one evaluation's request deadline and a few polls) for the
        point at the final `version`, which the first environment writer evaluates once the servers hold it; the
        `done` marker, which stops the servers of a cluster run, comes after it. False if it did not come."""
        if not self.cfg.eval.every_steps:
            return True
        wait_s = final_eval_wait_s(self.cfg)
        deadline = time.monotonic() + wait_s
        key = eval_key(self.ctx.paths, version)
        while not self.ctx.store.exists(key):
            if time.monotonic() > deadline:
                log.warning("the evaluation point of the final version %d did not come within %.0f s; the run ends "
                            "without it", version, wait_s)
                return False
            time.sleep(FINAL_EVAL_POLL_S)
        return True

    def finish(self, version: int) -> None:
        """The final evaluation point (when evaluating), every step in MLflow (or in the tracking spool, MLflow being
        down), then the run's `done` marker: whoever ends the run then finds the spool complete."""
        self.wait_for_final_eval(version)
        self.submit_eval_points()
        if self.reporter is not None:
            self.reporter.flush(2 * self.log_call_s() + 5.0)  # the call under way, then the last one
            if self.tracking is not None and not self.tracking.behind:  # MLflow is up: the tracking counters once
                self.reporter.submit(self.tracking.counters(), version, fresh=True)  # more, after the last call
                self.reporter.flush(self.log_call_s() + 5.0)
        self.ctx.store.put_json(self.ctx.paths.done(), {"version": version, "time": time.time()})

    def close(self, flush_s: float | None = None) -> None:
        """Stop the reporting thread once what is queued reached MLflow (or the tracking spool), or `flush_s`
        (default: one logging call's deadline) passed."""
        if self.reporter is not None:
            self.reporter.close(self.log_call_s() + 5.0 if flush_s is None else flush_s)
