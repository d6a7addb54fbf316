"""Multi-segment samples (`Sample.segment_offsets`): the split into rows, where rewards land on them, the batch's rows
and advantages, and each validation error. Every expected value is worked out by hand in the comments."""

from __future__ import annotations

import pytest
import torch

from asyncrl.training.batch import build_batch
from asyncrl.training.mini_batches import mini_batch_rows
from asyncrl.training.segments import reward_positions, split_segments
from asyncrl.types import Group, Sample

PAD = 0


def _two_segments() -> Sample:
    # response positions: 0 1 2 | 3 4 (segment 1's prompt) 5 6; no turns, reward 1 on the episode
    return Sample(
        "g", 0, [1, 2], [10, 11, 12, 50, 51, 13, 14], [-0.1, -0.2, -0.3, 0.0, 0.0, -0.4, -0.5],
        [3, 3, 4, 4, 4, 5, 5], 3, reward=1.0, loss_mask=[1, 1, 1, 0, 0, 1, 1], segment_offsets=[3],
    )


def _three_segments() -> Sample:
    # pos:  0  1  2  3  4 | 5  6  7  8  9 | 10 11 12 13
    # ids: 10 11 60 12 13 |70 71 14 61 15 | 72 16 17 62     (60-62 observations, 70-72 segment prompts)
    # mask: 1  1  0  1  1 | 0  0  1  0  1 |  0  1  1  0
    # turns start at 0, 3, 7, 9; turn 3 runs across the restart at 10 and ends on its last trained token, 12.
    return Sample(
        "g", 0, [1], [10, 11, 60, 12, 13, 70, 71, 14, 61, 15, 72, 16, 17, 62],
        [-0.1, -0.2, 0.0, -0.3, -0.4, 0.0, 0.0, -0.5, 0.0, -0.6, 0.0, -0.7, -0.8, 0.0],
        [0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2, 2, 3, 3], 0, reward=2.25,
        loss_mask=[1, 1, 0, 1, 1, 0, 0, 1, 0, 1, 0, 1, 1, 0],
        turn_offsets=[0, 3, 7, 9], turn_rewards=[0.5, -0.25, 0.0, 2.0], segment_offsets=[5, 10],
    )


def _view(s: Sample) -> tuple:
    return (s.prompt_token_ids, s.token_ids, s.logprobs, s.token_versions, s.loss_mask, s.turn_offsets,
            s.turn_rewards)


def test_a_sample_without_segments_is_its_own_row() -> None:
    s = _two_segments()
    s.segment_offsets = None
    assert split_segments(s)[0] is s and len(split_segments(s)) == 1


def test_split_of_two_segments() -> None:
    rows = split_segments(_two_segments())
    assert [_view(r) for r in rows] == [
        ([1, 2], [10, 11, 12], [-0.1, -0.2, -0.3], [3, 3, 4], [1, 1, 1], [0], [0.0]),
        ([50, 51], [13, 14], [-0.4, -0.5], [5, 5], [1, 1], [0], [1.0]),  # the reward on the LAST segment
    ]
    for r in rows:
        r.validate()
        assert (r.group_id, r.sample_index, r.reward, r.finish_reason, r.start_version) == ("g", 0, 1.0, "stop", 3)
        assert r.segment_offsets is None


def test_split_of_three_segments_with_a_turn_across_a_restart() -> None:
    rows = split_segments(_three_segments())
    assert [_view(r) for r in rows] == [
        # turns 0 ([0, 3): last trained 1) and 1 ([3, 5): last trained 4) with their rewards
        ([1], [10, 11, 60, 12, 13], [-0.1, -0.2, 0.0, -0.3, -0.4], [0, 0, 0, 1, 1], [1, 1, 0, 1, 1], [0, 3],
         [0.5, -0.25]),
        # prompt = positions 5-6; turn 2 at 7 (its reward 0.0 on 7), turn 3 starts at 9 but ends in segment 2: 0.0
        ([70, 71], [14, 61, 15], [-0.5, 0.0, -0.6], [1, 1, 2], [1, 0, 1], [0, 2], [0.0, 0.0]),
        # prompt = position 10; a continuation of turn 3 from 11, whose last trained token (12) takes its 2.0
        ([72], [16, 17, 62], [-0.7, -0.8, 0.0], [2, 3, 3], [1, 1, 0], [0], [2.0]),
    ]
    for r in rows:
        r.validate()
        assert (r.reward, r.start_version) == (2.25, 0)


