"""`throughput/train_tokens_per_s`: the step's trained tokens (loss mask 1, as the trainer counts them) per second of
its train time, and the trainer's own figures (`padding_fraction`) under `train/` (exact numbers)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from asyncrl.roles.training_report import StepResult, Taken, TrainingReport
from asyncrl.storage.run_layout import RunPaths
from asyncrl.types import Group, Sample


def _report() -> TrainingReport:
    stats = SimpleNamespace(retries=0, gave_up=0, requests_total=lambda: 0, missing_gets=lambda: 0)
    cfg = SimpleNamespace(rollout=SimpleNamespace(async_ratio=1, overlong="keep"))
    ctx = SimpleNamespace(store=SimpleNamespace(stats=stats), paths=RunPaths("runs", "r"), cfg=cfg)
    groups = SimpleNamespace(quarantined=[], gaps_skipped=[])
    return TrainingReport(ctx, groups, SimpleNamespace(metrics=lambda: {}))  # type: ignore[arg-type]


def _result(train_metrics: dict[str, float], train_s: float) -> StepResult:
    samples = [Sample("g", i, [1, 2], [3, 4, 5], [-0.1] * 3, [0] * 3, 0, reward=float(i % 2), finish_reason="stop")
               for i in range(4)]
    return StepResult(0, False, train_metrics, Taken([Group("g", 0, "t", samples)], [], {"env0": 1}, wait_s=0.5),
                      train_s=train_s, sync_s=0.25)


def test_trained_tokens_per_second_of_train_time() -> None:
    report = _report()
    m = report.step_metrics(_result({"loss": 0.1, "tokens": 12.0, "padding_fraction": 0.25}, train_s=2.0))
    assert m["throughput/train_tokens_per_s"] == pytest.approx(6.0)  # 12 tokens in 2 s (not the 2.75 s step)
    assert m["train/padding_fraction"] == 0.25 and m["train/tokens"] == 12.0
    report.step_metrics(_result({"tokens": 5.0}, train_s=1.0))
    assert report.counters.tokens_trained == 17  # the run's total, which run_summary.json reports


def test_a_step_without_an_actor_update_trained_no_tokens() -> None:
    m = _report().step_metrics(_result({"actor_updated": 0.0}, train_s=1.0))  # a critic warm-up step
    assert m["throughput/train_tokens_per_s"] == 0.0
