"""`asyncrl.training.micro_batches`: packing a step's rows under a token budget (which rows land where, padding
counted), the data-parallel deal of the packed micro batches, and `shard_micro_batches` / `TrainBatch.rows` on a real
batch with the budget."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config.load import ConfigError, config_from_dict
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.distributed import batch_lengths, shard_micro_batches
from asyncrl.training.micro_batches import (
    by_count,
    pack_by_tokens,
    padded_tokens,
    padding_fraction,
    rank_plans,
)
from asyncrl.types import Group, Sample

LENGTHS = [5, 9, 3, 9, 4, 2, 7]  # 39 tokens in all


def test_pack_by_tokens_longest_first_under_the_budget_and_the_row_cap() -> None:
    # sorted: rows 1 (9), 3 (9), 6 (7), 0 (5), 4 (4), 2 (3), 5 (2); budget 20, at most 3 rows:
    # [1, 3] = 2 x 9 = 18 (a third row would make 27); [6, 0] = 2 x 7 = 14 (21 with row 4); [4, 2, 5] = 3 x 4 = 12
    # (the row cap, not the budget, closes it)
    plan = pack_by_tokens(LENGTHS, 20, 3)
    assert plan == [[1, 3], [6, 0], [4, 2, 5]]
    assert padded_tokens(LENGTHS, plan) == 18 + 14 + 12
    assert padding_fraction(LENGTHS, [plan]) == pytest.approx(1 - 39 / 44)
    # without the row cap the last one takes every short row
    assert pack_by_tokens(LENGTHS, 20, 64) == [[1, 3], [6, 0], [4, 2, 5]]
    plan16 = pack_by_tokens(LENGTHS, 16, 64)  # two rows of 9 would be 18
    assert plan16 == [[1], [3], [6, 0], [4, 2, 5]] and padded_tokens(LENGTHS, plan16) == 9 + 9 + 14 + 12
    # a row longer than the budget is a micro batch of its own, never cut
    assert pack_by_tokens([30, 2, 2], 20, 8) == [[0], [1, 2]]
    # ties keep row order; one row per micro batch when the budget is a row's length
    assert pack_by_tokens([4, 4, 4], 4, 8) == [[0], [1], [2]]
    assert pack_by_tokens([], 10, 2) == []
    with pytest.raises(ValueError, match="training.micro_batch_tokens"):
        pack_by_tokens(LENGTHS, 0, 3)
    with pytest.raises(ValueError, match="training.micro_batch_size"):
        pack_by_tokens(LENGTHS, 10, 0)


def test_by_count_pads_more_than_the_budget_on_the_same_rows() -> None:
    plan = by_count(range(7), 3)
    assert plan == [[0, 1, 2], [3, 4, 5], [6]]
    assert padded_tokens(LENGTHS, plan) == 3 * 9 + 3 * 9 + 7
    assert padding_fraction(LENGTHS, [plan]) == pytest.approx(1 - 39 / 61)
    assert padding_fraction([], [[]]) == 0.0


def test_rank_plans_deal_packed_micro_batches_round_robin() -> None:
    assert rank_plans(LENGTHS, 2, 3, 20) == [[[1, 3], [4, 2, 5]], [[6, 0]]]
    assert rank_plans(LENGTHS, 1, 3, 20) == [[[1, 3], [6, 0], [4, 2, 5]]]
    assert rank_plans(LENGTHS, 4, 3, 20) == [[[1, 3]], [[6, 0]], [[4, 2, 5]], []]
    # by count: contiguous shares (3 + 2 + 2 rows), cut by count
    assert rank_plans(LENGTHS, 3, 2) == [[[0, 1], [2]], [[3, 4]], [[5, 6]]]
    for world in (1, 2, 3, 5):
        for tokens in (None, 9, 20, 1000):
            rows = sorted(i for plan in rank_plans(LENGTHS, world, 2, tokens) for mb in plan for i in mb)
            assert rows == list(range(len(LENGTHS))), (world, tokens)  # every row exactly once


def _batch() -> TrainBatch:
    """Rows of LENGTHS tokens: a 1- or 2-token prompt and the rest response, two groups (4 + 3 samples)."""
    samples = []
    for i, n in enumerate(LENGTHS):
        p = 1 + i % 2
        resp = [10 + i] * (n - p)
        samples.append(Sample(f"g{i // 4}", i % 4, list(range(1, p + 1)), resp, [-0.5] * len(resp), [0] * len(resp),
                              0, reward=float(i % 2)))
    return build_batch([Group("g0", 0, "t", samples[:4]), Group("g1", 1, "t", samples[4:])], norm_std=True, pad_id=0)


def test_rows_trims_to_the_longest_selected_row() -> None:
    batch = _batch()
    assert batch_lengths(batch) == LENGTHS
    mb = batch.rows([6, 0])
    assert mb.input_ids.shape == (2, 7)
    assert mb.input_ids.tolist() == [[1, 16, 16, 16, 16, 16, 16], [1, 10, 10, 10, 10, 0, 0]]
    assert torch.equal(mb.response_mask, batch.response_mask[[6, 0], :7])
    assert mb.rewards.tolist() == [0.0, 0.0] and mb.prompt_lengths.tolist() == [1, 1]
    with pytest.raises(ValueError, match="at least one row"):
        batch.rows([])


def test_shard_with_a_token_budget_keeps_equal_counts_and_every_row() -> None:
    batch = _batch()
    r0 = shard_micro_batches(batch, 0, 2, 3, micro_batch_tokens=20)
    r1 = shard_micro_batches(batch, 1, 2, 3, micro_batch_tokens=20)
    assert [(mb.input_ids.shape, pad) for mb, pad in r0] == [((2, 9), False), ((3, 4), False)]
    assert [(mb.input_ids.shape, pad) for mb, pad in r1] == [((2, 7), False), ((1, 5), True)]
    assert r1[1][0].num_tokens == 0  # the padding micro batch (row 0, masked) trains nothing
    trained = sum(mb.num_tokens for mb, pad in r0 + r1 if not pad)
    assert trained == batch.num_tokens
    assert torch.equal(r0[1][0].input_ids, batch.input_ids[[4, 2, 5], :4])
    # W = 1: the plan of pack_by_tokens, no padding micro batch
    one = shard_micro_batches(batch, 0, 1, 3, micro_batch_tokens=20)
    assert [mb.input_ids.shape for mb, _ in one] == [(2, 9), (2, 7), (3, 4)] and not any(p for _, p in one)


def test_config_field() -> None:
    assert config_from_dict({}).training.micro_batch_tokens is None
    assert config_from_dict({"training": {"micro_batch_tokens": 4096}}).training.micro_batch_tokens == 4096
    with pytest.raises(ConfigError, match="training.micro_batch_tokens"):
        config_from_dict({"training": {"micro_batch_tokens": 0}})
