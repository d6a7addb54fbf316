"""Simulated ablation: each rollout technique on and off, on an RLVR-like workload (gpu-7b cost model, assumed).

Base: 40 GPUs, asynchronous disaggregated, α = 2, 8 training GPUs (β = 0.2) and 32 generation servers, 128
prompts × 8 samples per step (32 samples per generation worker), lognormal lengths (median 3,000, sigma 1.0,
max 32,768). Each group changes one knob against the base:
- queue scheduling: routing least_tokens / least_requests / round_robin (also with one server 3× slower);
- prompt replication: replicate True / False;
- redundancy: extra_groups 0 / 8, extra_samples 0 / 2;
- async ratio: sync colocated (α = 0), disaggregated α = 0, 1, 2, 4, 8;
- training share of the GPUs: β = 0.1 … 0.5.

    .venv/bin/python benchmarks/ablation.py          # about a minute on 2 cores
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from asyncrl.sim import SimConfig, Slowdown, preset, rlvr_workload, simulate
from asyncrl.sim.report import format_table

OUT = Path(__file__).resolve().parent / "results" / "ablation_sim.json"
BASE = SimConfig.of(gpus=40, mode="async", async_ratio=2, train_share=0.2, prompts_per_step=128, group_size=8,
                    steps=6, warmup_steps=2)
SLOW = (Slowdown(0, 0.0, 3.0),)

VARIANTS: list[tuple[str, str, dict]] = [
    ("routing", "least_tokens", {"routing": "least_tokens"}),
    ("routing", "least_requests", {"routing": "least_requests"}),
    ("routing", "round_robin", {"routing": "round_robin"}),
    ("routing_slow_server", "least_tokens", {"routing": "least_tokens", "slowdowns": SLOW}),
    ("routing_slow_server", "round_robin", {"routing": "round_robin", "slowdowns": SLOW}),
    ("replication", "replicate=True", {"replicate": True}),
    ("replication", "replicate=False", {"replicate": False}),
    ("redundancy", "none", {}),
    ("redundancy", "extra_groups=8", {"extra_groups": 8}),
    ("redundancy", "extra_samples=2", {"extra_samples": 2}),
    ("async_ratio", "sync colocated", {"mode": "sync"}),
    *[("async_ratio", f"alpha={a}", {"async_ratio": a}) for a in (0, 1, 2, 4, 8)],
    *[("train_share", f"beta={b}", {"train_share": b}) for b in (0.1, 0.2, 0.3, 0.4, 0.5)],
]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, default=OUT)
    args = ap.parse_args()
    cost, notes = preset("gpu-7b")
    wl = rlvr_workload(median=3000, sigma=1.0, max_tokens=32768, prompt=512, seed=0)
    rows: list[dict] = []
    for group, name, kw in VARIANTS:
        t0 = time.monotonic()
        r = simulate(BASE.with_overrides(**kw), cost, wl).to_dict()
        rows.append({"technique": group, "variant": name, "wall_s": time.monotonic() - t0} | r)
    firsts: dict[str, float] = {}
    for r in rows:
        firsts.setdefault(r["technique"], r["samples_per_s"])
        r["vs_first_in_group"] = r["samples_per_s"] / firsts[r["technique"]]
    cols = [("technique", "{}"), ("variant", "{}"), ("servers", "{}"), ("train_gpus", "{}"),
            ("samples_per_s", "{:.2f}"), ("vs_first_in_group", "{:.2f}"), ("mean_step_s", "{:.1f}"),
            ("gen_busy", "{:.2f}"), ("train_busy", "{:.2f}"), ("staleness_mean", "{:.2f}"),
            ("aborted_groups", "{}"), ("samples_aborted", "{}"), ("bound_share", "{:.2f}")]
    print(format_table(rows, cols))
    args.out.parent.mkdir(parents=True, exist_ok=True)
    base = BASE.flat()
    args.out.write_text(json.dumps({"benchmark": "ablation (simulated)", "base": base, "cost_preset": "gpu-7b",
                                    "cost": cost.to_dict(), "cost_notes": notes, "rows": rows}, indent=2, default=str))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
