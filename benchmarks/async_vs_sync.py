"""The real system on this machine, side by side: synchronous against asynchronous (α = 1, 2) rollout.

Each variant is a real `asyncrl run` (vLLM, DeepSpeed, SeaweedFS, MLflow) of the same config and workload
(configs/bench_longtail.yaml: long-tailed decode lengths) with a few overrides, one after another. Reports
steady-state samples/s and time per training step (every step but the first, which fills the pipeline), their
ratios against the first variant and against the best synchronous variant (the fair sync, whose engine and trainer
each take both cores while the other waits), staleness and drops; prints a table and writes JSON.

    .venv/bin/python benchmarks/async_vs_sync.py                 # sync, async α=1, async α=2
    .venv/bin/python benchmarks/async_vs_sync.py --steps 8 --variant sync:rollout.mode=sync \
        --variant redundant:rollout.extra_groups=8 --out benchmarks/results/ablation_real.json
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DEFAULT_VARIANTS = [
    "sync:rollout.mode=sync",
    # the fair sync: generation and training never run at once in sync mode, so each may use both cores
    "sync_fair:rollout.mode=sync,generation.cpu_threads=2,training.cpu_threads=2",
    "async_a1:rollout.async_ratio=1",
    "async_a2:rollout.async_ratio=2",
]


def run_variant(name: str, overrides: list[str], args: argparse.Namespace, runs_dir: Path, stamp: str) -> dict:
    run_id = f"bench-{stamp}-{name}"  # one stamp per invocation: `mlflow_filter` in the JSON selects its runs
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", args.config, "--set", f"runs_dir={runs_dir}",
           "--set", f"run_id={run_id}", "--set", f"training.steps={args.steps}",
           "--set", f"tracking.experiment={args.experiment}", "--set", f"eval.every_steps={args.eval_every}"]
    for o in overrides:
        cmd += ["--set", o]
    print(f"[{name}] {' '.join(overrides)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"variant {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    summary = json.loads((runs_dir / run_id / "run_summary.json").read_text())
    summary["bench_wall_s"] = time.monotonic() - t0
    return summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs/bench_longtail.yaml"))
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/async_vs_sync.json"))
    p.add_argument("--runs-dir", default=str(ROOT / "runs/bench"))
    p.add_argument("--eval-every", type=int, default=4, help="eval.every_steps of every variant: held-out curves "
                   "that `make compare` draws (the same cost in every variant)")
    p.add_argument("--experiment", default="async_vs_sync",
                   help="the MLflow experiment of its runs (`make compare` plots the last invocation's)")
    args = p.parse_args()
    variants = args.variant or DEFAULT_VARIANTS
    runs_dir = Path(args.runs_dir).resolve()
    results = []
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    for v in variants:
        name, _, rest = v.partition(":")
        overrides = [o for o in rest.split(",") if o]
        s = run_variant(name, overrides, args, runs_dir, stamp)
        results.append({"name": name, "overrides": overrides, "samples_per_s": s["steady_samples_per_s"],
                        "step_s": s["steady_step_s"], "all_steps_samples_per_s": s["samples_per_s"],
                        "train_wall_s": s["train_wall_s"], "staleness_mean": s["staleness_mean"],
                        "staleness_max": s["staleness_max"], "samples_trained": s["samples_trained"],
                        "samples_dropped_stale": s["samples_dropped_stale"], "run_id": s["run_id"]})
    base, base_step = results[0]["samples_per_s"], results[0]["step_s"]
    syncs = [r["samples_per_s"] for r in results if r["name"].startswith("sync")]
    best_sync = max(syncs) if syncs else None
    print(f"\n{'variant':<14}{'samples/s':>11}{'ratio':>8}{'vs best sync':>14}{'step s':>9}{'step ratio':>12}"
          f"{'stale mean/max':>16}{'dropped':>9}")
    for r in results:
        r["ratio_vs_first"] = r["samples_per_s"] / base if base else None
        r["ratio_vs_best_sync"] = r["samples_per_s"] / best_sync if best_sync else None
        r["step_time_ratio_vs_first"] = r["step_s"] / base_step if base_step else None
        vs_sync = f"{r['ratio_vs_best_sync']:.2f}" if best_sync else "-"
        print(f"{r['name']:<14}{r['samples_per_s']:>11.2f}{r['ratio_vs_first']:>8.2f}{vs_sync:>14}{r['step_s']:>9.2f}"
              f"{r['step_time_ratio_vs_first']:>12.2f}{r['staleness_mean']:>11.2f}/{r['staleness_max']:<4}"
              f"{r['samples_dropped_stale']:>9}")
    config = Path(args.config).resolve()
    out = {"benchmark": "async_vs_sync",
           "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config), "steps": args.steps,
           "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
           # relative to the checkout where it is inside it: `make compare` runs there, in any clone or worktree
           "mlflow": {"runs_dir": str(runs_dir.relative_to(ROOT)) if runs_dir.is_relative_to(ROOT) else str(runs_dir),
                      "experiment": args.experiment,
                      "filter": f"attributes.run_name LIKE 'bench-{stamp}-%'"},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
