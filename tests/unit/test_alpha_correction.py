"""The α-correction benchmark's comparison against synchronous training: exact numbers."""

from __future__ import annotations

import sys
from argparse import Namespace
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "real_parts"))
from alpha_correction import collect, compare_to_sync, interpolate, run_specs, still_to_make  # noqa: E402


def test_interpolation_is_linear_between_points_and_held_at_the_ends() -> None:
    curve = {0: 0.35, 10: 0.55, 20: 0.75}
    assert interpolate(curve, 0) == 0.35 and interpolate(curve, 20) == 0.75
    assert abs(interpolate(curve, 11) - 0.57) < 1e-12
    assert interpolate(curve, 25) == 0.75 and interpolate({0: 0.3, 11: 0.6}, 20) == 0.6


def test_points_are_judged_against_the_sync_seeds_spread_at_their_version() -> None:
    runs = {
        "sync_s0": {"label": "sync", "eval_curve": {0: 0.35, 10: 0.60, 20: 0.70}},
        "sync_s1": {"label": "sync", "eval_curve": {0: 0.35, 10: 0.50, 20: 0.66}},
        "a2_s0": {"label": "alpha2", "eval_curve": {0: 0.35, 11: 0.58, 20: 0.64}},
        "a2_s1": {"label": "alpha2", "error": "no run_summary.json"},
    }
    got = compare_to_sync(runs)
    assert [(v["run"], v["version"]) for v in got] == [("a2_s0", 11), ("a2_s0", 20)]
    # at v11 the seeds interpolate to 0.61 and 0.516: 0.58 is within
    assert (got[0]["sync_lo"], got[0]["sync_hi"], got[0]["within"]) == (0.516, 0.61, True)
    assert (got[1]["sync_lo"], got[1]["sync_hi"], got[1]["within"], got[1]["within_or_above"]) == (0.66, 0.7, False,
                                                                                                  False)
    assert compare_to_sync({k: v for k, v in runs.items() if k != "sync_s1"}) == []  # one sync seed: no spread


def test_the_alpha_runs_train_with_ppo_and_the_correction_alone() -> None:
    specs = run_specs(Namespace(seeds=[0, 1], alpha=2, correction="seq_tis"))
    assert [s["name"] for s in specs] == ["sync_s0", "a2seq_tis_s0", "sync_s1", "a2seq_tis_s1"]
    assert specs[1]["overrides"] == ["rollout.async_ratio=2", "training.loss=ppo",
                                     'training.seq_correction={"level": "sequence", "mode": "truncate"}',
                                     "training.seed=0", "generation.seed=0"]
    assert specs[2]["overrides"] == ["rollout.mode=sync", "training.seed=1", "generation.seed=1"]


def test_the_gspo_recipe_takes_two_mini_batches_with_the_aggregation_gspo_needs() -> None:
    from asyncrl.config import load_config

    spec = run_specs(Namespace(seeds=[1], alpha=2, correction="gspo_geo_tis"))[1]
    assert spec["name"] == "a2gspo_geo_tis_s1"
    assert spec["overrides"] == ["rollout.async_ratio=2", "training.loss=gspo",
                                 'training.seq_correction={"level": "geometric", "mode": "truncate"}',
                                 "training.mini_batches=2", "training.aggregation=seq-mean-token-mean",
                                 "training.seed=1", "generation.seed=1"]
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/real.yaml", spec["overrides"])  # it validates
    assert (cfg.training.loss, cfg.training.mini_batches, cfg.rollout.async_ratio) == ("gspo", 2, 2)


def test_a_run_whose_folder_is_gone_is_read_from_the_previous_output_and_marked(tmp_path: Path) -> None:
    specs = [{"name": "sync_s0", "label": "sync", "seed": 0, "overrides": []},
             {"name": "a2_s0", "label": "alpha2", "seed": 0, "overrides": []}]
    previous = {"runs": {"sync_s0": {"label": "sync", "seed": 0, "eval_curve": {"0": 0.35, "20": 0.75}},
                         "a2_s0": {"label": "alpha2", "seed": 0, "error": "no run_summary.json"}}}
    got = collect(specs, tmp_path, previous)["runs"]
    assert got["sync_s0"]["eval_curve"] == {0: 0.35, 20: 0.75} and got["sync_s0"]["from"] == "previous"
    assert got["a2_s0"]["error"] == "no run_summary.json"  # an earlier error is not a result
    assert collect(specs, tmp_path)["runs"]["sync_s0"]["error"] == "no run_summary.json"
    assert [s["name"] for s in still_to_make(specs, previous)] == ["a2_s0"]  # made again: it had no result
    assert still_to_make(specs, None) == specs
