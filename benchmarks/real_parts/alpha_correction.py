"""The real job at a large async ratio with a sequence-level correction, against synchronous training (issue 38).

Runs (or reads back) `configs/real.yaml` four ways, each with two seeds by default:
- `sync`: `rollout.mode=sync` (on-policy: generate a batch under the current weights, train, push, repeat);
- `alpha`: `rollout.async_ratio=α` (2 by default) with the recipe named by `--correction`: by default `training.loss=ppo`
  and sequence-level truncated importance sampling, so the correction is the only off-policy term (with one optimizer
  step per batch, ppo's own ratio is 1: docs/algorithms.md §3 and §8). The `gspo_*` and `*_mb2` recipes take two
  mini-batch updates a step, so that the loss's own clip against the step's start binds as well.

Each run goes to `<runs-dir>/<name>` (a run whose `run_summary.json` exists is read back, not run again, so a
stopped benchmark resumes; so is a run that `--previous`, an earlier output of this script, holds). Runs are
sequential unless `--parallel 2` (two at a time: a run's curve is counted in versions, not seconds, so sharing the
cores changes its wall time, not what it learns; the real job needs ~10 GB, so two at most on 24 GiB).

What it reports, per run: the held-out greedy accuracy at each evaluation point (200 problems; the versions at which
the run evaluated), its wall time and mean staleness; from MLflow, the engine-trainer log-prob gap per step
(`train/gap_abs`, `train/gap_k3`) and what the correction did (`train/corr_weight_mean`, capped tokens, masked
sequences). Then, for each α run's evaluation point, the synchronous runs' spread at that version (their curves
interpolated linearly between evaluation points): within means inside [min, max] of the synchronous seeds. The
standard error of one point is about 0.034 (200 problems at ~0.6).

`python benchmarks/real_parts/alpha_correction.py --runs-dir /work/exp/alpha2 --out
benchmarks/results/real_alpha_correction.json` (about 30 min a run alone on 2 cores).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
SEQ_TIS = {"level": "sequence", "mode": "truncate"}
GEO_TIS = {"level": "geometric", "mode": "truncate"}
CORRECTIONS: dict[str, dict[str, Any]] = {  # --correction: the α runs' loss, engine-trainer correction, extra settings
    "seq_tis": {"loss": "ppo", "seq_correction": SEQ_TIS},
    "seq_mis": {"loss": "ppo", "seq_correction": {"level": "sequence", "mode": "mask"}},
    "geo_mis": {"loss": "ppo", "seq_correction": {"level": "geometric", "mode": "mask"}},
    "token_tis": {"loss": "ppo", "seq_correction": {"level": "token", "mode": "truncate"}},
    "seq_tis_mb2": {"loss": "ppo", "seq_correction": SEQ_TIS, "extra": ["training.mini_batches=2"]},
    "gspo_geo_tis": {"loss": "gspo", "seq_correction": GEO_TIS,
                     "extra": ["training.mini_batches=2", "training.aggregation=seq-mean-token-mean"]},
}
MLFLOW_SERIES = ("train/gap_abs", "train/gap_k3", "train/corr_weight_mean", "train/corr_capped_tokens_count",
                 "train/corr_masked_sequences_count", "train/corr_sequences_count", "staleness/mean")


def run_specs(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The runs to make: name, label and `--set` overrides."""
    specs = []
    for seed in args.seeds:
        seeds = [f"training.seed={seed}", f"generation.seed={seed}"]
        specs.append({"name": f"sync_s{seed}", "label": "sync", "seed": seed,
                      "overrides": ["rollout.mode=sync", *seeds]})
        recipe = CORRECTIONS[args.correction]
        specs.append({"name": f"a{args.alpha}{args.correction}_s{seed}", "label": f"alpha{args.alpha}", "seed": seed,
                      "overrides": [f"rollout.async_ratio={args.alpha}", f"training.loss={recipe['loss']}",
                                    f"training.seq_correction={json.dumps(recipe['seq_correction'])}",
                                    *recipe.get("extra", []), *seeds]})
    return specs


