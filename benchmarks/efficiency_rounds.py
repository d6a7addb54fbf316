"""The default job's end to end against its raw engine, in alternating rounds: raw, e2e, raw, e2e, ..., raw.

`benchmarks/efficiency.py` measures the raw engine once before and once after the end-to-end run, and this host's
speed moves within minutes (the raw engine alone, back to back, 1,733-2,196 samples/s), so one e2e / raw figure says
little about whether the 0.5 target is met. Here each end-to-end run sits between two raw-engine runs of its own, and
the ratio of each round is taken against the mean of the two raws around it (and against the one before it, as
`efficiency.py` also reports). Printed and written to JSON: every round's figures, the median ratio and how many
rounds reached the target.

The parts are those of `efficiency.py` (`efficiency_parts.raw_engine`, `efficiency_parts.e2e.run_e2e`), the same
engine settings, prompts and batch; nothing is faked.

    .venv/bin/python benchmarks/efficiency_rounds.py --rounds 4 --out benchmarks/results/efficiency_rounds.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from efficiency import figure
from efficiency_parts.common import JOBS, ROOT, log, run_part
from efficiency_parts.e2e import run_e2e

TARGET = 0.5
E2E_KEYS = ("run_id", "error", "samples_per_s", "step_s", "samples_trained", "control_plane")


def round_ratios(raws: list[float | None], e2es: list[float | None]) -> list[dict[str, float | None]]:
    """Round i: end to end `e2es[i]` between raw engines `raws[i]` (before) and `raws[i + 1]` (after).

    `raws` has one more entry than `e2es`. A figure that is None (its part failed) gives None ratios for the rounds it
    belongs to, never a made-up one."""
    if len(raws) != len(e2es) + 1:
        raise ValueError(f"raws: expected {len(e2es) + 1} figures (one more than the end-to-end runs), got {len(raws)}")
    out = []
    for i, e2e in enumerate(e2es):
        before, after = raws[i], raws[i + 1]
        mean = (before + after) / 2 if before is not None and after is not None else None
        out.append({"raw_before": before, "e2e": e2e, "raw_after": after, "raw_mean": mean,
                    "e2e_vs_raw_before": e2e / before if e2e is not None and before else None,
                    "e2e_vs_raw_mean": e2e / mean if e2e is not None and mean else None})
    return out


def summarise(rounds: list[dict[str, float | None]], target: float = TARGET) -> dict[str, Any]:
    """Median and count at or above `target` of each ratio over the rounds that have it."""
    out: dict[str, Any] = {"target": target}
    for key in ("e2e_vs_raw_mean", "e2e_vs_raw_before"):
        values = [r[key] for r in rounds if r[key] is not None]
        out[key] = {"median": statistics.median(values) if values else None, "min": min(values, default=None),
                    "max": max(values, default=None), "rounds": len(values),
                    "at_or_above_target": sum(v >= target for v in values)}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=4, help="end-to-end runs, each between two raw-engine runs")
    p.add_argument("--steps", type=int, default=40, help="end-to-end training steps per run (steady: all but the first)")
    p.add_argument("--raw-batches", type=int, default=5, help="timed raw-engine batches after the warm-up")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every part")
    p.add_argument("--runs-dir", default=str(ROOT / "runs/bench-efficiency-rounds"))
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/efficiency_rounds.json"))
    args = p.parse_args()
    if args.rounds < 1:
        sys.exit(f"--rounds: expected at least 1, got {args.rounds}")
    from asyncrl.config import load_config

    config, overrides = JOBS["default"], list(args.set)
    cfg = load_config(str(ROOT / config), overrides)
    samples = cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    runs_dir, work = Path(args.runs_dir), Path(args.runs_dir) / "parts"
    t0 = time.monotonic()
    raws: list[dict[str, Any]] = []
    e2es: list[dict[str, Any]] = []

    def raw(i: int) -> None:
        log(f"raw engine {i + 1} of {args.rounds + 1}")
        raws.append(run_part("raw_engine", {"config": config, "overrides": overrides, "batches": args.raw_batches},
                             work / f"raw{i}", timeout_s=1800))
        log(f"raw engine {i + 1}: {figure(raws[-1], 'samples_per_s')} samples/s" + (f" ({raws[-1]['error']})"
                                                                           if "error" in raws[-1] else ""))

    raw(0)
    for i in range(args.rounds):
        run_id = f"effr-{time.strftime('%Y%m%d-%H%M%S')}-{i}"
        e2es.append(run_e2e(config, overrides, args.steps, runs_dir, run_id, samples))
        log(f"end to end {i + 1}: {figure(e2es[-1], 'samples_per_s')} samples/s")
        raw(i + 1)
    rounds = round_ratios([figure(r, "samples_per_s") for r in raws], [figure(e, "samples_per_s") for e in e2es])
    summary = summarise(rounds)
    print("\nround  raw before   e2e   raw after   e2e / raw before   e2e / mean of the two")
    for i, r in enumerate(rounds):
        cells = [r["raw_before"], r["e2e"], r["raw_after"], r["e2e_vs_raw_before"], r["e2e_vs_raw_mean"]]
        print(f"{i + 1:5d}  " + "  ".join("-" if c is None else (f"{c:8.0f}" if c > 10 else f"{c:8.3f}") for c in cells))
    for key, label in (("e2e_vs_raw_mean", "against the mean of the raws around it"),
                       ("e2e_vs_raw_before", "against the raw before it")):
        s = summary[key]
        median = "-" if s["median"] is None else f"{s['median']:.3f}"
        print(f"e2e / raw engine {label}: median {median}, {s['at_or_above_target']} of {s['rounds']} rounds "
              f">= {TARGET}")
    doc = {"measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "config": config, "overrides": overrides,
           "samples_per_step": samples, "steps": args.steps, "wall_s": time.monotonic() - t0, "summary": summary,
           "rounds": rounds, "raw_engine_parts": raws,
           "e2e_parts": [{k: v for k, v in e.items() if k in E2E_KEYS} for e in e2es]}
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(doc, indent=2) + "\n")
    log(f"wrote {out} ({doc['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
