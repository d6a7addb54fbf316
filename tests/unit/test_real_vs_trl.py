"""The real-job benchmark's figures from an asyncrl run summary and a TRL result: exact numbers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from real_vs_trl import asyncrl_figures, compare, job_settings  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]


def test_the_asyncrl_curve_is_against_the_launchers_wall_clock() -> None:
    summary = {"eval_curve": {"0": 0.18, "8": 0.25, "4": 0.2}, "eval_curve_wall_s": {"0": 60.0, "4": 400.0},
               "eval_accuracy_before": 0.18, "eval_accuracy_after": 0.25, "response_tokens_trained": 9000,
               "train_wall_s": 600.0, "wall_s": 700.0, "final_version": 8, "samples_per_s": 0.9}
    fig = asyncrl_figures(summary)
    assert fig["points"] == [{"version": 0, "accuracy": 0.18, "wall_s": 60.0},
                             {"version": 4, "accuracy": 0.2, "wall_s": 400.0},
                             {"version": 8, "accuracy": 0.25, "wall_s": None}]  # a point without its time
    assert fig["trained_response_tokens_per_s"] == 15.0 and fig["steps"] == 8


def test_compare_reports_the_ratio_and_both_gains() -> None:
    out = compare({"asyncrl": {"trained_response_tokens_per_s": 30.0, "accuracy_before": 0.18, "accuracy_after": 0.3},
                   "trl": {"trained_response_tokens_per_s": 20.0, "accuracy_before": 0.18, "accuracy_after": 0.2}})
    assert out["trained_tokens_per_s"]["ratio"] == 1.5
    assert out["asyncrl_gain"] == pytest.approx(0.12) and out["trl_gain"] == pytest.approx(0.02)
    assert compare({"asyncrl": {"status": "failed"}, "trl": {"status": "unavailable"}}) == {}


def test_compare_reports_trl_colocate_beside_trl() -> None:
    out = compare({"asyncrl": {"trained_response_tokens_per_s": 30.0, "accuracy_before": 0.2, "accuracy_after": 0.5},
                   "trl_colocate": {"trained_response_tokens_per_s": 12.0, "accuracy_before": 0.2,
                                    "accuracy_after": 0.25}})
    assert out["trained_tokens_per_s_vs_trl_colocate"] == {"asyncrl": 30.0, "trl_colocate": 12.0, "ratio": 2.5}
    assert out["trl_colocate_gain"] == pytest.approx(0.05) and "trained_tokens_per_s" not in out


def test_the_alone_parts_measure_the_shipped_jobs_own_trainer_and_engine_settings() -> None:
    job = job_settings(str(ROOT / "configs/real.yaml"), [])
    assert job == {"trainer_variant": "float32_tokens_2048", "engine_threads": 1, "engine_dtype": "float32"}
    other = job_settings(str(ROOT / "configs/real.yaml"),
                         ["generation.cpu_threads=2", "training.micro_batch_tokens=4096"])
    assert other["engine_threads"] == 2 and other["trainer_variant"] == "float32_tokens_4096"


def test_a_trainer_setting_the_alone_part_cannot_run_is_named() -> None:
    with pytest.raises(SystemExit, match="training.matmul_dtype bfloat16, micro_batch_tokens 2048"):
        job_settings(str(ROOT / "configs/real.yaml"), ["training.matmul_dtype=bfloat16"])
    with pytest.raises(SystemExit, match="training.mini_batches 2 x training.epochs 1 optimizer steps"):
        job_settings(str(ROOT / "configs/real.yaml"), ["training.mini_batches=2"])
