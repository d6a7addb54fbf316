"""Mini-batch updates: the optimizer steps a training step takes over its batch, their metrics as one. Pure
(torch tensors, no I/O).

A step's batch is cut into `training.mini_batches` mini-batches, and `training.epochs` passes each take one
optimizer step per mini-batch, in order: `mini_batches × epochs` updates. The proximal log-probs of every
update are those of the policy at the step's start (`asyncrl.training.policy`), so from the second update on
the ratio r = π_θ / π_prox moves away from 1 and the PPO clip binds. Each mini-batch is aggregated on its own:
its loss divides by its own non-empty rows / trained tokens (docs/algorithms.md §3), as one step's batch
does with a single update.

Invariants:
- `mini_batch_rows`: contiguous ranges of row indices, in order, that tile the rows exactly once; their sizes
  differ by at most one row (the first `num_rows % mini_batches` get one more); none is empty, so asking for
  more mini-batches than rows is an error, never a silent clamp. The check counts rows, not samples: a
  segmented sample is one row per segment (`asyncrl.training.batch`), so a batch has at least as many rows as
  samples and the configuration's check on samples (`training.mini_batches` <= the step's samples) implies this
  one; its message says "samples", which are the rows of an unsegmented batch. The plan is a function of the row
  count alone: every data-parallel rank and every pass gets the same mini-batches; a sample's segments may fall
  in different mini-batches (each row is its own sequence).
- each `MiniBatch` carries its own aggregation denominators, counted before its rows of zero gradient are
  left out (`asyncrl.training.zero_advantage`); its micro batches are `shard_micro_batches` of the rows it
  computes, so every rank has the same number of them.
- `combine_updates` of a single update returns its metrics unchanged (the one-update step's figures).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from torch import Tensor

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.batch import TrainBatch
from asyncrl.training.distributed import batch_lengths, select_rows, shard_micro_batches
from asyncrl.training.micro_batches import padded_tokens, rank_plans, rank_rows
from asyncrl.training.zero_advantage import computed_rows


@dataclass
class MiniBatch:
    """One optimizer step's work: the aggregation denominators of its rows (non-empty rows, trained
    tokens, at least 1), the rows it computes, this rank's micro batches of them (micro batch, is_padding)
    and, with several updates a step, their proximal log-probs at the step's start (one tensor per micro
    batch, in order; None: the update's own log-probs)."""

    num_samples: int
    num_tokens: int
    computed: TrainBatch
    micro: list[tuple[TrainBatch, bool]]
    prox: list[Tensor] | None = None


def mini_batch_rows(num_rows: int, mini_batches: int) -> list[range]:
    """The rows `0..num_rows-1` cut into `mini_batches` contiguous ranges (see the module docstring); counts rows
    (a segmented sample's segments each count)."""
    if mini_batches < 1:
        raise ValueError(f"training.mini_batches: expected >= 1, got {mini_batches}")
    if mini_batches > num_rows:
        raise ValueError(f"training.mini_batches: expected at most the step's {num_rows} samples (every "
                         f"mini-batch needs one), got {mini_batches}")
    return [rank_rows(num_rows, k, mini_batches) for k in range(mini_batches)]


def combine_updates(updates: list[dict[str, float]], mini_batches: int) -> dict[str, float]:
    """A step's metrics from those of its updates (each merged over its micro batches and ranks), in order.

    `*_max` take the max; `tokens` adds up over the first `mini_batches` updates (one pass: the batch's
    trained tokens, not counted again per pass); everything else (`loss`, `pg_loss`, `grad_norm`, the means)
    is the mean over the updates that report it. A single update's metrics come back unchanged.
    """
    if not updates:
        return {}
    if len(updates) == 1:
        return dict(updates[0])
    out: dict[str, float] = {}
    for key in dict.fromkeys(k for u in updates for k in u):
        values = [u[key] for u in updates if key in u]
        if key == "tokens":
            out[key] = float(sum(u.get(key, 0.0) for u in updates[:mini_batches]))
        elif key.endswith("_max"):
            out[key] = float(max(values))
        else:
            out[key] = float(sum(values) / len(values))
    return out


def pass_plan_metrics(lengths: Sequence[Sequence[int]], world_size: int, micro_batch_size: int,
                      micro_batch_tokens: int | None = None) -> dict[str, float]:
    """`asyncrl.training.micro_batches.plan_metrics` of one pass over the batch: `lengths` holds each
    mini-batch's computed rows' lengths; `micro_batches` and `computed_tokens` add up over the mini-batches,
    `padding_fraction` is padding's share of them all. With one mini-batch, `plan_metrics` itself."""
    computed = real = micro = 0
    for rows in lengths:
        for plan in rank_plans(rows, world_size, micro_batch_size, micro_batch_tokens):
            computed += padded_tokens(rows, plan)
            real += sum(rows[i] for mb in plan for i in mb)
            micro += len(plan)
    return {"padding_fraction": 1.0 - real / computed if computed else 0.0, "micro_batches": float(micro),
            "computed_tokens": float(computed)}


def plan_updates(batch: TrainBatch, cfg: TrainingConfig, ent_coef: float, rank: int, world_size: int,
                 micro_batch_size: int) -> list[MiniBatch]:
    """The mini-batches of `batch` (`mini_batch_rows` of `cfg.mini_batches`), each with this rank's micro
    batches under `micro_batch_size` and `cfg.micro_batch_tokens`; one pass (see the module docstring)."""
    out = []
    for rows in mini_batch_rows(batch.num_samples, cfg.mini_batches):
        whole = batch if len(rows) == batch.num_samples else select_rows(batch, rows.start, rows.stop)
        computed = computed_rows(whole, cfg, ent_coef)  # rows of exactly zero gradient left out
        micro = shard_micro_batches(computed, rank, world_size, micro_batch_size, cfg.micro_batch_tokens)
        out.append(MiniBatch(max(whole.num_nonempty, 1), max(whole.num_tokens, 1), computed, micro))
    return out


def step_metrics(batch: TrainBatch, minis: list[MiniBatch], updates: list[dict[str, float]], world_size: int,
                 micro_batch_size: int, micro_batch_tokens: int | None) -> dict[str, float]:
    """A step's metrics: `combine_updates` of its updates' metrics, `skipped_rows` (rows not computed),
    `batch_tokens` (the batch's trained tokens), `updates`, and `pass_plan_metrics` of its mini-batches."""
    out = combine_updates(updates, len(minis))
    computed = sum(mini.computed.num_samples for mini in minis)
    out.update(skipped_rows=float(batch.num_samples - computed), batch_tokens=float(batch.num_tokens),
               updates=float(len(updates)))
    lengths = [batch_lengths(mini.computed) for mini in minis]
    return out | pass_plan_metrics(lengths, world_size, micro_batch_size, micro_batch_tokens)
