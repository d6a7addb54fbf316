"""The real job with LoRA against the full fine-tune (issue 38): is a LoRA run's held-out gain in the job's 30
minutes within the full fine-tune's seed spread, or better?

Runs (or reads back) `configs/real.yaml` with `training.lora` (rank, alpha) and `training.lr`, one seed at a time and
alone on the machine (the criterion counts wall time), each into `<runs-dir>/<name>` (a run whose `run_summary.json`
exists is read back, not run again). The full fine-tune's runs are read from the folders given by `--full` (the run
folders holding `run_summary.json`: `make bench-real`'s and `asyncrl run configs/real.yaml --set training.seed=1
--set generation.seed=1`'s, for instance), or from a JSON file of runs measured earlier whose folders are gone
(benchmarks/results/real_full_finetune_seeds.json: the two seeds of 2026-12-06).

Per run: the held-out curve, the gain (last point less the first), the wall time. The verdict for each LoRA run:
its gain at least the smallest of the full fine-tune's gains (within the spread or better), and its wall time at most
`--budget-min` (30).

`python benchmarks/real_parts/lora_real.py --runs-dir /work/exp/lora --lr 4e-4 --full
benchmarks/results/real_full_finetune_seeds.json --out
benchmarks/results/real_lora_vs_full.json` (10-25 min a LoRA run on 2 cores, by host: docs/results.md).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(Path(__file__).resolve().parent))
from alpha_correction import launch  # noqa: E402  (the same real-job launcher, one run at a time here)


def run_name(rank: int, alpha: int, lr: float, seed: int) -> str:
    return f"lora_r{rank}a{alpha}_lr{lr:g}_s{seed}"


def lora_overrides(rank: int, alpha: int, lr: float, seed: int) -> list[str]:
    return [f'training.lora={{"rank": {rank}, "alpha": {alpha}}}', f"training.lr={lr:g}",
            f"training.seed={seed}", f"generation.seed={seed}"]


def run_one(name: str, overrides: list[str], runs_dir: Path) -> Path:
    """The run folder of `name`, made first (alpha_correction's launcher, waited for) unless its summary exists."""
    proc = launch({"name": name, "overrides": overrides}, runs_dir)
    if proc is not None:
        print(f"[lora_real] {name} exited with {proc.wait()}", flush=True)
    return runs_dir / name / name


def figures(folder: Path) -> dict[str, Any]:
    """Curve, gain and wall time of the run in `folder` (an error when its summary or final point is missing)."""
    path = folder / "run_summary.json"
    if not path.exists():
        return {"folder": str(folder), "error": "no run_summary.json"}
    return {"folder": str(folder), **summary_figures(json.loads(path.read_text()))}


def summary_figures(s: dict[str, Any]) -> dict[str, Any]:
    """Curve, gain and wall time from a run summary's `eval_curve`, `final_version` and `wall_s`."""
    curve = {int(k): v for k, v in s["eval_curve"].items()}
    out: dict[str, Any] = {"eval_curve": curve, "wall_min": round(s["wall_s"] / 60, 1),
                           "final_version": s["final_version"]}
    if s["final_version"] not in curve:
        out["error"] = f"no evaluation point at the final version {s['final_version']}"
    else:
        out["gain"] = round(curve[s["final_version"]] - curve[min(curve)], 4)
    return out


def full_runs(paths: list[Path]) -> dict[str, dict[str, Any]]:
    """The full fine-tune's figures: a run folder each, or a JSON file of runs measured earlier whose folders are
    gone (`{"runs": {name: {"eval_curve", "final_version", "wall_s", "source"}}}`), each marked with its file."""
    out: dict[str, dict[str, Any]] = {}
    for path in paths:
        if path.suffix != ".json":
            out[str(path)] = figures(path)
            continue
        for name, s in json.loads(path.read_text())["runs"].items():
            out[name] = {"recorded_in": str(path), "source": s.get("source", ""), **summary_figures(s)}
    return out


def verdicts(lora: dict[str, dict[str, Any]], full: dict[str, dict[str, Any]], budget_min: float) -> dict[str, Any]:
    """Each LoRA run against the full fine-tune's gains: within their spread or better, and within the budget."""
    gains = [f["gain"] for f in full.values() if "gain" in f]
    out: dict[str, Any] = {"full_gains": gains, "runs": {}}
    for name, f in lora.items():
        if "gain" not in f or len(gains) < 2:
            out["runs"][name] = {"judged": False}
            continue
        out["runs"][name] = {"judged": True, "gain": f["gain"], "within_or_better": f["gain"] >= min(gains) - 1e-9,
                             "in_budget": f["wall_min"] <= budget_min}
    judged = [v for v in out["runs"].values() if v["judged"]]
    out["met"] = bool(judged) and len(judged) == len(lora) and all(v["within_or_better"] and v["in_budget"]
                                                                     for v in judged)
    return out


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", type=Path, required=True)
    p.add_argument("--full", type=Path, nargs="+", required=True,
                   help="the full fine-tune's run folders, or a JSON file of its runs measured earlier")
    p.add_argument("--lr", type=float, default=2e-4)
    p.add_argument("--rank", type=int, default=8)
    p.add_argument("--alpha", type=int, default=16)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--budget-min", type=float, default=30.0)
    p.add_argument("--collect-only", action="store_true")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/real_lora_vs_full.json")
    a = p.parse_args(argv)
    lora = {}
    for seed in a.seeds:
        name = run_name(a.rank, a.alpha, a.lr, seed)
        folder = a.runs_dir / name / name
        if not a.collect_only:
            folder = run_one(name, lora_overrides(a.rank, a.alpha, a.lr, seed), a.runs_dir)
        lora[name] = figures(folder)
    full = full_runs(a.full)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "config": "configs/real.yaml",
              "lora": {"rank": a.rank, "alpha": a.alpha, "lr": a.lr}, "full_fine_tune": full, "lora_runs": lora,
              "verdict": verdicts(lora, full, a.budget_min)}
    for name, f in {**full, **lora}.items():
        curve = "  ".join(f"v{k}: {v:.3f}" for k, v in sorted(f.get("eval_curve", {}).items()))
        print(f"{name}: {curve}  gain {f.get('gain')}  wall {f.get('wall_min')} min  {f.get('error', '')}")
    print(json.dumps(result["verdict"], indent=2))
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"written to {a.out}")


if __name__ == "__main__":
    main()
