"""The stability study: does asynchronous training with each off-policy loss match synchronous accuracy?

Each variant is a real `asyncrl run` (vLLM, DeepSpeed, SeaweedFS, MLflow) of configs/stability.yaml on the built-in
arithmetic task, one after another, all with the same seed and the same number of trained samples:
- every policy loss (ppo, decoupled_ppo, tis, cispo, topr) at α = 0 (`rollout.mode=sync`) and at α = 4, and CISPO
  with its unified mask at α = 4;
- AsyPPO (GAE on two mini-critics, decoupled_ppo, 4 critic warm-up steps) at α = 2;
- GRPO with coupled attention credit at α = 2 (horizons scaled to this task's 7-token prompts and 6-token answers:
  W = 4, FAI horizon [1, 8]).
For each it reports greedy held-out accuracy before and after, the training reward accuracy of the first and last
quarter of the steps, the final entropy, and whether training stayed stable: every logged loss, gradient norm,
entropy and importance weight finite, no collapse (held-out accuracy not more than 0.05 below its start, the last
quarter's reward accuracy at least half the first quarter's, entropy above 0.05). Prints a table and writes JSON.

    .venv/bin/python benchmarks/stability.py                      # all 13 variants, about 40 minutes on 2 cores
    .venv/bin/python benchmarks/stability.py --only ppo_a0 --only ppo_a4
    .venv/bin/python benchmarks/stability.py --seed 1                   # a second seed: stability_seed1.json
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

ROOT = Path(__file__).resolve().parents[1]
LOSSES = ("ppo", "decoupled_ppo", "tis", "cispo", "topr")
CREDIT = '{"scaling":"coupled","window":4,"fai_h_lo":1,"fai_h_hi":8}'
VARIANTS: list[tuple[str, list[str]]] = [
    *[(f"{loss}_a{a}", [f"training.loss={loss}", "rollout.mode=sync" if a == 0 else f"rollout.async_ratio={a}"])
      for loss in LOSSES for a in (0, 4)],
    ("cispo_unified_a4", ["training.loss=cispo", "training.loss_params.unified_mask=true", "rollout.async_ratio=4"]),
    ("asyppo_a2", ["training.loss=decoupled_ppo", "training.advantage=gae", "training.asyppo={}",
                   "training.critic.warmup_steps=4", "rollout.async_ratio=2"]),
    ("grpo_credit_a2", ["training.loss=decoupled_ppo", f"training.attention_credit={CREDIT}",
                        "rollout.async_ratio=2"]),
]
WATCHED = ("train/loss", "train/grad_norm", "train/entropy", "train/iw_max", "critic/loss")


def run_variant(name: str, overrides: list[str], config: str, runs_dir: Path, seed: int) -> dict:
    run_id = f"stab-{name}-s{seed}-{int(time.time())}"
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", config, "--set", f"runs_dir={runs_dir}", "--set", f"run_id={run_id}",
           "--set", f"training.seed={seed}", "--set", f"generation.seed={seed}",
           "--set", "tracking.experiment=stability"]  # one experiment: `asyncrl compare --experiment stability`
    for o in overrides:
        cmd += ["--set", o]
    print(f"[{name}] {' '.join(overrides)}", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    wall = time.monotonic() - t0
    if proc.returncode != 0:
        return {"name": name, "overrides": overrides, "run_id": run_id, "failed": True, "wall_s": wall,
                "error": (proc.stdout[-1500:] + proc.stderr[-1500:])}
    summary = json.loads((runs_dir / run_id / "run_summary.json").read_text())
    return {"name": name, "overrides": overrides, "run_id": run_id, "failed": False, "wall_s": wall,
            "summary": summary, "history": metric_history(runs_dir, run_id)}


def metric_history(runs_dir: Path, run_id: str) -> dict[str, list[float]]:
    """Per-step values of the watched metrics and the reward accuracy, from the run's MLflow store."""
    import mlflow
    from mlflow.tracking import MlflowClient

    client = MlflowClient(tracking_uri=f"sqlite:///{runs_dir / 'mlflow.db'}")
    mlflow.set_tracking_uri(f"sqlite:///{runs_dir / 'mlflow.db'}")
    runs = mlflow.search_runs(search_all_experiments=True, filter_string=f"tags.mlflow.runName = '{run_id}'",
                              output_format="list")
    if not runs:
        raise SystemExit(f"no MLflow run named {run_id} in {runs_dir / 'mlflow.db'}")
    rid = runs[0].info.run_id
    out = {}
    for key in (*WATCHED, "reward/accuracy"):
        hist = sorted(client.get_metric_history(rid, key), key=lambda m: m.step)
        out[key] = [m.value for m in hist]
    return out


