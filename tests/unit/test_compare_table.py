"""`asyncrl compare`'s pure part (asyncrl/compare/table.py), with exact numbers."""

from __future__ import annotations

import math

from asyncrl.compare.table import (
    Point,
    RunHistory,
    by_step,
    comparison_table,
    differing_params,
    final_and_best,
    samples_by_step,
    series,
    text_table,
)


def _run(run_id: str, history: dict[str, list[tuple[int, float, int]]], params: dict[str, str] | None = None,
         latest: dict[str, float] | None = None) -> RunHistory:
    return RunHistory(run_id=run_id, name=f"name-{run_id}", status="FINISHED", start_ms=1_000, end_ms=31_000,
                      params=params or {}, latest=latest or {},
                      history={k: [Point(s, v, t) for s, v, t in pts] for k, pts in history.items()})


def test_by_step_keeps_one_point_per_step_the_later_logged():
    pts = [Point(2, 0.5, 10), Point(1, 0.1, 5), Point(2, 0.7, 20), Point(3, 0.9, 30)]
    assert [(p.step, p.value) for p in by_step(pts)] == [(1, 0.1), (2, 0.7), (3, 0.9)]


def test_series_against_each_axis():
    run = _run("a", {"reward/mean": [(1, 0.2, 3_000), (2, 0.4, 5_500), (3, math.nan, 7_000)],
                     "progress/samples_trained": [(1, 256, 3_000), (2, 512, 5_500), (3, 768, 7_000)]})
    assert series(run, "reward/mean", "step") == [(1.0, 0.2), (2.0, 0.4)]  # NaN left out
    assert series(run, "reward/mean", "wall_s") == [(2.0, 0.2), (4.5, 0.4)]
    assert series(run, "reward/mean", "samples") == [(256, 0.2), (512, 0.4)]
    assert series(run, "eval/accuracy", "step") == []


def test_samples_rebuilt_from_throughput_and_step_time_when_not_logged():
    run = _run("a", {"throughput/samples_per_s": [(1, 100.0, 0), (2, 50.0, 0), (3, 10.0, 0)],
                     "time/step_s": [(1, 2.56, 0), (2, 5.12, 0)]})
    assert samples_by_step(run) == {1: 256, 2: 512}  # step 3 has no step time: no x


def test_final_and_best_follow_the_metrics_direction():
    run = _run("a", {"reward/mean": [(1, 0.5, 0), (2, 0.9, 0), (3, 0.7, 0)],
                     "train/loss": [(1, 0.5, 0), (2, 0.2, 0), (3, 0.3, 0)],
                     "staleness/mean": [(1, 0.4, 0), (2, 0.1, 0)]})
    assert final_and_best(run, "reward/mean") == (0.7, 0.9)
    assert final_and_best(run, "train/loss") == (0.3, 0.2)
    assert final_and_best(run, "staleness/mean") == (0.1, 0.1)
    assert final_and_best(run, "eval/accuracy") == (None, None)


def test_differing_params_ignore_run_identity_and_storage():
    a = _run("a", {}, {"rollout.mode": "sync", "training.lr": "1e-4", "run_id": "a", "storage.bucket": "x",
                       "tracking.experiment": "e", "training.loss": "cispo"})
    b = _run("b", {}, {"rollout.mode": "async", "training.lr": "1e-4", "run_id": "b", "storage.bucket": "y",
                       "tracking.experiment": "e"})
    assert differing_params([a, b]) == ["rollout.mode", "training.loss"]


def test_comparison_table_rows():
    a = _run("aaaaaaaaaa", {"reward/mean": [(1, 0.25, 0), (2, 0.5, 0)]}, {"rollout.mode": "sync"},
             {"steady_samples_per_s": 123.456, "staleness_mean": 0.0})
    b = _run("bbbbbbbbbb", {"reward/mean": [(1, 0.75, 0)]}, {"rollout.mode": "async"}, {"throughput/samples_per_s": 300.0})
    header, rows = comparison_table([a, b], ["reward/mean"])
    assert header == ["run", "status", "steps", "reward/mean final", "reward/mean best", "samples/s", "staleness mean",
                      "wall s", "rollout.mode"]
    assert rows == [["name-aaaaaaaaaa (aaaaaaaa)", "FINISHED", "2", "0.5", "0.5", "123.5", "0", "30", "sync"],
                    ["name-bbbbbbbbbb (bbbbbbbb)", "FINISHED", "1", "0.75", "0.75", "300", "—", "30", "async"]]
    lines = text_table(header, rows).splitlines()
    assert len(lines) == 4 and lines[0].startswith("run ") and set(lines[1]) <= {"-", " "}
