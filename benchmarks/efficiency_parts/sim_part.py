"""The simulator's prediction for the job: `cpu-tiny` cost model (this machine's calibrated constants), one
generation server and one trainer (2 "GPUs", train share 0.5), the job's α, batch and decode lengths.

Decode lengths: the length-tail job's lognormal (median, sigma, capped at max_new_tokens); otherwise a fixed length,
the raw engine's measured mean response (the answers stop at EOS), or max_new_tokens without it. Prompt length: the
raw engine's measured mean, or the task's longest prompt without it.
"""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path
from typing import Any


def simulate_job(cfg: Any, raw: dict[str, Any] | None, steps: int, calibration: Path | None = None) -> dict[str, Any]:
    """The prediction, from `calibration` (a `calibrate_cost_model.py` output; default: the stored one)."""
    from asyncrl.sim import Dist, SimConfig, Workload, preset, rlvr_workload, simulate
    from asyncrl.sim.cost_model import CPU_CALIBRATION

    ro = cfg.rollout
    calibration = calibration or CPU_CALIBRATION
    cost, notes = preset("cpu-tiny", calibration)
    try:
        calibrated_at = json.loads(calibration.read_text()).get("measured_at")
    except (OSError, ValueError):
        calibrated_at = None
    prompt = round(raw["mean_prompt_tokens"]) if raw and raw.get("mean_prompt_tokens") else cfg.task.max_prompt_tokens()
    if ro.length_tail is not None:
        wl = rlvr_workload(ro.length_tail.median_tokens, ro.length_tail.sigma, ro.max_new_tokens, prompt)
        workload = {"kind": "rlvr", "median": ro.length_tail.median_tokens, "sigma": ro.length_tail.sigma,
                    "max_tokens": ro.max_new_tokens, "prompt": prompt}
    else:
        resp = max(1, round(raw["mean_response_tokens"])) if raw and raw.get("mean_response_tokens") else ro.max_new_tokens
        wl = Workload(response_tokens=Dist("fixed", resp, lo=1, hi=resp), prompt_tokens=Dist("fixed", prompt))
        workload = {"kind": "fixed", "median": resp, "prompt": prompt}
    # the run's rollout knobs, mapped once (RolloutConfig.scheduler_config); the simulated job has one writer
    sched = replace(ro.scheduler_config(num_servers=1, writer="sim"), prompts_per_step=ro.prompts_per_step)
    sim = SimConfig(gpus=2, train_share=0.5, mode=ro.mode, scheduler=sched, steps=max(steps, 12), warmup_steps=1,
                    micro_batch_size=cfg.training.micro_batch_size, checkpoint_every=cfg.training.checkpoint_every)
    sim_cfg = {k: v for k, v in sim.flat().items() if k not in ("slowdowns", "failures")}  # what --set can give
    result = simulate(sim, cost, wl).to_dict()
    cli = ("asyncrl simulate --preset cpu-tiny " + " ".join(f"--set {k}={v}" for k, v in sim_cfg.items())
           + " " + " ".join(f"--set workload.{k}={v}" for k, v in workload.items()))
    return {"samples_per_s": result["samples_per_s"], "tokens_per_s": result["tokens_per_s"],
            "step_s": result["mean_step_s"], "gen_busy": result["gen_busy"], "train_busy": result["train_busy"],
            "staleness_mean": result["staleness_mean"], "config": sim_cfg, "workload": workload, "cli": cli,
            "cost": cost.to_dict(), "cost_notes": notes, "calibration": str(calibration),
            "calibrated_at": calibrated_at}
