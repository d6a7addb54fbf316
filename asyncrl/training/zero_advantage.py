"""Which rows of a step's batch the trainer computes: the rows whose gradient is exactly zero are left out. Pure, no
I/O.

Every built-in policy loss (`ADVANTAGE_LINEAR_LOSSES`) is, token by token, the advantage A_t times a finite factor,
so a row whose advantages are all 0 on its trained tokens adds exactly 0 to the loss and to the gradient, provided
nothing else in the loss reads it: no KL to a reference (`training.kl_coef` 0) and no entropy bonus (the entropy
coefficient of the step 0). GRPO gives such rows to every group whose rewards are all equal, which on a hard task is
most groups (a weak model's all-wrong groups). Leaving them out of the forward and backward passes changes no
gradient because every micro loss carries the whole batch's aggregation denominators (its non-empty samples and its
trained tokens, `asyncrl.training.losses`), counted before any row is left out; only the metrics that are means
over computed rows (entropy, the engine-trainer gap) then cover the computed rows alone.

Invariants: the selection is a function of the batch alone (every data-parallel rank selects the same rows); at least
one row is kept, so the optimizer step runs exactly as it would (Adam moves on a zero gradient too) and every rank
has a micro batch; rows keep their order.
"""

from __future__ import annotations

from torch import Tensor

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.batch import TrainBatch

ADVANTAGE_LINEAR_LOSSES = frozenset({"ppo", "decoupled_ppo", "tis", "cispo", "topr", "gspo"})
"""Built-in losses whose token loss is A_t × a finite factor (tested: zero loss and zero gradient at A = 0)."""


def skips_zero_advantage(cfg: TrainingConfig, ent_coef: float) -> bool:
    """Whether rows of all-zero advantage can be left out with the gradient unchanged (see the module docstring)."""
    return (cfg.skip_zero_advantage and cfg.loss in ADVANTAGE_LINEAR_LOSSES and cfg.kl_coef == 0
            and ent_coef == 0)


def rows_with_signal(advantages: Tensor, response_mask: Tensor) -> list[int]:
    """Indices of the rows with a non-zero advantage on a trained token, in order; the first row when there is none."""
    signal = ((advantages != 0) & (response_mask > 0)).any(dim=1)
    rows = [int(i) for i in signal.nonzero().flatten()]
    return rows or [0]


def computed_rows(batch: TrainBatch, cfg: TrainingConfig, ent_coef: float) -> TrainBatch:
    """The rows of `batch` the step computes: all of them, or those with signal when `skips_zero_advantage`."""
    if not skips_zero_advantage(cfg, ent_coef):
        return batch
    rows = rows_with_signal(batch.advantages, batch.response_mask)
    return batch if len(rows) == batch.num_samples else batch.rows(rows)
