"""The run's steady-state throughput is wall-clock: the bookkeeping between steps counts (exact numbers, fake clock).

`TrainingReport.step_metrics` counts a steady step (every step but the first of a (re)start) from the end of the
step before, so `run_summary.json`'s `steady_samples_per_s` is what the run delivered, where `time/step_s` (the
step's own wait + train + sync) leaves rank 0's publishing, metric queueing and checkpoints out.
"""

from __future__ import annotations

import time
from types import SimpleNamespace

import pytest

from asyncrl.roles import training_report
from asyncrl.roles.training_report import StepResult, Taken, TrainingReport
from asyncrl.storage.run_layout import RunPaths
from asyncrl.types import Group, Sample


def group(gid: str, version: int) -> Group:
    samples = [Sample(group_id=gid, sample_index=i, prompt_token_ids=[1, 2], token_ids=[3, 4], logprobs=[-0.1, -0.2],
                      token_versions=[version] * 2, start_version=version, reward=float(i % 2), finish_reason="stop")
               for i in range(4)]
    return Group(group_id=gid, prompt_index=0, task="arithmetic", samples=samples)


def report() -> TrainingReport:
    stats = SimpleNamespace(retries=0, gave_up=0, requests_total=lambda: 0, missing_gets=lambda: 0)
    cfg = SimpleNamespace(rollout=SimpleNamespace(async_ratio=1, overlong="keep"))
    ctx = SimpleNamespace(store=SimpleNamespace(stats=stats), paths=RunPaths("runs", "r"), cfg=cfg)
    groups = SimpleNamespace(quarantined=[], gaps_skipped=[])
    weights = SimpleNamespace(metrics=lambda: {})
    return TrainingReport(ctx, groups, weights)  # type: ignore[arg-type]


def result(step: int, wait_s: float, train_s: float, sync_s: float) -> StepResult:
    kept = [group(f"g{step}-{k}", max(0, step - 1)) for k in range(2)]
    return StepResult(step, False, {"loss": 0.0}, Taken(kept, [], {"env0": 2}, wait_s=wait_s), train_s=train_s,
                      sync_s=sync_s)


def test_steady_wall_time_runs_from_the_end_of_the_step_before(monkeypatch: pytest.MonkeyPatch) -> None:
    clock = iter([100.0, 100.5, 101.25, 102.0])  # the step ends as step_metrics sees them
    monkeypatch.setattr(training_report, "time", SimpleNamespace(monotonic=lambda: next(clock), time=time.time))
    r = report()  # a (re)start at version 3: its first step, 3, fills the pipeline and is not steady
    metrics = [r.step_metrics(result(step, 0.1, 0.2, 0.05)) for step in (3, 4, 5, 6)]
    c = r.counters
    assert c.steady_steps == 3 and c.steady_samples == 24
    assert c.steady_wall_s == pytest.approx(0.5 + 0.75 + 0.75)  # wall clock, not 3 x 0.35 s of the steps' own time
    assert c.train_wall_s == pytest.approx(4 * 0.35)  # the steps' own wait + train + sync, summed
    assert metrics[-1]["time/step_s"] == pytest.approx(0.35)
    assert metrics[-1]["throughput/samples_per_s"] == pytest.approx(8 / 0.35)
    assert (metrics[-1]["train/response_length_mean"], metrics[-1]["train/truncated_fraction"]) == (2.0, 0.0)
