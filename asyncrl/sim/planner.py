"""The planner: simulate a grid of async ratios × training shares for a cluster and recommend the fastest.

α = 0 is the synchronous colocated system (every GPU generates, then trains); α > 0 runs disaggregated with a
share β of the GPUs training. Costs come from the GPU preset scaled to the model size; lengths are lognormal
(median, sigma) clipped to max_tokens. §6's β* per α is printed next to the simulated grid, evaluated with
μ_gen, L_gen, μ_train measured in the synchronous run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import preset, scaled_for_model
from asyncrl.sim.report import format_table
from asyncrl.sim.simulator import simulate
from asyncrl.sim.theory import best_train_share
from asyncrl.sim.workload import rlvr_workload

__all__ = ["PlanRequest", "Plan", "make_plan", "format_plan"]


@dataclass(frozen=True)
class PlanRequest:
    gpus: int = 64
    model_size: float = 7e9
    median_tokens: float = 3000
    max_tokens: int = 32768
    sigma: float = 1.0
    gpus_per_server: int = 1
    samples_per_gpu: int = 32  # samples per training step per GPU of the cluster (the batch grows with it)
    group_size: int = 8
    alphas: tuple[int, ...] = (0, 1, 2, 4, 8)
    shares: tuple[float, ...] = (0.125, 0.25, 0.375, 0.5)
    steps: int = 6
    warmup_steps: int = 2
    seed: int = 0


@dataclass
class Plan:
    request: PlanRequest
    rows: list[dict[str, Any]]
    best: dict[str, Any]
    beta_star: dict[int, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {"request": self.request.__dict__, "rows": self.rows, "best": self.best,
                "beta_star": {str(k): v for k, v in self.beta_star.items()}}


def make_plan(req: PlanRequest) -> Plan:
    """Simulate every (α, β) of the grid (α = 0: one synchronous run) and pick the highest samples/s."""
    if req.gpus < 2 * req.gpus_per_server:
        raise ValueError(f"gpus: expected at least 2 × gpus_per_server ({2 * req.gpus_per_server}), got {req.gpus}")
    base, _ = preset("gpu-7b")
    cost = scaled_for_model(base, req.model_size).with_overrides(gpus_per_server=req.gpus_per_server)
    wl = rlvr_workload(req.median_tokens, req.sigma, req.max_tokens, seed=req.seed)
    w = max(1, req.gpus * req.samples_per_gpu // req.group_size)
    common = SimConfig.of(gpus=req.gpus, prompts_per_step=w, group_size=req.group_size, steps=req.steps,
                          warmup_steps=req.warmup_steps)
    rows: list[dict[str, Any]] = []
    sync = None
    for alpha in req.alphas:
        if alpha == 0:
            sync = simulate(common.with_overrides(mode="sync", async_ratio=0), cost, wl)
            rows.append(sync.to_dict())
            continue
        for share in req.shares:
            cfg = common.with_overrides(mode="async", async_ratio=alpha, train_share=share)
            try:
                cfg.num_servers(cost)
            except ValueError:
                continue
            rows.append(simulate(cfg, cost, wl).to_dict())
    if not rows:
        raise ValueError("planner: the grid is empty (no α, or no β leaves a generation server)")
    best = max(rows, key=lambda r: r["samples_per_s"])
    for r in rows:
        r["speedup_vs_sync"] = r["samples_per_s"] / sync.samples_per_s if sync else None
    beta_star: dict[int, float] = {}
    if sync is not None:
        k = max(1, req.gpus // req.gpus_per_server)
        for alpha in req.alphas:
            if alpha > 0:
                beta_star[alpha] = best_train_share(sync.samples_per_step, k, sync.mu_gen_s, sync.l_gen_s,
                                                    sync.mu_train_s, alpha, cost.epochs)
    return Plan(req, rows, best, beta_star)


PLAN_COLUMNS = [("mode", "{}"), ("alpha", "{}"), ("train_share", "{:.3f}"), ("servers", "{}"), ("train_gpus", "{}"),
                ("mean_step_s", "{:.1f}"), ("samples_per_s", "{:.2f}"), ("speedup_vs_sync", "{:.2f}"),
                ("gen_busy", "{:.2f}"), ("train_busy", "{:.2f}"), ("staleness_mean", "{:.2f}"),
                ("bound_share", "{:.2f}")]


def format_plan(plan: Plan) -> str:
    b = plan.best
    lines = [format_table(plan.rows, PLAN_COLUMNS), ""]
    if plan.beta_star:
        lines.append("§6 best training share β* (μ_gen, L_gen, μ_train of the sync run): "
                     + ", ".join(f"α={a}: {v:.3f}" for a, v in plan.beta_star.items()))
    lines.append(f"recommended: mode={b['mode']} async_ratio={b['alpha']} train_share={b['train_share']:.3f} "
                 f"({b['servers']} generation servers, {b['train_gpus']} training GPUs): "
                 f"{b['samples_per_s']:.2f} samples/s, {b['mean_step_s']:.1f} s/step, "
                 f"{b.get('speedup_vs_sync') or 1:.2f}x sync")
    return "\n".join(lines)