def launch(spec: dict[str, Any], runs_dir: Path) -> subprocess.Popen[bytes] | None:
    """Start one run unless its summary exists already; None when there is nothing to run."""
    folder = runs_dir / spec["name"]
    if (folder / spec["name"] / "run_summary.json").exists():
        return None
    folder.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", str(ROOT / "configs/real.yaml"),
           "--set", f"runs_dir={folder}", "--set", f"run_id={spec['name']}"]
    for o in spec["overrides"]:
        cmd += ["--set", o]
    print(f"[real job] starting {spec['name']}: {' '.join(spec['overrides'])}", flush=True)
    with open(folder / "launcher.log", "wb") as log:  # the child writes to its own copy of the descriptor
        return subprocess.Popen(cmd, cwd=ROOT, stdout=log, stderr=subprocess.STDOUT)


def earlier_results(previous: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    """The runs of `previous` (an earlier output of this script) that hold a result, by name; an error is none."""
    return {name: r for name, r in (previous or {}).get("runs", {}).items() if "error" not in r}


def still_to_make(specs: list[dict[str, Any]], previous: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The runs that `previous` does not hold with a result: those are not made again."""
    done = earlier_results(previous)
    return [s for s in specs if s["name"] not in done]


def run_all(specs: list[dict[str, Any]], runs_dir: Path, parallel: int) -> None:
    pending, running = list(specs), []
    while pending or running:
        while pending and len(running) < parallel:
            spec = pending.pop(0)
            proc = launch(spec, runs_dir)
            if proc is not None:
                running.append((spec, proc))
        for spec, proc in list(running):
            if proc.poll() is not None:
                running.remove((spec, proc))
                print(f"[alpha_correction] {spec['name']} exited with {proc.returncode}", flush=True)
        time.sleep(5)


def mlflow_series(folder: Path, name: str) -> dict[str, list[float]]:
    """Per-step values (ordered by step) of MLFLOW_SERIES in the run's embedded store."""
    import mlflow

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{folder / 'mlflow.db'}")
    exps = [e.experiment_id for e in client.search_experiments()]
    runs = [r for r in client.search_runs(exps) if r.info.run_name == name]
    if not runs:
        return {}
    out = {}
    for key in MLFLOW_SERIES:
        hist = sorted(client.get_metric_history(runs[0].info.run_id, key), key=lambda m: m.step)
        out[key] = [round(m.value, 5) for m in hist]
    return out


def interpolate(curve: dict[int, float], version: int) -> float:
    """The curve's value at `version`, linear between its evaluation points (held at its ends)."""
    xs = sorted(curve)
    if version <= xs[0]:
        return curve[xs[0]]
    if version >= xs[-1]:
        return curve[xs[-1]]
    for lo, hi in zip(xs, xs[1:], strict=False):
        if lo <= version <= hi:
            return curve[lo] + (curve[hi] - curve[lo]) * (version - lo) / (hi - lo)
    raise AssertionError("unreachable")


def collect(specs: list[dict[str, Any]], runs_dir: Path, previous: dict[str, Any] | None = None) -> dict[str, Any]:
    """Each run's figures from its folder; a run whose folder is gone is taken from `previous` (an earlier output of
    this script) when it is there without an error, and marked `"from": "previous"`."""
    runs = {}
    earlier = earlier_results(previous)
    for spec in specs:
        folder = runs_dir / spec["name"]
        summary_path = folder / spec["name"] / "run_summary.json"
        if not summary_path.exists():
            old = earlier.get(spec["name"])
            if old is not None:
                runs[spec["name"]] = {**old, "eval_curve": {int(k): v for k, v in old["eval_curve"].items()},
                                      "from": "previous"}
            else:
                runs[spec["name"]] = {"label": spec["label"], "seed": spec["seed"], "error": "no run_summary.json"}
            continue
        s = json.loads(summary_path.read_text())
        series = mlflow_series(folder, spec["name"])
        gaps = series.get("train/gap_abs", [])[1:]  # step 1 trains on version-0 samples only
        runs[spec["name"]] = {
            "label": spec["label"], "seed": spec["seed"], "overrides": spec["overrides"],
            "eval_curve": {int(k): v for k, v in s["eval_curve"].items()}, "wall_min": round(s["wall_s"] / 60, 1),
            "staleness_mean": s["staleness_mean"], "response_tokens_trained": s["response_tokens_trained"],
            "gap_abs_mean": round(sum(gaps) / len(gaps), 4) if gaps else None, "mlflow": series,
        }
    return {"runs": runs, "verdicts": compare_to_sync(runs)}


def compare_to_sync(runs: dict[str, dict[str, Any]]) -> list[dict[str, Any]]:
    """Each non-sync run's evaluation points (version 0 aside) against the synchronous runs' spread at that version;
    none unless two synchronous runs are there."""
    sync = [r for r in runs.values() if r["label"] == "sync" and "error" not in r]
    verdicts: list[dict[str, Any]] = []
    for name, r in runs.items():
        if r["label"] == "sync" or "error" in r or len(sync) < 2:
            continue
        for version, acc in sorted(r["eval_curve"].items()):
            if version == 0:
                continue
            band = [interpolate(x["eval_curve"], version) for x in sync]
            lo, hi = min(band), max(band)
            verdicts.append({"run": name, "version": version, "accuracy": acc, "sync_lo": round(lo, 4),
                             "sync_hi": round(hi, 4), "within_or_above": acc >= lo - 1e-9,
                             "within": lo - 1e-9 <= acc <= hi + 1e-9})
    return verdicts


def report(result: dict[str, Any]) -> None:
    print("\nrun                 label    curve (version: held-out accuracy)             wall   staleness  gap_abs")
    for name, r in result["runs"].items():
        if "error" in r:
            print(f"{name:<19} {r['label']:<8} {r['error']}")
            continue
        curve = "  ".join(f"v{k}: {v:.3f}" for k, v in sorted(r["eval_curve"].items()))
        print(f"{name:<19} {r['label']:<8} {curve:<46} {r['wall_min']:5.1f}m  {r['staleness_mean']:.2f}"
              f"       {r['gap_abs_mean']}{'  (from --previous)' if r.get('from') == 'previous' else ''}")
    for v in result["verdicts"]:
        where = "within" if v["within"] else ("above" if v["within_or_above"] else "BELOW")
        print(f"{v['run']} v{v['version']}: {v['accuracy']:.3f} against sync [{v['sync_lo']:.3f}, "
              f"{v['sync_hi']:.3f}]: {where}")


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--runs-dir", type=Path, required=True)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/real_alpha_correction.json")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    p.add_argument("--alpha", type=int, default=2)
    p.add_argument("--correction", choices=sorted(CORRECTIONS), default="seq_tis")
    p.add_argument("--parallel", type=int, choices=(1, 2), default=1)
    p.add_argument("--collect-only", action="store_true", help="read back the runs there, start none")
    p.add_argument("--names", type=json.loads, default=None,
                   help='JSON map from the default run names to the folders used instead (runs made by hand)')
    p.add_argument("--previous", type=Path, default=None,
                   help="an earlier output of this script: runs whose folders are gone are read from it")
    a = p.parse_args(argv)
    previous = json.loads(a.previous.read_text()) if a.previous else None
    specs = run_specs(a)
    if a.names:
        for s in specs:
            s["name"] = a.names.get(s["name"], s["name"])
    if not a.collect_only:
        run_all(still_to_make(specs, previous), a.runs_dir, a.parallel)
    result = {"date": time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), "alpha": a.alpha,
              "correction": CORRECTIONS[a.correction]["seq_correction"],
              "recipe": CORRECTIONS[a.correction], "config": "configs/real.yaml",
              **collect(specs, a.runs_dir, previous)}
    report(result)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nwritten to {a.out}")


if __name__ == "__main__":
    main()
