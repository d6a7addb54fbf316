"""Overlong handling (docs/algorithms.md §7) with exact numbers: the DAPO soft penalty, masking truncated samples,
the writer's counters, the config's checks, and the trainer's per-step length metrics from Parquet-decoded groups."""

from __future__ import annotations

import pytest
import torch

from asyncrl.config import load_config
from asyncrl.config.load import ConfigError
from asyncrl.rollout.overlong import OverlongShaper, apply_overlong, cache_tokens, is_truncated, soft_penalty
from asyncrl.rollout.scheduler import DropGroup, EmitGroup, RolloutScheduler, SchedulerConfig
from asyncrl.storage.groups import decode_group, encode_group
from asyncrl.training.batch import build_batch
from asyncrl.training.length_metrics import response_length_metrics
from asyncrl.types import Group, Sample


def sample(i: int, length: int, finish: str, reward: float = 1.0, gid: str = "g") -> Sample:
    return Sample(group_id=gid, sample_index=i, prompt_token_ids=[1, 7], token_ids=[5] * length,
                  logprobs=[-0.5] * length, token_versions=[0] * length, start_version=0, reward=reward,
                  finish_reason=finish)


def test_soft_penalty_is_dapos_linear_ramp() -> None:
    # L_max = 16, L_c = 4: no penalty up to 12 tokens, then (12 - |y|) / 4 down to -1 at 16
    penalties = [soft_penalty(n, 16, 4) for n in (0, 11, 12, 13, 14, 15, 16)]
    assert penalties == [0.0, 0.0, 0.0, -0.25, -0.5, -0.75, -1.0]
    assert soft_penalty(7, 8, 3) == pytest.approx(-2 / 3)
    with pytest.raises(ValueError, match=r"rollout.overlong_cache_tokens: expected 1 <= L_c < max_new_tokens \(16\)"):
        soft_penalty(3, 16, 16)
    with pytest.raises(ValueError, match="overlong_cache_tokens"):
        soft_penalty(3, 16, 0)
    with pytest.raises(ValueError, match=r"expected a response length in 0..16 \(max_new_tokens\), got 17"):
        soft_penalty(17, 16, 4)


def test_cache_defaults_to_a_quarter_of_max_new_tokens() -> None:
    assert (cache_tokens(16, None), cache_tokens(64, None), cache_tokens(17, None), cache_tokens(16, 6)) == (4, 16, 4, 6)


def test_truncated_means_finish_reason_length() -> None:
    assert is_truncated("length") and not is_truncated("stop") and not is_truncated("abort")


def test_each_mode_changes_only_what_it_says() -> None:
    kept = apply_overlong("keep", 1.0, 16, "length", None, 16, 4)
    assert (kept.reward, kept.loss_mask, kept.truncated, kept.masked, kept.penalty) == (1.0, None, True, False, 0.0)
    masked = apply_overlong("mask", 1.0, 3, "length", None, 16, 4)
    assert (masked.reward, masked.loss_mask, masked.masked) == (1.0, [0, 0, 0], True)
    stopped = apply_overlong("mask", 0.0, 16, "stop", None, 16, 4)  # a full-length answer that ended: kept
    assert (stopped.reward, stopped.loss_mask, stopped.truncated, stopped.masked) == (0.0, None, False, False)
    # soft penalty from the length alone, truncated or not; the mask is untouched
    late = apply_overlong("soft_penalty", 1.0, 14, "stop", [1, 0] * 7, 16, 4)
    assert (late.reward, late.loss_mask, late.penalty, late.truncated) == (0.5, [1, 0] * 7, -0.5, False)
    cut = apply_overlong("soft_penalty", 1.0, 16, "length", None, 16, 4)
    assert (cut.reward, cut.penalty, cut.truncated) == (0.0, -1.0, True)
    short = apply_overlong("soft_penalty", 1.0, 12, "stop", None, 16, 4)
    assert (short.reward, short.penalty) == (1.0, 0.0)
    with pytest.raises(ValueError, match="rollout.overlong: expected 'keep', 'mask' or 'soft_penalty', got 'drop'"):
        apply_overlong("drop", 1.0, 3, "stop", None, 16, 4)  # type: ignore[arg-type]


def test_the_shaper_sets_reward_and_mask_in_place_and_counts() -> None:
    masker = OverlongShaper("mask", 8, None)
    a, b, c = sample(0, 8, "length"), sample(1, 4, "stop"), sample(2, 8, "length", reward=0.0)
    assert [masker.apply(s) for s in (a, b, c)] == [1.0, 1.0, 0.0]
    assert (a.loss_mask, b.loss_mask, c.loss_mask) == ([0] * 8, None, [0] * 8)
    a.validate()
    assert masker.metrics() == {"rollout/truncated_samples": 2.0, "rollout/overlong_masked_samples": 2.0,
                                "rollout/overlong_penalized_samples": 0.0}
    penal = OverlongShaper("soft_penalty", 8, None)  # L_c = 2: penalty past 6 tokens
    x, y, z = sample(0, 8, "length"), sample(1, 7, "stop"), sample(2, 6, "stop")
    assert [penal.apply(s) for s in (x, y, z)] == [0.0, 0.5, 1.0]
    assert (x.reward, y.reward, z.reward, x.loss_mask) == (0.0, 0.5, 1.0, None)
    assert penal.metrics() == {"rollout/truncated_samples": 1.0, "rollout/overlong_masked_samples": 0.0,
                               "rollout/overlong_penalized_samples": 2.0}


