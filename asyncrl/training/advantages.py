"""Advantage estimators (docs/algorithms.md §2): GRPO group normalisation and GAE. Pure torch, no I/O.

Invariants:
- `grpo_advantages` returns one advantage per sample of a group; a group of one sample gets 0
  (nothing to compare against); the std is the unbiased sample std (torch's default) plus 1e-6.
- `gae` runs over the valid (mask 1) tokens of a row only: masked positions in between (environment
  observations of a multi-turn trajectory) are skipped, so δ at a valid token uses V of the next valid
  token; the value after the last valid token of a row is 0 (the episode ends there); advantage and
  return are 0 on masked positions.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch
from torch import Tensor

from asyncrl.types import Group

GRPO_EPS = 1e-6


def grpo_advantages(rewards: Tensor, norm_std: bool = True) -> Tensor:
    """`A_i = (R_i − mean_j R_j) / (std_j R_j + 1e-6)` over one group's rewards [G] → [G].

    `norm_std=False` gives Dr.GRPO: `A_i = R_i − mean_j R_j`. A group of one sample gets A = 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected a 1-D tensor [G], got shape {tuple(rewards.shape)}")
    rewards = rewards.to(torch.float32)
    if rewards.numel() <= 1:
        return torch.zeros_like(rewards)
    centred = rewards - rewards.mean()
    if not norm_std:
        return centred
    return centred / (rewards.std() + GRPO_EPS)


def grpo(rewards: Tensor, group_ids: Tensor | Sequence[Hashable], norm_std: bool = True) -> Tensor:
    """GRPO advantages of a flat batch (public API): rewards [S], `group_ids` [S] (which prompt each sample
    answers; any hashable ids, samples of a group need not be adjacent) → [S].

    Each sample gets `(R_i − mean_g R) / (std_g R + 1e-6)` over the samples of its group g (unbiased std), or
    `R_i − mean_g R` with `norm_std=False` (Dr.GRPO); a group of one sample gets 0.
    """
    if rewards.dim() != 1:
        raise ValueError(f"rewards: expected a 1-D tensor [S], got shape {tuple(rewards.shape)}")
    ids = group_ids.tolist() if isinstance(group_ids, Tensor) else list(group_ids)
    if len(ids) != rewards.numel():
        raise ValueError(f"group_ids: expected {rewards.numel()} ids (one per reward), got {len(ids)}")
    members: dict[Hashable, list[int]] = {}
    for i, g in enumerate(ids):
        members.setdefault(g, []).append(i)
    out = torch.zeros(rewards.numel(), dtype=torch.float32)
    for rows in members.values():
        index = torch.tensor(rows, dtype=torch.long)
        out[index] = grpo_advantages(rewards[index], norm_std=norm_std)
    return out


def outcome_token_rewards(rewards: Tensor, mask: Tensor) -> Tensor:
    """Place each sample's outcome reward [S] on its last valid token of `mask` [S, T] (the input of `gae`)."""
    if mask.dim() != 2 or rewards.shape != mask.shape[:1]:
        raise ValueError(f"rewards: expected shape [S] for a mask of shape [S, T], got {tuple(rewards.shape)} "
                         f"and {tuple(mask.shape)}")
    valid = mask > 0
    t_len = mask.shape[1]
    last = torch.where(valid, torch.arange(t_len).expand_as(mask), -1).max(dim=1).values
    out = torch.zeros(mask.shape, dtype=torch.float32)
    rows = torch.nonzero(last >= 0).squeeze(-1)
    out[rows, last[rows]] = rewards[rows].float()
    return out


def group_advantages(groups: list[Group], norm_std: bool = True) -> list[Tensor]:
    """GRPO advantages for each group, in group and sample order: one [G_i] tensor per group."""
    return [
        grpo_advantages(torch.tensor(g.rewards, dtype=torch.float32), norm_std=norm_std) for g in groups
    ]


def gae(
    rewards: Tensor,
    values: Tensor,
    mask: Tensor | None = None,
    gamma: float = 1.0,
    lam: float = 0.95,
) -> tuple[Tensor, Tensor]:
    """Generalised advantage estimation over response tokens, rows of shape [B, T] (or 1-D [T]).

    `δ_t = r_t + γ V(s_{t+1}) − V(s_t)`, `A_t = Σ_l (γλ)^l δ_{t+l}`, `R_t = A_t + V(s_t)`.
    `rewards[b, t]` is the reward received after token t (for an outcome reward: the last valid
    token). `mask[b, t] = 1` on valid positions; masked positions are skipped (δ at a valid token uses V of
    the next valid token of its row; rewards at masked positions are ignored), and V after the last valid
    token is 0. Returns (advantages, returns), both 0 on masked positions.
    """
    squeeze = rewards.dim() == 1
    if squeeze:
        rewards, values = rewards.unsqueeze(0), values.unsqueeze(0)
        mask = mask.unsqueeze(0) if mask is not None else None
    if rewards.shape != values.shape:
        raise ValueError(f"values: expected the shape of rewards {tuple(rewards.shape)}, got {tuple(values.shape)}")
    if mask is None:
        mask = torch.ones_like(rewards)
    if mask.shape != rewards.shape:
        raise ValueError(f"mask: expected the shape of rewards {tuple(rewards.shape)}, got {tuple(mask.shape)}")
    rewards, values, mask = rewards.float(), values.float().detach(), mask.float()
    _, t_len = rewards.shape
    adv = torch.zeros_like(rewards)
    next_adv = torch.zeros_like(rewards[:, 0])
    next_value = torch.zeros_like(rewards[:, 0])
    for t in reversed(range(t_len)):
        valid = mask[:, t] > 0
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = delta + gamma * lam * next_adv
        adv[:, t] = torch.where(valid, a_t, torch.zeros_like(a_t))
        # A masked position passes the chain through unchanged (the next valid token's V and A).
        next_adv = torch.where(valid, a_t, next_adv)
        next_value = torch.where(valid, values[:, t], next_value)
    returns = torch.where(mask > 0, adv + values, torch.zeros_like(adv))
    if squeeze:
        return adv[0], returns[0]
    return adv, returns
