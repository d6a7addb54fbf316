"""Simulated scaling: 1 … 1,024 generation workers, synchronous against asynchronous, on an RLVR-like workload.

The real rollout scheduler driven by the simulator (asyncrl.sim) with the `gpu-7b` cost model (assumed
constants, see asyncrl/sim/cost_model.py). Workload: lognormal response lengths, median 3,000 tokens, sigma 1.0,
clipped to [1, 32,768]; 512-token prompts; 8 samples per prompt.

Cluster per row: K generation workers (one GPU each) plus T = ceil(K/4) training GPUs (β ≈ 0.2). The async
system runs them disaggregated (α = 2 by default); the sync baseline is the classic colocated system on the same
K + T GPUs (all generate, then all train, α = 0). Batch scaled with the workers: 4 prompts × 8 samples = 32
samples per step per generation worker (N = 32·K). Scaling efficiency = async throughput at 8·K workers /
throughput at K workers (ideal 8).

    .venv/bin/python benchmarks/scaling.py [--max-workers 1024] [--alpha 2]   # ~2-3 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import math
import time
from pathlib import Path

from asyncrl.sim import SimConfig, preset, rlvr_workload, simulate
from asyncrl.sim.report import format_table

OUT = Path(__file__).resolve().parent / "results" / "scaling.json"
PROMPTS_PER_WORKER, GROUP = 4, 8


def run(k: int, alpha: int, cost, wl) -> dict:  # type: ignore[no-untyped-def]
    t = math.ceil(k / 4)
    g = k + t
    steps = 6 if k < 512 else 5
    common = SimConfig.of(gpus=g, prompts_per_step=PROMPTS_PER_WORKER * k, group_size=GROUP, steps=steps,
                          warmup_steps=2)
    t0 = time.monotonic()
    sync = simulate(common.with_overrides(mode="sync"), cost, wl)
    fast = simulate(common.with_overrides(mode="async", async_ratio=alpha, train_share=t / g), cost, wl)
    assert fast.servers == k and fast.train_gpus == t, (fast.servers, fast.train_gpus)
    return {"workers": k, "train_gpus": t, "gpus": g, "samples_per_step": sync.samples_per_step,
            "sync_samples_per_s": sync.samples_per_s, "async_samples_per_s": fast.samples_per_s,
            "speedup": fast.samples_per_s / sync.samples_per_s, "sync_gen_busy": sync.gen_busy,
            "async_gen_busy": fast.gen_busy, "async_train_busy": fast.train_busy,
            "staleness_mean": fast.staleness_mean, "bound_share": fast.bound_share,
            "max_speedup_bound": fast.max_speedup_bound, "wall_s": time.monotonic() - t0,
            "sync": sync.to_dict(), "async": fast.to_dict()}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--max-workers", type=int, default=1024)
    ap.add_argument("--alpha", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    cost, notes = preset("gpu-7b")
    wl = rlvr_workload(median=3000, sigma=1.0, max_tokens=32768, prompt=512, seed=0)
    rows: list[dict] = []
    k = 1
    while k <= args.max_workers:
        rows.append(run(k, args.alpha, cost, wl))
        print(f"K={k}: {rows[-1]['wall_s']:.1f}s", flush=True)
        k *= 2
    by_k = {r["workers"]: r for r in rows}
    for r in rows:
        base = by_k.get(r["workers"] // 8)
        r["scaling_efficiency_8x"] = r["async_samples_per_s"] / base["async_samples_per_s"] if base else None
        r["sync_scaling_8x"] = r["sync_samples_per_s"] / base["sync_samples_per_s"] if base else None
    cols = [("workers", "{}"), ("gpus", "{}"), ("samples_per_step", "{}"), ("sync_samples_per_s", "{:.2f}"),
            ("async_samples_per_s", "{:.2f}"), ("speedup", "{:.2f}"), ("scaling_efficiency_8x", "{:.2f}"),
            ("sync_scaling_8x", "{:.2f}"), ("sync_gen_busy", "{:.2f}"), ("async_gen_busy", "{:.2f}"),
            ("staleness_mean", "{:.2f}"), ("bound_share", "{:.2f}"), ("max_speedup_bound", "{:.2f}"),
            ("wall_s", "{:.1f}")]
    print(format_table(rows, cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"benchmark": "scaling (simulated)", "alpha": args.alpha, "cost_preset": "gpu-7b",
                                    "cost": cost.to_dict(), "cost_notes": notes,
                                    "workload": "lognormal median 3000 sigma 1.0 clip [1, 32768], prompt 512",
                                    "batch": f"{PROMPTS_PER_WORKER} prompts x {GROUP} samples per generation worker",
                                    "rows": rows}, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
