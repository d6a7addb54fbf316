"""Side-by-side throughput of embedded runs: async against sync, one generation server against two.

Each variant is a real `asyncrl run` (vLLM, DeepSpeed, SeaweedFS, MLflow) of the same config with a few
overrides, one after another on this machine. Prints a table and the ratios against the first variant, and writes
everything to a JSON file.

    .venv/bin/python benchmarks/embedded_throughput.py                       # async vs sync, 1 vs 2 servers
    .venv/bin/python benchmarks/embedded_throughput.py --steps 10 \
        --variant sync:rollout.async_ratio=0 --variant async:rollout.async_ratio=1
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
    "sync_1server:rollout.async_ratio=0,generation.num_servers=1",
    "async_1server:rollout.async_ratio=1,generation.num_servers=1",
    "async_2servers:rollout.async_ratio=1,generation.num_servers=2",
]


def run_variant(name: str, overrides: list[str], args: argparse.Namespace, runs_dir: Path) -> dict:
    run_id = f"bench-{name}-{int(time.time())}"
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", args.config, "--set", f"runs_dir={runs_dir}",
           "--set", f"run_id={run_id}", "--set", f"training.steps={args.steps}", "--set", "eval_before_after=false"]
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
    p.add_argument("--config", default=str(ROOT / "configs/default.yaml"))
    p.add_argument("--steps", type=int, default=15)
    p.add_argument("--variant", action="append", default=[], metavar="NAME:KEY=VALUE[,KEY=VALUE]")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/embedded_throughput.json"))
    p.add_argument("--runs-dir", default=str(ROOT / "runs/bench"))
    args = p.parse_args()
    variants = args.variant or DEFAULT_VARIANTS
    runs_dir = Path(args.runs_dir).resolve()
    results = []
    for v in variants:
        name, _, rest = v.partition(":")
        overrides = [o for o in rest.split(",") if o]
        s = run_variant(name, overrides, args, runs_dir)
        results.append({"name": name, "overrides": overrides, "samples_per_s": s["samples_per_s"],
                        "train_wall_s": s["train_wall_s"], "staleness_mean": s["staleness_mean"],
                        "staleness_max": s["staleness_max"], "samples_trained": s["samples_trained"],
                        "samples_dropped_stale": s["samples_dropped_stale"], "run_id": s["run_id"]})
    base = results[0]["samples_per_s"]
    print(f"\n{'variant':<18}{'samples/s':>11}{'ratio':>8}{'train s':>9}{'stale mean/max':>16}{'dropped':>9}")
    for r in results:
        r["ratio_vs_first"] = r["samples_per_s"] / base if base else None
        print(f"{r['name']:<18}{r['samples_per_s']:>11.2f}{r['ratio_vs_first']:>8.2f}{r['train_wall_s']:>9.1f}"
              f"{r['staleness_mean']:>11.2f}/{r['staleness_max']:<4}{r['samples_dropped_stale']:>9}")
    config = Path(args.config).resolve()
    out = {"benchmark": "embedded_throughput",
           "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config), "steps": args.steps,
           "machine": {"cpus": __import__("os").cpu_count(), "python": platform.python_version()},
           "results": results}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
