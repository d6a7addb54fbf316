"""The LoRA-against-full-fine-tune benchmark's verdict: exact numbers."""

from __future__ import annotations

import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks" / "real_parts"))
from lora_real import figures, full_runs, lora_overrides, run_name, verdicts  # noqa: E402


def _summary(folder: Path, curve: dict[str, float], final: int, wall_s: float) -> Path:
    folder.mkdir(parents=True)
    (folder / "run_summary.json").write_text(json.dumps({"eval_curve": curve, "final_version": final,
                                                         "wall_s": wall_s}))
    return folder


def test_gain_is_the_final_point_less_the_first_and_a_missing_final_point_is_an_error(tmp_path: Path) -> None:
    ok = figures(_summary(tmp_path / "a", {"0": 0.35, "11": 0.5, "20": 0.605}, 20, 1512.0))
    assert (ok["gain"], ok["wall_min"]) == (0.255, 25.2)
    lost = figures(_summary(tmp_path / "b", {"0": 0.35, "11": 0.475}, 20, 1428.0))
    assert "gain" not in lost and lost["error"] == "no evaluation point at the final version 20"
    assert figures(tmp_path / "none")["error"] == "no run_summary.json"


def test_every_lora_seed_must_reach_the_smallest_full_gain_within_the_budget() -> None:
    full = {"f0": {"gain": 0.365}, "f1": {"gain": 0.325}}
    lora = {"l0": {"gain": 0.335, "wall_min": 23.8}, "l1": {"gain": 0.255, "wall_min": 25.2}}
    v = verdicts(lora, full, 30.0)
    assert v["runs"]["l0"] == {"judged": True, "gain": 0.335, "within_or_better": True, "in_budget": True}
    assert v["runs"]["l1"]["within_or_better"] is False and v["met"] is False
    assert verdicts({"l0": lora["l0"]}, full, 30.0)["met"] is True
    assert verdicts({"l0": {**lora["l0"], "wall_min": 31.0}}, full, 30.0)["met"] is False  # over the 30 minutes
    assert verdicts(lora, {"f0": full["f0"]}, 30.0)["met"] is False  # one full seed: no spread to judge by


def test_the_runs_are_named_and_set_by_their_lora_settings() -> None:
    assert run_name(8, 16, 5e-4, 1) == "lora_r8a16_lr0.0005_s1"
    assert lora_overrides(8, 16, 5e-4, 1) == ['training.lora={"rank": 8, "alpha": 16}', "training.lr=0.0005",
                                              "training.seed=1", "generation.seed=1"]


def test_full_runs_come_from_folders_or_from_a_file_of_runs_measured_earlier(tmp_path: Path) -> None:
    folder = _summary(tmp_path / "f0", {"0": 0.35, "20": 0.715}, 20, 1122.0)
    recorded = tmp_path / "recorded.json"
    recorded.write_text(json.dumps({"runs": {"seed1": {"eval_curve": {"0": 0.35, "11": 0.575, "20": 0.675},
                                                       "final_version": 20, "wall_s": 1566.0, "source": "docs"}}}))
    got = full_runs([folder, recorded])
    assert got[str(folder)]["gain"] == 0.365
    assert (got["seed1"]["gain"], got["seed1"]["wall_min"], got["seed1"]["recorded_in"]) == (0.325, 26.1,
                                                                                             str(recorded))
