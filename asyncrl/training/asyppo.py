"""AsyPPO's critic-side bookkeeping (docs/algorithms.md §4). Pure torch, no I/O.

Owns two things:
- `disagreement_masks`: from the values of M ≥ 2 critics, the advantage mask (drop the tokens where the
  critics agree most) and the entropy mask (drop the entropy bonus where they disagree most);
- `critic_owner`: which critic trains on which sample (disjoint data: the G responses of a group are
  split evenly over the M critics by their index in the group, i.e. their POSITION among the group's
  samples, not `Sample.sample_index`, which may have gaps after redundant rollout).

Invariants:
- σ_t is the population std over critics (`correction=0`), computed without grad.
- both masks are 0 on invalid (mask 0) positions; of the n valid tokens exactly ⌊k·n⌋ (advantage) and
  ⌊h·n⌋ (entropy) are set to 0.
- ties in σ are broken by position: positions are ordered by their flattened row-major index
  (b·T + t) and the EARLIER position is selected first, in both the lowest-σ and the highest-σ selection.
- ⌊k·n⌋ is computed as `floor(k·n + 1e-9)`, so that e.g. k = 0.29, n = 100 selects 29 tokens despite the
  binary rounding of 0.29·100 = 28.999…
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

_FLOOR_EPS = 1e-9


def _count(fraction: float, n: int) -> int:
    return min(n, math.floor(fraction * n + _FLOOR_EPS))


def _check_fraction(name: str, value: float) -> None:
    if not (isinstance(value, int | float) and 0.0 <= float(value) <= 1.0):
        raise ValueError(f"{name}: expected a fraction in [0, 1], got {value!r}")


def disagreement_masks(values: Tensor, mask: Tensor, k: float = 0.2, h: float = 0.2) -> tuple[Tensor, Tensor]:
    """AsyPPO's advantage and entropy masks from the disagreement of M critics.

    values [M, B, T] (floating, M ≥ 2 critics), mask [B, T] (1 on valid response tokens, 0 elsewhere).
    σ_t = population std of values[:, b, t] over the M critics; n = number of valid tokens.
    Returns (adv_mask, ent_mask), both [B, T] in values' dtype:
    - adv_mask: 1 on valid tokens except the ⌊k·n⌋ valid tokens with the LOWEST σ (set to 0);
    - ent_mask: 1 on valid tokens except the ⌊h·n⌋ valid tokens with the HIGHEST σ (set to 0);
    both 0 on invalid positions. Ties: the earlier position (flattened row-major index b·T + t) is
    selected first. Raises ValueError for M < 2, mismatched shapes, a mask that is not 0/1, non-finite
    values at valid positions, or k / h outside [0, 1].
    """
    if not isinstance(values, Tensor) or values.dim() != 3:
        shape = tuple(values.shape) if isinstance(values, Tensor) else type(values).__name__
        raise ValueError(f"values: expected a 3-D tensor [M, B, T], got {shape}")
    if not values.is_floating_point():
        raise ValueError(f"values: expected a floating-point tensor, got {values.dtype}")
    if values.shape[0] < 2:
        raise ValueError(f"values: AsyPPO needs at least 2 critics (dim 0), got M = {values.shape[0]}")
    if not isinstance(mask, Tensor) or tuple(mask.shape) != tuple(values.shape[1:]):
        shape = tuple(mask.shape) if isinstance(mask, Tensor) else type(mask).__name__
        raise ValueError(f"mask: expected shape {tuple(values.shape[1:])} (values' [B, T]), got {shape}")
    if not bool(((mask == 0) | (mask == 1)).all()):
        raise ValueError("mask: expected only 0 and 1 entries")
    _check_fraction("k", k)
    _check_fraction("h", h)

    valid = (mask == 1).reshape(-1)
    with torch.no_grad():
        sigma = values.detach().std(dim=0, correction=0).reshape(-1)
    idx = valid.nonzero().squeeze(1)  # valid positions, ascending flattened index
    sig = sigma[idx]
    if not bool(torch.isfinite(sig).all()):
        raise ValueError("values: expected finite values at every valid (mask 1) position")
    n = int(idx.numel())

    def _masked(drop: Tensor) -> Tensor:
        out = valid.to(values.dtype).clone()
        out[drop] = 0
        return out.reshape(mask.shape)

    # Stable sorts keep equal σ in ascending position order, so the earlier position is taken first.
    low = idx[torch.sort(sig, stable=True).indices[: _count(k, n)]]
    high = idx[torch.sort(-sig, stable=True).indices[: _count(h, n)]]
    return _masked(low), _masked(high)


def critic_owner(index_in_group: Tensor, group_size: Tensor | int, num_critics: int) -> Tensor:
    """The critic that trains on each sample: `owner = index · M // G` → [S] long.

    index_in_group [S] (0 ≤ index < G), group_size G (an int, or [S] per sample), M = num_critics ≥ 1.
    The G responses of a group go to the M critics in contiguous blocks, so each critic gets ⌊G/M⌋ or
    ⌈G/M⌉ of every group (G < M leaves some critics without a sample of that group). A batch row carries its
    sample's index (`TrainBatch.index_in_group`), so the segments of a segmented sample share one critic.
    """
    if isinstance(num_critics, bool) or not isinstance(num_critics, int) or num_critics < 1:
        raise ValueError(f"num_critics: expected an int >= 1, got {num_critics!r}")
    if not isinstance(index_in_group, Tensor) or index_in_group.dim() != 1:
        shape = tuple(index_in_group.shape) if isinstance(index_in_group, Tensor) else type(index_in_group).__name__
        raise ValueError(f"index_in_group: expected a 1-D tensor [S], got {shape}")
    if index_in_group.is_floating_point() or index_in_group.dtype == torch.bool:
        raise ValueError(f"index_in_group: expected an integer tensor, got {index_in_group.dtype}")
    index = index_in_group.long()
    if isinstance(group_size, Tensor):
        if tuple(group_size.shape) not in ((), tuple(index.shape)):
            raise ValueError(f"group_size: expected a scalar or shape {tuple(index.shape)}, got {tuple(group_size.shape)}")
        if group_size.is_floating_point() or group_size.dtype == torch.bool:
            raise ValueError(f"group_size: expected an integer tensor, got {group_size.dtype}")
        size = group_size.long().expand_as(index)
    elif isinstance(group_size, int) and not isinstance(group_size, bool):
        size = torch.full_like(index, group_size)
    else:
        raise ValueError(f"group_size: expected an int or an integer tensor, got {type(group_size).__name__}")
    if bool((size < 1).any()):
        raise ValueError(f"group_size: expected >= 1, got {size.min().item()}")
    if bool(((index < 0) | (index >= size)).any()):
        raise ValueError("index_in_group: expected 0 <= index < group_size for every sample")
    return index * num_critics // size

