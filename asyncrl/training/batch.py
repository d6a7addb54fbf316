"""Turn the groups of one training step into padded tensors (`TrainBatch`). Pure, no I/O.

Rows: one per sample, in group and sample order, except that a sample with `segment_offsets` gives one row per
segment, in order (`asyncrl.training.segments.split_segments`). The GRPO advantage is computed per group on the
samples (one per episode) before the split; every row of a sample carries the sample's advantage, reward,
`index_in_group` and `group_size`. So the batch may have more rows than samples, and everything downstream that
works per row (micro batches, mini-batches, data-parallel shards, the critics, the loss's sequence denominators)
treats a segment as one sequence.

Layout of row i with prompt P (p tokens) and response R (n tokens): row i of `input_ids` is P + R
right-padded with `pad_id` to T = the longest p + n of the batch. Every per-token tensor is
*label-aligned*: column j describes the token `input_ids[i, j]` itself. The response tokens sit at
columns p .. p+n−1, so `response_mask[i, p:p+n] = 1`, `behav_logprobs[i, p+k]` is the engine's
log-prob of response token k, and `advantages[i, p:p+n] = A_i`. The model predicts column j from
the logits at column j − 1: `logp[:, j] = log_softmax(logits[:, j−1])[input_ids[:, j]]` for j ≥ 1,
and column 0 (always a prompt token, never a response token) is 0 (see `PolicyTrainer.logprobs`).
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import torch
from torch import Tensor

from asyncrl.training.advantages import group_advantages
from asyncrl.training.segments import reward_positions, split_segments
from asyncrl.types import Group, Sample


@dataclass
class TrainBatch:
    """One step's rows as tensors. S = rows (one per sample, one per segment of a segmented sample), T = padded
    length; see the module docstring."""

    input_ids: Tensor  # [S, T] long, prompt + response, right-padded with pad_id
    attention_mask: Tensor  # [S, T] long, 1 on prompt and response tokens
    response_mask: Tensor  # [S, T] float, the sample's loss mask on response tokens (1 = trained on), 0 elsewhere
    behav_logprobs: Tensor  # [S, T] float, engine log-probs at response columns, 0 elsewhere
    advantages: Tensor  # [S, T] float, the sample's advantage at response columns, 0 elsewhere
    token_versions: Tensor  # [S, T] long, policy version of each response token, -1 elsewhere
    rewards: Tensor  # [S] float, the row's sample's reward (the episode's)
    prompt_lengths: Tensor  # [S] long
    response_lengths: Tensor  # [S] long
    index_in_group: Tensor  # [S] long, position of the row's sample among its group's samples (AsyPPO critics)
    group_size: Tensor  # [S] long, samples (not rows) in the row's group
    entropy_mask: Tensor  # [S, T] float, 1 where the entropy bonus applies (AsyPPO's filter clears some), else 0
    token_rewards: Tensor  # [S, T] float, each turn's reward on its last trained-on token (GAE's input), else 0

    @property
    def num_samples(self) -> int:
        """Rows of the batch: its samples, a segmented sample counted once per segment."""
        return int(self.input_ids.shape[0])

    @property
    def num_tokens(self) -> int:
        """Trained-on response tokens of the batch (the token-mean denominator)."""
        return int(self.response_mask.sum())

    @property
    def num_nonempty(self) -> int:
        """Rows with at least one trained-on token (the seq-mean-token-mean denominator: a segment is a sequence)."""
        return int((self.response_mask.sum(dim=1) > 0).sum())

    def split(self, micro_batch_size: int) -> list[TrainBatch]:
        """Consecutive micro batches of at most `micro_batch_size` rows, each trimmed to its longest row."""
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size: expected >= 1, got {micro_batch_size}")
        out = []
        for start in range(0, self.num_samples, micro_batch_size):
            rows = slice(start, start + micro_batch_size)
            t_len = int((self.prompt_lengths[rows] + self.response_lengths[rows]).max())
            parts = {}
            for f in fields(self):
                t = getattr(self, f.name)[rows]
                parts[f.name] = t[:, :t_len] if t.dim() == 2 else t
            out.append(TrainBatch(**parts))
        return out

    def rows(self, index: list[int]) -> TrainBatch:
        """Rows `index` (in that order) as one micro batch, trimmed to its longest row (a packed micro batch of
        `asyncrl.training.micro_batches`)."""
        if not index:
            raise ValueError("rows: expected at least one row index")
        sel = torch.tensor(index, dtype=torch.long)
        t_len = int((self.prompt_lengths[sel] + self.response_lengths[sel]).max())
        parts = {}
        for f in fields(self):
            t = getattr(self, f.name)[sel]
            parts[f.name] = t[:, :t_len] if t.dim() == 2 else t
        return TrainBatch(**parts)


def build_batch(groups: list[Group], norm_std: bool, pad_id: int) -> TrainBatch:
    """Build the batch of `groups` (in order, samples in group order, a segmented sample's segments in order) with
    GRPO advantages per group, computed on the samples (see the module docstring)."""
    if not groups:
        raise ValueError("build_batch: expected at least one group, got none")
    rows = _rows(groups, norm_std)
    t_len = max(len(s.prompt_token_ids) + len(s.token_ids) for s, _, _, _ in rows)
    # whole rows as Python lists, one tensor per field: no per-sample tensor ops (256 samples: ~10x faster)
    ids, att, rmask, behav, adv, versions, token_rewards = [], [], [], [], [], [], []
    for s, a, _, _ in rows:
        p, n = len(s.prompt_token_ids), len(s.token_ids)
        pad = t_len - p - n
        ids.append([*s.prompt_token_ids, *s.token_ids, *([pad_id] * pad)])
        att.append([1] * (p + n) + [0] * pad)
        rmask.append([0.0] * p + [float(m) for m in s.mask()] + [0.0] * pad)
        behav.append([0.0] * p + [float(x) for x in s.logprobs] + [0.0] * pad)
        adv.append([0.0] * p + [a] * n + [0.0] * pad)
        versions.append([-1] * p + [int(v) for v in s.token_versions] + [-1] * pad)
        row_rewards = [0.0] * t_len
        for j, r in reward_positions(s):
            row_rewards[p + j] = r
        token_rewards.append(row_rewards)
    input_ids = torch.tensor(ids, dtype=torch.long)
    attention_mask = torch.tensor(att, dtype=torch.long)
    response_mask = torch.tensor(rmask, dtype=torch.float32)
    return TrainBatch(
        input_ids=input_ids,
        attention_mask=attention_mask,
        response_mask=response_mask,
        behav_logprobs=torch.tensor(behav, dtype=torch.float32),
        advantages=torch.tensor(adv, dtype=torch.float32),
        token_versions=torch.tensor(versions, dtype=torch.long),
        rewards=torch.tensor([s.reward for s, _, _, _ in rows], dtype=torch.float32),
        prompt_lengths=torch.tensor([len(s.prompt_token_ids) for s, _, _, _ in rows], dtype=torch.long),
        response_lengths=torch.tensor([len(s.token_ids) for s, _, _, _ in rows], dtype=torch.long),
        index_in_group=torch.tensor([i for _, _, i, _ in rows], dtype=torch.long),
        group_size=torch.tensor([g for _, _, _, g in rows], dtype=torch.long),
        entropy_mask=response_mask.clone(),
        token_rewards=torch.tensor(token_rewards, dtype=torch.float32),
    )


def _rows(groups: list[Group], norm_std: bool) -> list[tuple[Sample, float, int, int]]:
    """(row, advantage, index in group, group size) of every row, in order: each sample validated, given its
    group's GRPO advantage, then split into its segments (each row carrying the sample's advantage and place)."""
    out = []
    for g, ga in zip(groups, group_advantages(groups, norm_std=norm_std), strict=True):
        for i, (s, a) in enumerate(zip(g.samples, ga.tolist(), strict=True)):
            s.validate()
            out += [(row, a, i, len(g.samples)) for row in split_segments(s)]
    return out
