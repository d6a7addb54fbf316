"""The control-plane overhead terms of the simulator, as pure pieces the event loop composes (no clock, no I/O).

How the simulator applies the `CostModel`'s control-plane constants (see its docstring for what each measures):
- `FifoStage`: a serial CPU resource (one environment writer's event loop, one server's front end): a request
  entering at t with work w leaves at `max(t, free) + w` and the stage is busy until then. A burst of n requests
  admitted together reaches the engine spread over n·w seconds, as the real requests trickle in;
- `score_latency`: a finished sample's answer reaches the environment `http_call_s` after the engine returns it
  (the simulator's "answer" event), and its reward `score_call_s + score_s·n` after that, n the samples one
  completion returned together (one reward call);
- `object_seconds`: a group object's PUT or GET + decode: `fixed + per_token · tokens`;
- `PollSchedule`: the trainer's prefetch thread: after a poll (it ends on a miss), the next poll is
  `s3_get_s + wait` later, the wait `poll_backoff_s` doubling to `poll_backoff_cap_s`, reset when a poll finds an
  object;
- `notice_time`: the writers read versions/latest.json on a `version_poll_s` grid: a version published at t is
  seen at the next grid tick after t, plus one GET;
- `padded_tokens`: the trainer pads each micro batch to its longest sample;
- `step_budget`: what the terms cost per training step (seconds of each resource), for the report.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

from asyncrl.sim.cost_model import CostModel

__all__ = ["FifoStage", "PollSchedule", "notice_time", "object_seconds", "padded_tokens", "score_latency",
           "step_budget"]


@dataclass
class FifoStage:
    """One serial resource; `free` is when it finishes what it already has. Invariant: `free` never decreases."""

    free: float = 0.0
    busy_s: float = 0.0

    def enter(self, t: float, work: float) -> float:
        """Queue `work` seconds arriving at t; returns when it is done."""
        self.free = max(t, self.free) + work
        self.busy_s += work
        return self.free


def score_latency(cost: CostModel, together: int) -> float:
    """Seconds from the environment getting a sample's answer to its reward (one of `together` in one call)."""
    return cost.score_call_s + cost.score_s * max(1, together)


def object_seconds(fixed: float, per_token: float, tokens: float) -> float:
    return fixed + per_token * tokens


class PollSchedule:
    """The prefetch thread's idle backoff (`asyncrl.storage.group_prefetch.Backoff`) plus the empty poll's GET."""

    def __init__(self, cost: CostModel) -> None:
        self.initial, self.cap, self.get_s = cost.poll_backoff_s, cost.poll_backoff_cap_s, cost.s3_get_s
        self._next = self.initial

    def after_empty(self, t: float) -> float:
        """The next poll's time after a poll at t that found nothing."""
        wait = self._next
        self._next = min(self.cap, wait * 2)
        return t + self.get_s + wait

    def reset(self) -> None:
        self._next = self.initial


def notice_time(t: float, poll_s: float, get_s: float) -> float:
    """When a writer polling every `poll_s` (ticks at k·poll_s) knows of a version published at t."""
    if poll_s <= 0:
        return t + get_s
    return math.floor(t / poll_s + 1e-9) * poll_s + poll_s + get_s


def padded_tokens(lengths: Sequence[int], micro_batch_size: int) -> int:
    """Tokens the trainer computes over: each micro batch (consecutive samples) padded to its longest sample;
    `micro_batch_size` 0: the samples' own tokens (no padding)."""
    if micro_batch_size <= 0:
        return sum(lengths)
    return sum(len(lengths[i:i + micro_batch_size]) * max(lengths[i:i + micro_batch_size])
               for i in range(0, len(lengths), micro_batch_size))


def step_budget(cost: CostModel, requests: int, servers: int, objects: float, tokens: float,
                checkpoint_every: int, decoded: float = 0.0) -> dict[str, float]:
    """Seconds per training step each overhead term costs, for `requests` requests decoding `decoded` tokens in all
    and `objects` group objects of `tokens` tokens in all per step, on `servers` servers: serial work per resource
    (the environment writer's loop, each server's front end and engine), the latency a sample's path adds, and the
    trainer's own per-step work."""
    per_server = requests / max(1, servers)
    return {
        "environment_cpu_s": requests * cost.env_s + decoded * cost.env_token_s,
        "frontend_cpu_s_per_server": per_server * cost.frontend_s + decoded / max(1, servers) * cost.frontend_token_s,
        "engine_request_s_per_server": per_server * cost.request_s,
        "sample_latency_s": cost.http_call_s + cost.score_call_s,
        "group_writes_s": objects * cost.group_put_s + tokens * cost.group_put_token_s,
        "group_reads_s": objects * cost.group_get_s + tokens * cost.group_get_token_s,
        "poll_wait_s_max": cost.poll_backoff_cap_s + cost.s3_get_s,
        "version_notice_s_mean": cost.version_poll_s / 2 + cost.s3_get_s,
        "trainer_step_s": cost.train_fixed_s + cost.publish_s + cost.log_s
        + (cost.checkpoint_s / checkpoint_every if checkpoint_every > 0 else 0.0),
        "sync_s": cost.sync_time,
    }