def assess(r: dict) -> dict:
    """Figures and the stability verdict of one finished variant."""
    if r["failed"]:
        return {"name": r["name"], "stable": False, "reason": "run failed"}
    s, h = r["summary"], r["history"]
    acc = h["reward/accuracy"]
    q = max(1, len(acc) // 4)
    first, last = sum(acc[:q]) / q, sum(acc[-q:]) / q
    nonfinite = [k for k in WATCHED if any(not math.isfinite(v) for v in h[k])]
    entropy_end = h["train/entropy"][-1] if h["train/entropy"] else float("nan")
    reasons = []
    if nonfinite:
        reasons.append(f"non-finite {', '.join(nonfinite)}")
    if s["eval_accuracy_after"] < s["eval_accuracy_before"] - 0.05:
        reasons.append("held-out accuracy fell")
    if last < 0.5 * first:
        reasons.append("reward accuracy collapsed")
    if not entropy_end > 0.05:
        reasons.append("entropy collapsed")
    return {"name": r["name"], "eval_before": s["eval_accuracy_before"], "eval_after": s["eval_accuracy_after"],
            "train_acc_first_quarter": first, "train_acc_last_quarter": last, "entropy_end": entropy_end,
            "iw_max": max(h["train/iw_max"], default=float("nan")), "staleness_mean": s["staleness_mean"],
            "samples_trained": s["samples_trained"], "samples_dropped_stale": s["samples_dropped_stale"],
            "samples_per_s": s["samples_per_s"], "stable": not reasons, "reason": "; ".join(reasons) or "stable"}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--config", default=str(ROOT / "configs/stability.yaml"))
    p.add_argument("--only", action="append", default=[], help="run only these variants (by name)")
    p.add_argument("--seed", type=int, default=0, help="training and sampling seed (the task split stays the same)")
    p.add_argument("--out", default=None, help="default: benchmarks/results/stability.json (seed 0), "
                   "stability_seed<N>.json otherwise")
    p.add_argument("--runs-dir", default=str(ROOT / "runs/stability"))
    args = p.parse_args()
    chosen = [(n, o) for n, o in VARIANTS if not args.only or n in args.only]
    unknown = set(args.only) - {n for n, _ in VARIANTS}
    if unknown:
        raise SystemExit(f"--only: unknown variant(s) {sorted(unknown)}; known: {[n for n, _ in VARIANTS]}")
    runs_dir = Path(args.runs_dir).resolve()
    rows, raw = [], []
    for name, overrides in chosen:
        r = run_variant(name, overrides, args.config, runs_dir, args.seed)
        raw.append({k: v for k, v in r.items() if k != "summary"})
        rows.append(assess(r))
        a = rows[-1]
        print(f"  -> {a.get('eval_before', float('nan')):.3f} -> {a.get('eval_after', float('nan')):.3f} "
              f"{a['reason']} ({r['wall_s']:.0f} s)", flush=True)
    by_name = {r["name"]: r for r in rows}
    for loss in LOSSES:  # the claim: async matches sync
        a0, a4 = by_name.get(f"{loss}_a0"), by_name.get(f"{loss}_a4")
        if a0 and a4 and "eval_after" in a0 and "eval_after" in a4:
            a4["async_minus_sync"] = a4["eval_after"] - a0["eval_after"]
    print(f"\n{'variant':<18}{'before':>8}{'after':>8}{'async-sync':>12}{'acc q1':>8}{'acc q4':>8}{'entropy':>9}"
          f"{'iw max':>8}  verdict")
    for r in rows:
        if "eval_after" not in r:
            print(f"{r['name']:<18}{'':>8}{'':>8}{'':>12}{'':>8}{'':>8}{'':>9}{'':>8}  {r['reason']}")
            continue
        d = r.get("async_minus_sync")
        print(f"{r['name']:<18}{r['eval_before']:>8.3f}{r['eval_after']:>8.3f}{(f'{d:+.3f}' if d is not None else ''):>12}"
              f"{r['train_acc_first_quarter']:>8.3f}{r['train_acc_last_quarter']:>8.3f}{r['entropy_end']:>9.3f}"
              f"{r['iw_max']:>8.2f}  {r['reason']}")
    out_path = Path(args.out or ROOT / "benchmarks/results" / ("stability.json" if args.seed == 0 else
                                                                f"stability_seed{args.seed}.json"))
    if args.only and out_path.exists():  # a partial re-run replaces its variants in the earlier results
        earlier = json.loads(out_path.read_text())
        fresh = {r["name"] for r in rows}
        order = [n for n, _ in VARIANTS]
        rows = sorted([r for r in earlier["rows"] if r["name"] not in fresh] + rows, key=lambda r: order.index(r["name"]))
        raw = sorted([r for r in earlier["runs"] if r["name"] not in fresh] + raw, key=lambda r: order.index(r["name"]))
    config = Path(args.config).resolve()
    out = {"benchmark": "stability", "seed": args.seed,
           "config": str(config.relative_to(ROOT)) if config.is_relative_to(ROOT) else str(config),
           "machine": {"cpus": os.cpu_count(), "python": platform.python_version()}, "rows": rows, "runs": raw}
    out_path.parent.mkdir(parents=True, exist_ok=True)
    out_path.write_text(json.dumps(out, indent=2) + "\n")
    print(f"\nwrote {out_path}")


if __name__ == "__main__":
    main()
