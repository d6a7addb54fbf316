"""The `asyncrl simulate` and `asyncrl plan` subcommands (argument parsing and printing only).

    asyncrl simulate [--preset gpu-7b|cpu-tiny] [--set key=value ...] [--json PATH] [--no-baseline]
        keys: any SimConfig field (gpus, mode, train_share, steps, ...) or rollout knob of the scheduler (async_ratio,
        prompts_per_step, group_size, routing, ...: `SCHEDULER_KEYS`), cost.<CostModel field>, workload.<kind|median|sigma|max_tokens|prompt|turns|env_median_s|reward_p|seed>
    asyncrl plan --gpus 64 --model-size 7e9 --median-tokens 3000 --max-tokens 32768 [--json PATH]

`--preset cpu-tiny` defaults to the default job (configs/default.yaml: 32 prompts × 8 samples, micro batch 256, a
checkpoint every 10 steps, one server and one trainer on the 2 cores: gpus=2, train_share=0.5) and its workload
(`workload.kind=calibrated`: the response lengths and prompt length `make calibrate` measured for it; else 6 tokens
of a 6-token prompt). `simulate` also prints the control-plane overheads per step (`step_budget`) and, unless
`--no-baseline`, the same run without them (`CostModel.without_control_plane`): what they cost.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import replace
from pathlib import Path
from typing import Any

from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import PRESETS, calibrated_workload, preset
from asyncrl.sim.overheads import step_budget
from asyncrl.sim.planner import PlanRequest, format_plan, make_plan
from asyncrl.sim.report import format_table
from asyncrl.sim.simulator import simulate
from asyncrl.sim.workload import Dist, Workload, agentic_workload, rlvr_workload

__all__ = ["add_parsers", "run_simulate", "run_plan"]

_WORKLOAD_KEYS = {"kind", "median", "sigma", "max_tokens", "prompt", "turns", "env_median_s", "reward_p", "seed"}


def add_parsers(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    s = sub.add_parser("simulate", help="simulate one job on a virtual cluster (the real scheduler, a cost model)")
    s.add_argument("--preset", default="gpu-7b", choices=PRESETS, help="cost model preset")
    s.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE",
                   help="SimConfig field or scheduler knob, cost.<field> or workload.<field>; "
                   "repeatable")
    s.add_argument("--json", dest="json_path", default=None, help="write the result as JSON here")
    s.add_argument("--no-baseline", action="store_true", help="skip the run without control-plane overheads")
    s.add_argument("--calibration", default=None, help="cpu-tiny calibration file (default: "
                   "benchmarks/results/cost_model_cpu.json)")
    p = sub.add_parser("plan", help="simulate async ratios x training shares for a cluster and recommend one")
    p.add_argument("--gpus", type=int, default=64)
    p.add_argument("--gpus-per-server", type=int, default=1)
    p.add_argument("--model-size", type=float, default=7e9, help="parameters, e.g. 7e9")
    p.add_argument("--median-tokens", type=float, default=3000)
    p.add_argument("--sigma", type=float, default=1.0, help="lognormal sigma of the response length")
    p.add_argument("--max-tokens", type=int, default=32768)
    p.add_argument("--samples-per-gpu", type=int, default=32, help="samples per training step per GPU")
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--json", dest="json_path", default=None, help="write the grid and the choice as JSON here")
    for parser in (s, p):
        parser.add_argument("--log-level", default="WARNING")


def _value(text: str) -> Any:
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for conv in (int, float):
        try:
            return conv(text)
        except ValueError:
            pass
    return text


def _parse_sets(items: list[str]) -> tuple[dict[str, Any], dict[str, Any], dict[str, Any]]:
    sim: dict[str, Any] = {}
    cost: dict[str, Any] = {}
    wl: dict[str, Any] = {}
    for item in items:
        key, sep, raw = item.partition("=")
        if not sep or not key:
            raise ValueError(f"--set {item!r}: expected KEY=VALUE")
        if key.startswith("cost."):
            cost[key[5:]] = _value(raw)
        elif key.startswith("workload."):
            if key[9:] not in _WORKLOAD_KEYS:
                raise ValueError(f"--set {key}: expected workload.<{'|'.join(sorted(_WORKLOAD_KEYS))}>")
            wl[key[9:]] = _value(raw)
        else:
            sim[key.removeprefix("sim.")] = _value(raw)
    return sim, cost, wl


def _workload(spec: dict[str, Any], max_default: int, calibration: Path | None = None) -> Workload:
    kind = spec.get("kind", "rlvr")
    seed = int(spec.get("seed", 0))
    if kind == "rlvr":
        wl = rlvr_workload(float(spec.get("median", 3000)), float(spec.get("sigma", 1.0)),
                           int(spec.get("max_tokens", max_default)), int(spec.get("prompt", 512)), seed)
    elif kind == "agentic":
        wl = agentic_workload(int(spec.get("turns", 5)), float(spec.get("median", 600)), float(spec.get("sigma", 0.8)),
                              int(spec.get("max_tokens", 8192)), float(spec.get("env_median_s", 2.0)), seed)
    elif kind == "fixed":
        n = int(spec.get("median", 256))
        wl = Workload(response_tokens=Dist("fixed", n, lo=1, hi=n), prompt_tokens=Dist("fixed", spec.get("prompt", 64)),
                      seed=seed)
    elif kind == "calibrated":  # the default job's measured lengths (cost_model_cpu.json), else 6 tokens
        measured = calibrated_workload(calibration) if calibration else calibrated_workload()
        prompt = int(spec.get("prompt", measured[0] if measured else 6))
        lengths = tuple(float(x) for x in (measured[1] if measured else (6,)))
        wl = Workload(response_tokens=Dist("empirical", values=lengths, lo=1, hi=max(lengths)),
                      prompt_tokens=Dist("fixed", prompt), seed=seed)
    else:
        raise ValueError(f"workload.kind: expected rlvr|agentic|fixed|calibrated, got {kind!r}")
    if "reward_p" in spec:
        wl = replace(wl, reward_p=float(spec["reward_p"]))
    return wl


CPU_TINY_JOB = {"gpus": 2, "train_share": 0.5, "mode": "async", "async_ratio": 1, "prompts_per_step": 32,
                "group_size": 8, "micro_batch_size": 256, "checkpoint_every": 10, "steps": 12, "warmup_steps": 2}


def run_simulate(args: argparse.Namespace) -> dict[str, Any]:
    sim_kw, cost_kw, wl_kw = _parse_sets(args.overrides)
    calibration = Path(args.calibration) if getattr(args, "calibration", None) else None
    cost, notes = preset(args.preset, calibration)
    cost = cost.with_overrides(**cost_kw)
    small = args.preset == "cpu-tiny"
    cfg = SimConfig.of(**(CPU_TINY_JOB if small else {})).with_overrides(**sim_kw)
    wl = _workload(({"kind": "calibrated"} if small else {}) | wl_kw, 32768, calibration)
    result = simulate(cfg, cost, wl)
    row = result.to_dict()
    print(format_table([row]))
    print(f"over the steps' own time (time/step_s): {result.trainer_samples_per_s:.1f} samples/s, "
          f"wait/train/sync {result.wait_s:.2f}/{result.train_s:.2f}/{result.sync_s:.2f} s per step")
    print(f"§6: mu_gen={result.mu_gen_s:.3f}s L_gen={result.l_gen_s:.2f}s mu_train={result.mu_train_s:.3f}s "
          f"(worker-seconds per sample); bound {result.bound_step_s:.2f}s/step, simulated {result.mean_step_s:.2f}s "
          f"= {result.bound_share:.2f} of it; beta*={result.beta_star:.3f}; max async speedup "
          f"{result.max_speedup_bound:.2f}x")
    print("staleness histogram (samples):", {k: v for k, v in sorted(result.staleness_hist.items())})
    requests = cfg.scheduler.prompts_per_step * (cfg.scheduler.group_size + cfg.scheduler.extra_samples)
    tokens = result.extra.get("tokens_per_step", 0.0)
    budget = step_budget(cost, requests, result.servers, result.extra.get("objects_per_step", 0.0), tokens,
                         cfg.checkpoint_every, decoded=result.tokens_per_s * result.mean_step_s)
    print(f"control-plane overheads at {requests} requests per step (seconds per step): "
          + ", ".join(f"{k} {v:.3f}" for k, v in budget.items()))
    doc = {"config": cfg.flat(),
           "cost": cost.to_dict(), "cost_notes": notes, "preset": args.preset, "result": row,
           "overheads_per_step": budget}
    if not getattr(args, "no_baseline", False) and cost.without_control_plane() != cost:
        base = simulate(cfg, cost.without_control_plane(), wl)
        share = 1 - result.samples_per_s / base.samples_per_s if base.samples_per_s > 0 else 0.0
        print(f"without the control-plane overheads: {base.samples_per_s:.2f} samples/s, {base.mean_step_s:.2f} s "
              f"per step; the overheads cost {share:.1%} of the throughput")
        doc["baseline_without_overheads"] = base.to_dict()
        doc["overheads_throughput_cost"] = share
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=2, default=str))
    return doc


def run_plan(args: argparse.Namespace) -> dict[str, Any]:
    req = PlanRequest(gpus=args.gpus, model_size=args.model_size, median_tokens=args.median_tokens,
                      max_tokens=args.max_tokens, sigma=args.sigma, gpus_per_server=args.gpus_per_server,
                      samples_per_gpu=args.samples_per_gpu, steps=args.steps, warmup_steps=min(2, args.steps - 1))
    plan = make_plan(req)
    print(format_plan(plan))
    doc = plan.to_dict()
    if args.json_path:
        Path(args.json_path).write_text(json.dumps(doc, indent=2, default=str))
    return doc
