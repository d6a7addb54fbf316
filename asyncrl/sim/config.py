"""The simulated job: cluster shape, placement, rollout knobs, run length, failure and slow-down injection.

`mode="sync"`: colocated, the classic synchronous system: every GPU generates (α forced to 0), then every GPU
trains, then the weights are re-synced. `mode="async"`: disaggregated: `train_share` β of the GPUs train, the
rest serve generation (`gpus // gpus_per_server` servers), both at once. The trainer's job settings that the cost
model needs: `micro_batch_size` (the trainer pads each micro batch to its longest sample; 0: no padding) and
`checkpoint_every` (a checkpoint costs `checkpoint_s` every that many steps; 0: never).

The rollout knobs are the scheduler's own `SchedulerConfig` (`scheduler`), with its defaults; the simulator sets
the ones it derives (`DERIVED`: the servers from the GPUs, the longest response from the workload). `SimConfig.of`
and `with_overrides` take them by their flat names (`async_ratio=2`, `routing="round_robin"`), as
`asyncrl simulate --set` does.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal

from asyncrl.rollout.scheduler import SchedulerConfig
from asyncrl.sim.cost_model import CostModel

__all__ = ["DEFAULT_JOB", "DERIVED", "SCHEDULER_KEYS", "SimConfig", "Slowdown", "Failure"]

DERIVED: dict[str, str] = {
    "num_servers": "derived from gpus, train_share and cost.gpus_per_server",
    "max_new_tokens": "derived from the workload's longest response (workload.max_tokens)",
    "writer": "the simulator's one writer",
    "incarnation": "a simulated writer never restarts",
}
SCHEDULER_KEYS: tuple[str, ...] = tuple(f.name for f in fields(SchedulerConfig) if f.name not in DERIVED)
DEFAULT_JOB = SchedulerConfig(prompts_per_step=16)
"""The simulated job's rollout knobs: the scheduler's defaults, with 16 prompts per step."""


@dataclass(frozen=True)
class Slowdown:
    server: int
    at_s: float
    factor: float


@dataclass(frozen=True)
class Failure:
    """Server `server` dies at `at_s` (its requests are lost and re-sent); it answers again at `back_at_s`."""

    server: int
    at_s: float
    back_at_s: float | None = None


@dataclass(frozen=True)
class SimConfig:
    """One simulated run. Invariant (checked): at least one generation server and one training GPU."""

    gpus: int = 8
    mode: Literal["sync", "async"] = "async"
    train_share: float = 0.25
    scheduler: SchedulerConfig = DEFAULT_JOB
    micro_batch_size: int = 0
    checkpoint_every: int = 0
    steps: int = 8
    warmup_steps: int = 2
    slowdowns: tuple[Slowdown, ...] = field(default_factory=tuple)
    failures: tuple[Failure, ...] = field(default_factory=tuple)
    check_every: int = 0  # check the scheduler's invariants every this many events (0: at step ends only)
    max_sim_s: float = 1e8

    def __post_init__(self) -> None:
        if self.mode not in ("sync", "async"):
            raise ValueError(f"mode: expected sync|async, got {self.mode!r}")
        if not 0.0 < self.train_share < 1.0:
            raise ValueError(f"train_share: expected 0 < β < 1, got {self.train_share}")
        if self.steps <= self.warmup_steps or self.warmup_steps < 0:
            raise ValueError(f"steps ({self.steps}) must exceed warmup_steps ({self.warmup_steps}) >= 0")
        for f in self.failures:
            if f.back_at_s is not None and f.back_at_s <= f.at_s:
                raise ValueError(f"failure of server {f.server}: back_at_s ({f.back_at_s}) must follow at_s ({f.at_s})")
        if self.gpus < 1:
            raise ValueError(f"gpus: expected >= 1, got {self.gpus}")
        if self.micro_batch_size < 0 or self.checkpoint_every < 0:
            raise ValueError(f"micro_batch_size, checkpoint_every: expected >= 0, got {self.micro_batch_size}, "
                             f"{self.checkpoint_every}")

    @property
    def alpha(self) -> int:
        return 0 if self.mode == "sync" else self.scheduler.async_ratio

    def train_gpus(self, cost: CostModel) -> int:
        if self.mode == "sync":
            return self.gpus
        t = max(1, round(self.train_share * self.gpus))
        if (self.gpus - t) // cost.gpus_per_server < 1:
            raise ValueError(f"gpus={self.gpus}, train_share={self.train_share}: no GPU left for a generation server "
                             f"of {cost.gpus_per_server} GPU(s)")
        return t

    def num_servers(self, cost: CostModel) -> int:
        gen = self.gpus if self.mode == "sync" else self.gpus - self.train_gpus(cost)
        if gen // cost.gpus_per_server < 1:
            raise ValueError(f"gpus={self.gpus}: fewer than one generation server of {cost.gpus_per_server} GPU(s)")
        return gen // cost.gpus_per_server

    def scheduler_config(self, cost: CostModel, max_new_tokens: int) -> SchedulerConfig:
        """The scheduler of this run: `scheduler` with α of the mode and the derived fields."""
        return replace(self.scheduler, async_ratio=self.alpha, num_servers=self.num_servers(cost),
                       max_new_tokens=max_new_tokens, writer="sim", incarnation=0)

    @classmethod
    def of(cls, **kw: Any) -> SimConfig:
        """A SimConfig from flat keys: its own fields and the scheduler's knobs (`SCHEDULER_KEYS`)."""
        return cls().with_overrides(**kw)

    def with_overrides(self, **kw: Any) -> SimConfig:
        """This config with some fields changed, by flat names (own fields or `SCHEDULER_KEYS`); ValueError names an
        unknown or derived one."""
        own = {f.name for f in fields(self)} - {"scheduler"}
        derived = sorted(set(kw) & set(DERIVED))
        if derived:
            raise ValueError("sim config: " + "; ".join(f"{k} is not set here: {DERIVED[k]}" for k in derived))
        bad = sorted(set(kw) - own - set(SCHEDULER_KEYS))
        if bad:
            raise ValueError(f"sim config: unknown field(s) {bad}; expected one of {sorted(own | set(SCHEDULER_KEYS))}")
        sched = {k: v for k, v in kw.items() if k in SCHEDULER_KEYS}
        rest = {k: v for k, v in kw.items() if k in own}
        return replace(self, **rest, scheduler=replace(self.scheduler, **sched))  # type: ignore[arg-type]

    def flat(self) -> dict[str, Any]:
        """Every field by the flat names `of`, `with_overrides` and `asyncrl simulate --set` take (tuples as lists)."""
        out: dict[str, Any] = {}
        for f in fields(self):
            if f.name == "scheduler":
                out |= {k: getattr(self.scheduler, k) for k in SCHEDULER_KEYS}
            else:
                value = getattr(self, f.name)
                out[f.name] = list(value) if isinstance(value, tuple) else value
        return out