def test_dynamic_filtering_sees_the_shaped_reward() -> None:
    """Two correct answers (reward 1) of different lengths: all equal before shaping (filtered), different after
    (emitted), as the environment role scores: shape first, then `sample_scored`."""
    for mode, expected in (("keep", DropGroup), ("soft_penalty", EmitGroup)):
        sched = RolloutScheduler(SchedulerConfig(async_ratio=0, prompts_per_step=1, group_size=2, dynamic_filter=True))
        shaper = OverlongShaper(mode, 8, None)  # type: ignore[arg-type]
        starts = sched.offer_prompt(0, 2)
        out = []
        for d, length in zip(starts, (4, 7), strict=True):
            sched.request_finished(d.group_id, d.sample_index, length)
            out = sched.sample_scored(d.group_id, d.sample_index, shaper.apply(sample(d.sample_index, length, "stop")))
        assert isinstance(out[-1], expected), (mode, out)
        sched.check_invariants()


def test_a_masked_sample_still_counts_in_its_groups_advantages() -> None:
    """rewards [1, 0, 0], sample 0 truncated and masked: the others' advantages are those of the unmasked group,
    (0 - 1/3) / (std + 1e-6) with the unbiased std sqrt(1/3); sample 0's row trains on nothing."""
    shaper = OverlongShaper("mask", 8, None)
    samples = [sample(0, 8, "length", 1.0), sample(1, 3, "stop", 0.0), sample(2, 5, "stop", 0.0)]
    for s in samples:
        shaper.apply(s)
    batch = build_batch([Group("g", 0, "arithmetic", samples)], norm_std=True, pad_id=0)
    assert batch.response_mask[0].sum() == 0 and batch.response_mask[1].sum() == 3 and batch.response_mask[2].sum() == 5
    expected = (0.0 - 1 / 3) / ((1 / 3) ** 0.5 + 1e-6)
    assert batch.advantages[1, 2].item() == pytest.approx(expected, rel=1e-6)
    assert batch.advantages[0, 2].item() == pytest.approx(-2 * expected, rel=1e-5)  # still computed, never trained
    assert batch.num_nonempty == 2 and batch.num_tokens == 8
    assert torch.equal(batch.rewards, torch.tensor([1.0, 0.0, 0.0]))


def test_length_metrics_of_a_step_from_parquet_decoded_groups() -> None:
    """finish_reason and the zeroed mask travel through the group's Parquet object to the trainer's metrics."""
    g1 = Group("g1", 0, "arithmetic", [sample(0, 3, "stop", gid="g1"), sample(1, 8, "length", gid="g1")])
    g2 = Group("g2", 1, "arithmetic", [sample(0, 8, "length", gid="g2"), sample(1, 5, "stop", gid="g2")])
    shaper = OverlongShaper("mask", 8, None)
    shaper.apply(g1.samples[1])  # masked; g2's truncated sample was written under keep
    back = [decode_group(encode_group(g), f"mem://{g.group_id}") for g in (g1, g2)]
    assert back[0].samples[1].finish_reason == "length" and back[0].samples[1].loss_mask == [0] * 8
    assert response_length_metrics(back, "mask") == {
        "train/response_length_mean": 24 / 4, "train/response_length_max": 8.0, "train/truncated_fraction": 0.5,
        "train/overlong_masked_fraction": 0.25}
    assert "train/overlong_masked_fraction" not in response_length_metrics(back, "keep")
    with pytest.raises(ValueError, match="at least one sample"):
        response_length_metrics([], "keep")


def test_config_checks_name_the_field() -> None:
    ro = load_config(None, ["rollout.overlong=soft_penalty", "rollout.max_new_tokens=16"]).rollout
    assert (ro.overlong, ro.overlong_cache_tokens, ro.max_refill) == ("soft_penalty", None, 2)
    assert load_config(None, ["rollout.overlong_cache_tokens=7"]).rollout.overlong_cache_tokens == 7
    with pytest.raises(ConfigError, match=r"rollout.overlong_cache_tokens: expected < rollout.max_new_tokens \(8\), "
                                          r"got 8"):
        load_config(None, ["rollout.overlong_cache_tokens=8"])
    with pytest.raises(ConfigError, match="overlong_cache_tokens"):
        load_config(None, ["rollout.overlong_cache_tokens=0"])
    with pytest.raises(ConfigError, match=r"rollout.overlong_cache_tokens: soft_penalty needs L_c >= 1"):
        load_config(None, ["rollout.overlong=soft_penalty", "rollout.max_new_tokens=3",
                           "generation.max_model_len=64"])
    with pytest.raises(ConfigError, match=r"rollout.overlong: expected 'keep' with rollout.length_tail"):
        load_config(None, ["rollout.overlong=mask", "rollout.length_tail.median_tokens=4"])
    with pytest.raises(ConfigError, match="overlong"):
        load_config(None, ["rollout.overlong=drop"])
    with pytest.raises(ConfigError, match="max_refill"):
        load_config(None, ["rollout.max_refill=-1"])
