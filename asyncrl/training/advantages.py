"""Advantage estimators (ALGORITHMS.md §2): GRPO group normalisation and GAE. Pure torch, no I/O.

Invariants:
- `grpo_advantages` returns one advantage per sample of a group; a group of one sample gets 0
  (nothing to compare against); the std is the unbiased sample std (torch's default) plus 1e-6.
- `gae` treats the value after the last valid token of a row as 0 (the episode ends there), and
  returns 0 advantage and return on invalid (masked) positions.
"""

from __future__ import annotations

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
    token). `mask[b, t] = 1` on valid positions; valid positions of a row must be one contiguous run
    (right padding), and V after the last valid token is 0. Returns (advantages, returns), both 0
    on masked positions.
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
        m = mask[:, t]
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        a_t = (delta + gamma * lam * next_adv) * m
        adv[:, t] = a_t
        # A masked position ends the chain: the earlier token sees V = 0 and A = 0 after it.
        next_adv = a_t
        next_value = values[:, t] * m
    returns = (adv + values) * mask
    if squeeze:
        return adv[0], returns[0]
    return adv, returns
