"""The report of one simulated run: throughput, GPU busy fractions, staleness, drops, and the §6 bound.

Measured over the window after the warm-up steps. §6 quantities (worker = one generation server's GPUs; K = all
GPUs of the job in workers, training ones included, as in the β split of §6):
- μ_gen = generation worker-seconds (server busy time) per sample generated in the window;
- μ_train = training worker-seconds per trained sample and epoch;
- L_gen = the longest sample generation latency (first request → scored) in the window;
- bound = `(N/K)(μ_gen + E·μ_train) + L_gen/(α+1)`; `bound_share` = simulated mean step time / bound.
Throughput two ways: `samples_per_s` over the window's wall time (every second counts: what a real run's
`steady_samples_per_s` measures), and `trainer_samples_per_s` over the sum of the steps' wait + train + sync (a real
run's `time/step_s`), its bookkeeping between steps (publish, MLflow, checkpoints) left out; with the mean
`wait_s`, `train_s`, `sync_s` per step (`time/wait_s`, ...). `failed_requests`: requests lost at a failed
server (re-sent elsewhere, `RolloutScheduler.request_lost`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from asyncrl.rollout.scheduler import RolloutScheduler
from asyncrl.sim.config import SimConfig
from asyncrl.sim.cost_model import CostModel
from asyncrl.sim.server import SimServer
from asyncrl.sim.theory import async_step_bound, best_train_share, max_speedup
from asyncrl.sim.trainer import SimTrainer


class FinishedRun(Protocol):
    """What `build_result` reads of a finished simulation (`asyncrl.sim.simulator.Simulator`)."""

    now: float
    cfg: SimConfig
    cost: CostModel
    sched: RolloutScheduler
    servers: Sequence[SimServer]
    trainer: SimTrainer
    train_gpus: int
    window: dict[str, float]
    latencies: list[float]
    failed_requests: int

__all__ = ["SimResult", "build_result", "format_table"]


@dataclass
class SimResult:
    mode: str
    gpus: int
    servers: int
    train_gpus: int
    alpha: int
    train_share: float
    samples_per_step: int
    steps: int
    sim_time_s: float
    mean_step_s: float
    samples_per_s: float
    tokens_per_s: float
    gen_busy: float
    train_busy: float
    staleness_mean: float
    staleness_max: int
    staleness_hist: dict[int, int]
    dropped_stale: int
    aborted_groups: int
    aborted_stale_groups: int
    aborted_surpassed_groups: int
    aborted_failed_groups: int
    filtered_groups: int
    samples_aborted: int
    failed_requests: int
    resubmits: int
    mu_gen_s: float
    l_gen_s: float
    mu_train_s: float
    bound_step_s: float
    bound_share: float
    max_speedup_bound: float
    beta_star: float
    trainer_samples_per_s: float = 0.0
    wait_s: float = 0.0
    train_s: float = 0.0
    sync_s: float = 0.0
    servers_lost: int = 0
    refill_exhausted_groups: int = 0  # dynamic filtering: all-equal groups emitted past max_refill
    extra: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["staleness_hist"] = {str(k): v for k, v in sorted(self.staleness_hist.items())}
        return d


def build_result(sim: FinishedRun) -> SimResult:
    cfg, cost, s, tr = sim.cfg, sim.cost, sim.sched.stats, sim.trainer
    w0 = sim.window
    measured = tr.step_samples[cfg.warmup_steps:]
    timings = tr.steps[cfg.warmup_steps:]
    span = max(1e-12, sim.now - w0["t"])
    n_steps = len(measured)
    samples = sum(m[0] for m in measured)
    generated = sum(m[2] for m in measured)
    gen_busy_s = sum(x.busy_s for x in sim.servers) - w0["gen_busy_s"]
    train_busy_s = tr.busy_s - w0["train_busy_s"]
    lat = sim.latencies[int(w0["latencies"]):] or sim.latencies or [0.0]
    per_worker = cost.gpus_per_server
    k_workers = max(1, cfg.gpus // per_worker)
    n = cfg.scheduler.prompts_per_step * cfg.scheduler.group_size
    mu_gen = gen_busy_s / max(1, len(lat))
    mu_train = train_busy_s * sim.train_gpus / per_worker / max(1, samples) / cost.epochs
    l_gen = max(lat)
    mean_step = span / max(1, n_steps)
    bound = async_step_bound(n, k_workers, mu_gen, l_gen, mu_train, cfg.alpha, cost.epochs)
    total = sum(tr.staleness.values())
    measured_s = sum(sum(t) for t in timings)
    return SimResult(
        mode=cfg.mode, gpus=cfg.gpus, servers=len(sim.servers), train_gpus=sim.train_gpus, alpha=cfg.alpha,
        train_share=sim.train_gpus / cfg.gpus if cfg.mode == "async" else 1.0, samples_per_step=n,
        steps=len(tr.step_ends), sim_time_s=sim.now, mean_step_s=mean_step, samples_per_s=samples / span,
        tokens_per_s=generated / span, gen_busy=gen_busy_s / (span * len(sim.servers)),
        train_busy=train_busy_s / span,
        staleness_mean=sum(k * v for k, v in tr.staleness.items()) / max(1, total),
        staleness_max=max(tr.staleness, default=0), staleness_hist=dict(tr.staleness),
        dropped_stale=tr.dropped_stale, aborted_groups=s.aborted_groups, aborted_stale_groups=s.aborted_stale_groups,
        aborted_surpassed_groups=s.aborted_surpassed_groups, aborted_failed_groups=s.aborted_failed_groups,
        filtered_groups=s.filtered_groups, samples_aborted=s.samples_aborted, failed_requests=sim.failed_requests,
        resubmits=s.resubmits, mu_gen_s=mu_gen, l_gen_s=l_gen, mu_train_s=mu_train, bound_step_s=bound,
        bound_share=mean_step / bound if bound > 0 else 0.0,
        max_speedup_bound=max_speedup(n, k_workers, mu_gen, l_gen, mu_train, cost.epochs),
        beta_star=best_train_share(n, k_workers, mu_gen, l_gen, mu_train, cfg.alpha, cost.epochs),
        trainer_samples_per_s=samples / measured_s if measured_s > 0 else 0.0,
        wait_s=_mean([t[0] for t in timings]), train_s=_mean([t[1] for t in timings]),
        sync_s=_mean([t[2] for t in timings]), servers_lost=s.servers_lost,
        refill_exhausted_groups=s.refill_exhausted_groups,
        extra={"tokens_per_step": sum(m[1] for m in measured) / max(1, n_steps),
               "objects_per_step": (tr.objects_written - w0.get("objects", 0.0)) / max(1, n_steps)})


def _mean(xs: list[float]) -> float:
    return sum(xs) / len(xs) if xs else 0.0


COLUMNS = [("mode", "{}"), ("gpus", "{}"), ("servers", "{}"), ("train_gpus", "{}"), ("alpha", "{}"),
           ("mean_step_s", "{:.2f}"), ("samples_per_s", "{:.2f}"), ("tokens_per_s", "{:.0f}"), ("gen_busy", "{:.2f}"),
           ("train_busy", "{:.2f}"), ("staleness_mean", "{:.2f}"), ("staleness_max", "{}"),
           ("dropped_stale", "{}"), ("aborted_groups", "{}"), ("bound_step_s", "{:.2f}"), ("bound_share", "{:.2f}")]


def format_table(rows: list[dict[str, Any]], columns: list[tuple[str, str]] | None = None) -> str:
    """A fixed-width text table of result dicts (missing cells print as '-')."""
    cols = columns or COLUMNS
    cells = [[name for name, _ in cols]]
    for r in rows:
        cells.append([fmt.format(r[name]) if name in r and r[name] is not None else "-" for name, fmt in cols])
    widths = [max(len(row[i]) for row in cells) for i in range(len(cols))]
    return "\n".join("  ".join(c.rjust(w) for c, w in zip(row, widths, strict=True)) for row in cells)
