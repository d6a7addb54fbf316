"""The simulated job: cluster shape, placement, rollout knobs, run length, failure and slow-down injection.

`mode="sync"`: colocated, the classic synchronous system: every GPU generates (α forced to 0), then every GPU
trains, then the weights are re-synced. `mode="async"`: disaggregated: `train_share` β of the GPUs train, the
rest serve generation (`gpus // gpus_per_server` servers), both at once. The trainer's job settings that the cost
model needs: `micro_batch_size` (the trainer pads each micro batch to its longest sample; 0: no padding) and
`checkpoint_every` (a checkpoint costs `checkpoint_s` every that many steps; 0: never).
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Literal

from asyncrl.rollout.scheduler import PartialRollout, Routing, SchedulerConfig
from asyncrl.sim.cost_model import CostModel

__all__ = ["SimConfig", "Slowdown", "Failure"]


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
    async_ratio: int = 1
    prompts_per_step: int = 16
    group_size: int = 8
    extra_samples: int = 0
    extra_groups: int = 0
    routing: Routing = "least_tokens"
    replicate: bool = True
    dynamic_filter: bool = False
    partial_rollout: PartialRollout = "continue"
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
        return 0 if self.mode == "sync" else self.async_ratio

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
        return SchedulerConfig(async_ratio=self.alpha, prompts_per_step=self.prompts_per_step,
                               group_size=self.group_size, num_servers=self.num_servers(cost),
                               extra_samples=self.extra_samples, extra_groups=self.extra_groups, routing=self.routing,
                               replicate=self.replicate, dynamic_filter=self.dynamic_filter,
                               partial_rollout=self.partial_rollout, max_new_tokens=max_new_tokens, writer="sim")

    def with_overrides(self, **kw: object) -> SimConfig:
        names = {f.name for f in fields(self)}
        bad = sorted(set(kw) - names)
        if bad:
            raise ValueError(f"sim config: unknown field(s) {bad}; expected one of {sorted(names)}")
        return replace(self, **kw)  # type: ignore[arg-type]
