"""Agentic RL with slow environments, side by side: synchronous against asynchronous, with and without redundancy.

Two parts, each comparing variants of ONE workload in one run and reporting ratios against the synchronous one.

`real`: the real system on this machine (vLLM, DeepSpeed, SeaweedFS, MLflow, environment steps in worker threads):
`asyncrl run configs/bench_agentic.yaml` (FrozenLake, the built-in tiny model) with injected environment latency
per step, lognormal with mean and std 10 s scaled down 20x to 0.5 s / 0.5 s, and 5% of steps slowed down 10x.
Variants: sync (α = 0, the barrier), async (α = 2), async with redundant environments (α = 2, two extra episodes
per group and two extra groups in flight, first finishers kept). Reports steady-state samples/s and step time.

`sim`: the same comparison at cluster scale in the simulator (`asyncrl.sim`, gpu-7b cost model: assumed), 64 GPUs,
5-turn episodes with lognormal environment latency of mean 10 s and std 10 s per step.

    .venv/bin/python benchmarks/agentic_async_vs_sync.py                 # both parts (~12 min on 2 cores)
    .venv/bin/python benchmarks/agentic_async_vs_sync.py --part sim      # seconds
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

from asyncrl.sim import Dist, SimConfig, Workload, preset, simulate

ROOT = Path(__file__).resolve().parents[1]
OUT = ROOT / "benchmarks/results/agentic_async_vs_sync.json"
REAL_VARIANTS = [
    ("sync", ["rollout.mode=sync"]),
    ("async", ["rollout.async_ratio=2"]),
    ("async_redundant", ["rollout.async_ratio=2", "rollout.extra_samples_per_prompt=2", "rollout.extra_groups=2"]),
]
SIM_VARIANTS = [
    ("sync", {"mode": "sync"}),
    ("async", {"async_ratio": 2}),
    ("async_redundant", {"async_ratio": 2, "extra_samples": 2, "extra_groups": 8}),
]


def lognormal_from_mean_std(mean: float, std: float) -> tuple[float, float]:
    """(median, sigma) of the lognormal with this mean and standard deviation."""
    sigma = math.sqrt(math.log(1.0 + (std / mean) ** 2))
    return mean / math.sqrt(1.0 + (std / mean) ** 2), sigma


def run_real(name: str, overrides: list[str], args: argparse.Namespace) -> dict:
    run_id = f"bench-agentic-{name}-{int(time.time())}"
    runs_dir = Path(args.runs_dir).resolve()
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", args.config, "--set", f"runs_dir={runs_dir}",
           "--set", f"run_id={run_id}", "--set", f"training.steps={args.steps}", "--set", "eval.every_steps=0"]
    for o in overrides:
        cmd += ["--set", o]
    print(f"[real {name}] {' '.join(overrides)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"variant {name} failed:\n{proc.stdout[-2000:]}\n{proc.stderr[-2000:]}")
    s = json.loads((runs_dir / run_id / "run_summary.json").read_text())
    return {"name": name, "overrides": overrides, "samples_per_s": s["steady_samples_per_s"],
            "step_s": s["steady_step_s"], "all_steps_samples_per_s": s["samples_per_s"],
            "train_wall_s": s["train_wall_s"], "staleness_mean": s["staleness_mean"],
            "staleness_max": s["staleness_max"], "samples_trained": s["samples_trained"],
            "run_id": run_id, "bench_wall_s": time.monotonic() - t0}


def run_sim() -> list[dict]:
    cost, _ = preset("gpu-7b")
    median, sigma = lognormal_from_mean_std(10.0, 10.0)
    wl = Workload(response_tokens=Dist("lognormal", 600, 0.8, 1, 8192), prompt_tokens=Dist("fixed", 1024),
                  turns=Dist("fixed", 5, lo=1), env_latency_s=Dist("lognormal", median, sigma, 0.05, 300.0),
                  observation_tokens=Dist("lognormal", 200, 0.5, 1, 2048), agentic=True, seed=0)
    base = SimConfig.of(gpus=64, mode="async", async_ratio=2, train_share=0.25, prompts_per_step=64, group_size=8,
                        steps=8, warmup_steps=2)
    rows = []
    for name, kw in SIM_VARIANTS:
        r = simulate(base.with_overrides(**kw), cost, wl).to_dict()
        rows.append({"name": name, "overrides": kw, "samples_per_s": r["samples_per_s"],
                     "step_s": r["mean_step_s"], "gen_busy": r["gen_busy"], "train_busy": r["train_busy"],
                     "staleness_mean": r["staleness_mean"], "aborted_groups": r["aborted_groups"],
                     "samples_aborted": r["samples_aborted"]})
    return rows


def with_ratios(rows: list[dict]) -> list[dict]:
    base, base_step = rows[0]["samples_per_s"], rows[0]["step_s"]
    for r in rows:
        r["ratio_vs_sync"] = r["samples_per_s"] / base if base else None
        r["step_time_ratio_vs_sync"] = r["step_s"] / base_step if base_step else None
    return rows


def print_rows(title: str, rows: list[dict]) -> None:
    print(f"\n{title}\n{'variant':<18}{'samples/s':>11}{'vs sync':>9}{'step s':>10}{'step vs sync':>14}"
          f"{'staleness':>11}")
    for r in rows:
        print(f"{r['name']:<18}{r['samples_per_s']:>11.3f}{r['ratio_vs_sync']:>9.2f}{r['step_s']:>10.2f}"
              f"{r['step_time_ratio_vs_sync']:>14.2f}{r['staleness_mean']:>11.2f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--part", choices=["real", "sim", "both"], default="both")
    p.add_argument("--config", default=str(ROOT / "configs/bench_agentic.yaml"))
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--runs-dir", default=str(ROOT / "runs/bench"))
    p.add_argument("--out", type=Path, default=OUT)
    args = p.parse_args()
    out: dict = {"benchmark": "agentic_async_vs_sync",
                 "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}}
    if args.part in ("sim", "both"):
        out["sim"] = {"gpus": 64, "cost_preset": "gpu-7b (assumed)", "env_latency": "lognormal mean 10 s std 10 s",
                      "turns": 5, "rows": with_ratios(run_sim())}
        print_rows("simulated, 64 GPUs, 5 turns, environment latency mean 10 s / std 10 s", out["sim"]["rows"])
    if args.part in ("real", "both"):
        rows = with_ratios([run_real(n, o, args) for n, o in REAL_VARIANTS])
        out["real"] = {"config": str(Path(args.config).resolve().relative_to(ROOT)), "steps": args.steps,
                       "rows": rows}
        print_rows("real system on this machine (FrozenLake, injected latency 0.5 s / 0.5 s)", rows)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    if args.out.exists():  # keep the other part's figures from an earlier run
        prev = json.loads(args.out.read_text())
        out = {**{k: v for k, v in prev.items() if k in ("sim", "real")}, **out}
    args.out.write_text(json.dumps(out, indent=2, default=str) + "\n")
    print(f"\nwrote {args.out}")


if __name__ == "__main__":
    main()
