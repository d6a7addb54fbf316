"""A multi-turn trajectory as one token sequence: the loss mask covers only generated tokens, turns keep their
offsets, rewards and versions, and the sample survives the Parquet round trip."""

import pytest

from asyncrl.rollout.multiturn import MultiTurnTrajectory
from asyncrl.storage.groups import decode_group, encode_group
from asyncrl.types import Group


def _three_turns() -> MultiTurnTrajectory:
    t = MultiTurnTrajectory(prompt_ids=[1, 50, 51, 52])
    t.add_generated([10, 11, 2], [-0.1, -0.2, -0.3], [0, 0, 0], start_version=0)  # turn 0 ends on <eos> = 2
    t.end_turn(0.0, [60, 61, 62, 63])  # observation + generation prompt
    t.add_generated([12, 13], [-0.4, -0.5], [0, 1], start_version=0)  # turn 1 spans an update ...
    t.add_generated([2], [-0.6], [1], start_version=1)  # ... and is continued after it: still turn 1
    t.end_turn(-0.1, [2, 60, 64, 63])  # a close token the engine did not emit, then the observation
    t.add_generated([14, 2], [-0.7, -0.8], [2, 2], start_version=2)
    t.end_turn(1.0)
    return t


def test_loss_mask_covers_generated_tokens_only():
    t = _three_turns()
    assert t.token_ids == [10, 11, 2, 60, 61, 62, 63, 12, 13, 2, 2, 60, 64, 63, 14, 2]
    assert t.loss_mask == [1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 0, 0, 0, 0, 1, 1]
    assert t.logprobs == [-0.1, -0.2, -0.3, 0.0, 0.0, 0.0, 0.0, -0.4, -0.5, -0.6, 0.0, 0.0, 0.0, 0.0, -0.7, -0.8]
    assert t.versions == [0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 2, 2]
    assert t.turn_offsets == [0, 7, 14] and t.turn_rewards == [0.0, -0.1, 1.0]
    assert t.context_ids == [1, 50, 51, 52, *t.token_ids] and t.current_turn_ids() == [14, 2]


def test_sample_has_turns_and_the_return_and_round_trips_through_parquet():
    s = _three_turns().to_sample("env0-000000001", 3, "stop")
    assert s.reward == pytest.approx(0.9) and s.num_turns == 3 and s.start_version == 0
    turn_versions = [sorted(set(s.token_versions[a:b])) for a, b in zip(s.turn_offsets, [7, 14, 16], strict=True)]
    assert turn_versions == [[0], [0, 1], [2]]
    back = decode_group(encode_group(Group("env0-000000001", 7, "frozenlake", [s])), "mem").samples[0]
    assert back == s


def test_turn_validation_names_the_problem():
    s = _three_turns().to_sample("g", 0, "stop")
    s.turn_offsets = [0, 3, 14]  # position 3 is an observation token
    with pytest.raises(ValueError, match="trained-on"):
        s.validate()
    s.turn_offsets, s.turn_rewards = [0, 7], [0.0]
    with pytest.raises(ValueError, match="one turn_rewards entry per turn offset"):
        s.validate()
    s.turn_offsets, s.turn_rewards = [0, 7, 14], [0.0, float("nan"), 1.0]
    with pytest.raises(ValueError, match="finite"):
        s.validate()
    s.turn_rewards = None
    with pytest.raises(ValueError, match="go together"):
        s.validate()


def test_a_turn_needs_a_generated_token_and_a_single_turn_sample_has_no_turns():
    t = MultiTurnTrajectory(prompt_ids=[1])
    with pytest.raises(ValueError, match="no turn is open"):
        t.end_turn(1.0)
    with pytest.raises(ValueError, match="no generated turn"):
        t.to_sample("g", 0, "stop")
    single = decode_group(encode_group(Group("g", 0, "arithmetic", [
        _three_turns().to_sample("g", 0, "stop")])), "mem").samples[0]
    single.turn_offsets = single.turn_rewards = None
    single.loss_mask = None
    again = decode_group(encode_group(Group("g", 0, "arithmetic", [single])), "mem").samples[0]
    assert again.turn_offsets is None and again.turn_rewards is None and again.num_turns == 1


def test_batch_trains_only_generated_tokens_and_puts_each_turn_reward_on_its_last_token():
    import torch

    from asyncrl.training.advantages import outcome_token_rewards
    from asyncrl.training.batch import build_batch, reward_positions

    multi = _three_turns().to_sample("g", 0, "stop")
    other = _three_turns().to_sample("g", 1, "stop")
    other.turn_rewards = [0.0, 0.0, 0.0]
    other.reward = 0.0
    assert reward_positions(multi) == [(2, 0.0), (9, -0.1), (15, 1.0)]
    batch = build_batch([Group("g", 7, "frozenlake", [multi, other])], norm_std=True, pad_id=0)
    p = len(multi.prompt_token_ids)
    assert batch.response_mask[0, p:].tolist() == [float(m) for m in multi.loss_mask]
    assert batch.response_mask[0, :p].sum() == 0
    row = batch.token_rewards[0, p:]
    assert torch.nonzero(row).flatten().tolist() == [9, 15]
    assert row[9].item() == pytest.approx(-0.1) and row[15].item() == 1.0
    assert batch.token_rewards[0].sum().item() == pytest.approx(multi.reward)
    # the group-normalised advantage reaches generated tokens only
    assert (batch.advantages[0, p:][torch.tensor(multi.loss_mask) == 0] != 0).all()  # stored, but masked out
    single = decode_group(encode_group(Group("g", 0, "arithmetic", [other])), "mem").samples[0]
    single.turn_offsets = single.turn_rewards = None
    single.loss_mask, single.reward = None, 0.5
    b1 = build_batch([Group("g", 0, "arithmetic", [single, single])], norm_std=True, pad_id=0)
    assert torch.equal(b1.token_rewards, outcome_token_rewards(b1.rewards, b1.response_mask))
