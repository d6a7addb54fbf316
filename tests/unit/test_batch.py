"""TrainBatch layout: padding, label alignment of response mask / behaviour log-probs, micro batches."""

from __future__ import annotations

import math

import pytest
import torch

from asyncrl.training.batch import build_batch
from asyncrl.types import Group, Sample

PAD = 0


def _groups() -> list[Group]:
    # Group a: prompts [11, 12] with responses [21, 22, 23] (reward 1) and [24] (reward 0).
    # Group b: prompt [13, 14, 15] with response [25, 26] (reward 2) and an empty response (reward 0).
    a = Group("a", 0, "t", [
        Sample("a", 0, [11, 12], [21, 22, 23], [-0.1, -0.2, -0.3], [3, 3, 4], 3, reward=1.0),
        Sample("a", 1, [11, 12], [24], [-0.4], [4], 4, reward=0.0),
    ])
    b = Group("b", 1, "t", [
        Sample("b", 0, [13, 14, 15], [25, 26], [-0.5, -0.6], [4, 4], 4, reward=2.0),
        Sample("b", 1, [13, 14, 15], [], [], [], 4, reward=0.0),
    ])
    return [a, b]


def test_build_batch_layout_and_alignment() -> None:
    b = build_batch(_groups(), norm_std=False, pad_id=PAD)
    # T = longest prompt + response = 2 + 3 = 5 (and 3 + 2 = 5).
    assert b.input_ids.tolist() == [
        [11, 12, 21, 22, 23],
        [11, 12, 24, PAD, PAD],
        [13, 14, 15, 25, 26],
        [13, 14, 15, PAD, PAD],
    ]
    assert b.attention_mask.tolist() == [[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1], [1, 1, 1, 0, 0]]
    # Label-aligned: column j is the token input_ids[:, j]; its log-prob comes from logits at j - 1.
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 0, 0], [0, 0, 0, 1, 1], [0, 0, 0, 0, 0]]
    assert torch.allclose(b.behav_logprobs, torch.tensor([
        [0, 0, -0.1, -0.2, -0.3],
        [0, 0, -0.4, 0, 0],
        [0, 0, 0, -0.5, -0.6],
        [0, 0, 0, 0, 0],
    ]))
    # The behaviour log-prob of response token k sits on the column holding that token.
    for row, tok, lp in ((0, 23, -0.3), (1, 24, -0.4), (2, 25, -0.5)):
        col = b.input_ids[row].tolist().index(tok)
        assert b.behav_logprobs[row, col].item() == pytest.approx(lp)
    assert b.token_versions.tolist() == [[-1, -1, 3, 3, 4], [-1, -1, 4, -1, -1], [-1, -1, -1, 4, 4], [-1] * 5]
    # Dr.GRPO advantages: group a mean 0.5 → ±0.5; group b mean 1 → ±1; broadcast on response columns.
    assert b.advantages.tolist() == [[0, 0, 0.5, 0.5, 0.5], [0, 0, -0.5, 0, 0], [0, 0, 0, 1, 1], [0] * 5]
    assert b.rewards.tolist() == [1.0, 0.0, 2.0, 0.0]
    assert b.prompt_lengths.tolist() == [2, 2, 3, 3] and b.response_lengths.tolist() == [3, 1, 2, 0]
    assert (b.num_samples, b.num_tokens, b.num_nonempty) == (4, 6, 3)


def test_build_batch_grpo_std() -> None:
    b = build_batch(_groups(), norm_std=True, pad_id=PAD)
    # group a: rewards [1, 0], unbiased std = √0.5 → A = ±0.5 / (√0.5 + 1e-6)
    a = 0.5 / (math.sqrt(0.5) + 1e-6)
    assert b.advantages[0, 2].item() == pytest.approx(a, abs=1e-6)
    assert b.advantages[1, 2].item() == pytest.approx(-a, abs=1e-6)


def test_split_trims_padding() -> None:
    b = build_batch(_groups(), norm_std=False, pad_id=PAD)
    parts = b.split(3)
    assert [p.num_samples for p in parts] == [3, 1]
    assert parts[0].input_ids.shape == (3, 5)
    assert parts[1].input_ids.tolist() == [[13, 14, 15]]  # trimmed to its longest row
    assert parts[1].response_mask.shape == (1, 3) and parts[1].rewards.tolist() == [0.0]
    assert torch.equal(parts[0].behav_logprobs, b.behav_logprobs[:3])
    with pytest.raises(ValueError, match="micro_batch_size"):
        b.split(0)


def test_build_batch_rejects_bad_input() -> None:
    with pytest.raises(ValueError, match="at least one group"):
        build_batch([], norm_std=True, pad_id=PAD)
    bad = Group("x", 0, "t", [Sample("x", 0, [1], [2, 3], [-0.1], [0, 0], 0)])
    with pytest.raises(ValueError, match="logprobs"):
        build_batch([bad], norm_std=True, pad_id=PAD)


def test_loss_mask_limits_the_trained_tokens() -> None:
    g = Group("g", 0, "t", [
        Sample("g", 0, [1, 2], [5, 2, 9, 9], [-0.1] * 4, [0] * 4, 0, reward=1.0, loss_mask=[1, 1, 0, 0]),
        Sample("g", 1, [1, 2], [6, 2], [-0.2] * 2, [0] * 2, 0, reward=0.0),
    ])  # sample 0: decode padding past its first EOS is not trained on
    b = build_batch([g], norm_std=True, pad_id=PAD)
    assert b.response_mask[0].tolist() == [0, 0, 1, 1, 0, 0]
    assert b.response_mask[1].tolist() == [0, 0, 1, 1, 0, 0]
    assert b.num_tokens == 4 and b.num_nonempty == 2
    assert b.response_lengths.tolist() == [4, 2]  # the padding still costs compute: it is in the rows