def test_rewards_land_on_the_same_tokens_after_the_split() -> None:
    two = split_segments(_two_segments())
    assert [reward_positions(r) for r in two] == [[(2, 0.0)], [(1, 1.0)]]
    assert reward_positions(_two_segments()) == [(6, 1.0)]  # response position 6 = row 1's position 1 (head 5)
    s = _three_segments()
    assert reward_positions(s) == [(1, 0.5), (4, -0.25), (7, 0.0), (12, 2.0)]
    rows = split_segments(s)
    assert [reward_positions(r) for r in rows] == [[(1, 0.5), (4, -0.25)], [(0, 0.0), (2, 0.0)], [(1, 2.0)]]
    heads = [0, 7, 11]  # each row's first response position in the sample
    landed = [(h + j, r) for h, row in zip(heads, rows, strict=True) for j, r in reward_positions(row) if r]
    assert landed == [(1, 0.5), (4, -0.25), (12, 2.0)]  # every non-zero turn reward exactly once, same token


def test_build_batch_rows_carry_the_episode_advantage() -> None:
    plain = Sample("g", 1, [1, 2], [20, 21], [-0.9, -1.0], [3, 3], 3, reward=0.0)
    b = build_batch([Group("g", 0, "t", [_two_segments(), plain])], norm_std=False, pad_id=PAD)
    # advantages on the two episode rewards 1 and 0 (mean 0.5): +0.5 on both rows of sample 0, -0.5 on sample 1
    assert b.input_ids.tolist() == [[1, 2, 10, 11, 12], [50, 51, 13, 14, PAD], [1, 2, 20, 21, PAD]]
    assert b.advantages.tolist() == [[0, 0, 0.5, 0.5, 0.5], [0, 0, 0.5, 0.5, 0], [0, 0, -0.5, -0.5, 0]]
    assert b.response_mask.tolist() == [[0, 0, 1, 1, 1], [0, 0, 1, 1, 0], [0, 0, 1, 1, 0]]
    assert torch.allclose(b.behav_logprobs, torch.tensor(
        [[0, 0, -0.1, -0.2, -0.3], [0, 0, -0.4, -0.5, 0], [0, 0, -0.9, -1.0, 0]]))
    assert b.token_versions.tolist() == [[-1, -1, 3, 3, 4], [-1, -1, 5, 5, -1], [-1, -1, 3, 3, -1]]
    assert b.token_rewards.tolist() == [[0] * 5, [0, 0, 0, 1, 0], [0] * 5]
    assert b.rewards.tolist() == [1.0, 1.0, 0.0]
    assert b.index_in_group.tolist() == [0, 0, 1] and b.group_size.tolist() == [2, 2, 2]
    assert b.prompt_lengths.tolist() == [2, 2, 2] and b.response_lengths.tolist() == [3, 2, 2]
    assert (b.num_samples, b.num_tokens, b.num_nonempty) == (3, 7, 3)
    assert mini_batch_rows(b.num_samples, 3) == [range(0, 1), range(1, 2), range(2, 3)]  # rows, not samples


def _error(s: Sample, *parts: str) -> None:
    with pytest.raises(ValueError) as err:
        s.validate()
    for part in ("sample g/0", *parts):
        assert part in str(err.value), (part, str(err.value))


def test_empty_segment_offsets_is_invalid() -> None:
    s = _two_segments()
    s.segment_offsets = []
    _error(s, "segment_offsets must hold at least one offset (None for a single segment)")


def test_segment_offsets_need_a_loss_mask() -> None:
    s = _two_segments()
    s.loss_mask = None
    _error(s, "segment_offsets requires loss_mask")


@pytest.mark.parametrize("offsets", [[0], [7], [3, 3], [5, 3]])
def test_segment_offsets_increase_strictly_inside_the_response(offsets: list[int]) -> None:
    s = _two_segments()
    s.segment_offsets = offsets
    _error(s, f"segment_offsets must increase strictly within [1, 6], got {offsets}")


def test_segment_zero_starts_on_a_trained_token() -> None:
    s = _two_segments()
    s.loss_mask = [0, 1, 1, 0, 0, 1, 1]
    _error(s, "segment_offsets: segment 0's response must start on a trained-on (loss_mask 1) token")


def test_a_later_segment_starts_with_its_prompt() -> None:
    s = _two_segments()
    s.segment_offsets = [2]  # position 2 is a trained token
    _error(s, "segment_offsets: segment 1 (2..6) must start with its prompt (at least one loss_mask 0 token)")


def test_a_later_segment_holds_a_trained_token() -> None:
    s = _two_segments()
    s.loss_mask = [1, 1, 1, 0, 0, 0, 0]
    _error(s, "segment_offsets: segment 1 (3..6) must hold at least one trained-on (loss_mask 1) token")


def test_no_turn_starts_inside_a_segment_prompt() -> None:
    s = _three_segments()
    s.turn_offsets = [0, 3, 6, 9]  # 6 is in segment 1's prompt (5..6)
    _error(s, "turn_offsets [6] fall inside the prompt of segment 1 (5..6)")
