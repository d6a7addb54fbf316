"""Mini-batch updates (`training.mini_batches`, `training.epochs`): the row plan, the metrics of several
updates as one, one pass's micro-batch figures, the DeepSpeed batch arithmetic, and the config fields' bounds.
(The trainer itself: tests/integration/test_policy_mini_batches.py.)"""

from __future__ import annotations

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config.schema import TrainingConfig
from asyncrl.training.batch import build_batch
from asyncrl.training.deepspeed_config import deepspeed_config
from asyncrl.training.micro_batches import plan_metrics
from asyncrl.training.mini_batches import (
    combine_updates,
    mini_batch_rows,
    pass_plan_metrics,
    plan_updates,
    step_metrics,
)
from asyncrl.types import Group, Sample


def test_mini_batch_rows_tile_the_rows_in_order_with_sizes_within_one() -> None:
    assert mini_batch_rows(10, 3) == [range(0, 4), range(4, 7), range(7, 10)]
    assert mini_batch_rows(8, 2) == [range(0, 4), range(4, 8)]
    assert mini_batch_rows(5, 5) == [range(k, k + 1) for k in range(5)]
    assert mini_batch_rows(7, 1) == [range(0, 7)]
    for rows in range(1, 40):
        for k in range(1, rows + 1):
            plan = mini_batch_rows(rows, k)
            assert [i for r in plan for i in r] == list(range(rows))
            sizes = [len(r) for r in plan]
            assert len(plan) == k and min(sizes) >= 1 and max(sizes) - min(sizes) <= 1
            assert sizes == sorted(sizes, reverse=True)  # the first rows % k get the extra row


@pytest.mark.parametrize(("rows", "k", "needle"), [
    (8, 9, "training.mini_batches: expected at most the step's 8 samples (every mini-batch needs one), "
           "got 9"),
    (0, 1, "training.mini_batches: expected at most the step's 0 samples"),
    (8, 0, "training.mini_batches: expected >= 1, got 0"),
])
def test_mini_batch_rows_errors_name_the_field(rows: int, k: int, needle: str) -> None:
    with pytest.raises(ValueError) as err:
        mini_batch_rows(rows, k)
    assert needle in str(err.value)


def test_combine_updates_means_maxes_and_one_pass_of_tokens() -> None:
    a = {"loss": 1.0, "pg_loss": 0.5, "clip_fraction": 0.0, "iw_max": 1.5, "tokens": 10.0, "grad_norm": 2.0}
    b = {"loss": -3.0, "pg_loss": 0.25, "clip_fraction": 0.5, "iw_max": 3.0, "tokens": 6.0, "grad_norm": 4.0}
    # two mini-batches, two passes: tokens of one pass (10 + 6), everything else over the four updates
    out = combine_updates([a, b, a, b], mini_batches=2)
    assert out == {"loss": -1.0, "pg_loss": 0.375, "clip_fraction": 0.25, "iw_max": 3.0, "tokens": 16.0,
                   "grad_norm": 3.0}
    # one mini-batch, two passes: the batch's tokens once
    assert combine_updates([a, b], mini_batches=1)["tokens"] == 10.0
    # a key some updates lack is the mean over those that report it
    assert combine_updates([a, {**b, "kl_ref": 0.5}], mini_batches=2)["kl_ref"] == 0.5
    # one update: unchanged, the very same numbers
    assert combine_updates([a], mini_batches=1) == a
    assert combine_updates([], mini_batches=1) == {}


def test_pass_plan_metrics_is_plan_metrics_for_one_mini_batch_and_adds_up_over_several() -> None:
    lengths = [5, 9, 3, 9, 4, 2, 7]
    for world, size, tokens in [(1, 3, None), (2, 2, None), (1, 8, 16), (2, 8, 12)]:
        assert pass_plan_metrics([lengths], world, size, tokens) == plan_metrics(lengths, world, size, tokens)
    # mini-batches [5, 9, 3, 9] and [4, 2, 7], by 2: [5, 9] [3, 9] -> 18 + 18, [4, 2] [7] -> 8 + 7
    out = pass_plan_metrics([lengths[:4], lengths[4:]], 1, 2)
    assert out == {"padding_fraction": pytest.approx(1 - 39 / 51), "micro_batches": 4.0,
                   "computed_tokens": 51.0}


def _arithmetic(ds: dict) -> tuple[int, int, int]:
    return ds["train_batch_size"], ds["train_micro_batch_size_per_gpu"], ds["gradient_accumulation_steps"]


def _batch():
    """Group g0 of rewards 1, 0, 0 (signal); group g1 of rewards 0, 0, 0 (all advantages 0); responses of 1,
    2, 1, 2, 1, 2 tokens after a prompt of 2."""
    samples = []
    for i in range(6):
        n = 1 + i % 2
        samples.append(Sample(f"g{i // 3}", i % 3, [1, 2], [5] * n, [-1.0] * n, [0] * n, 0,
                              reward=float(i == 0)))
    groups = [Group("g0", 0, "t", samples[:3]), Group("g1", 1, "t", samples[3:])]
    return build_batch(groups, norm_std=True, pad_id=0)


def test_plan_updates_denominators_before_skipping_and_equal_micro_counts_per_rank() -> None:
    batch = _batch()
    cfg = TrainingConfig(mini_batches=2)
    # rows 0-2 (g0: 3 samples, 1 + 2 + 1 tokens, all computed) and rows 3-5 (g1: 3 samples, 2 + 1 + 2 tokens,
    # advantage 0: only the first row is computed, the denominators still count all three)
    minis = plan_updates(batch, cfg, 0.0, rank=0, world_size=1, micro_batch_size=2)
    assert [(m.num_samples, m.num_tokens, m.computed.num_samples, len(m.micro)) for m in minis] == [
        (3, 4, 3, 2), (3, 5, 1, 1)]
    assert all(m.prox is None for m in minis)
    # two ranks: rows 0-2 split 2 + 1 (one micro batch each), rows 3-5 computed as one row: rank 1 pads
    ranks = [plan_updates(batch, cfg, 0.0, rank=r, world_size=2, micro_batch_size=2) for r in range(2)]
    assert [[[padding for _, padding in m.micro] for m in minis] for minis in ranks] == [
        [[False], [False]], [[False], [True]]]
    updates = [{"loss": 1.0, "tokens": 4.0}, {"loss": 3.0, "tokens": 2.0}] * 2
    metrics = step_metrics(batch, minis, updates, 1, 2, None)
    # 4 updates (2 passes), the batch's 9 trained tokens, 2 rows skipped; one pass: rows of 3, 4, 3 by 2
    # ([3, 4], [3]) and the row of 4 alone: 3 micro batches, 8 + 3 + 4 = 15 computed tokens for 14
    assert metrics == {"loss": 2.0, "tokens": 6.0, "skipped_rows": 2.0, "batch_tokens": 9.0, "updates": 4.0,
                       "padding_fraction": pytest.approx(1 / 15), "micro_batches": 3.0,
                       "computed_tokens": 15.0}


def test_deepspeed_batch_arithmetic_is_that_of_one_optimizer_step() -> None:
    one = deepspeed_config(TrainingConfig(micro_batch_size=4), batch_size=64, world_size=2)
    assert _arithmetic(one) == (64, 4, 8)
    # 4 mini-batches of 16 samples: 8 a rank, 2 micro batches of 4
    four = deepspeed_config(TrainingConfig(micro_batch_size=4, mini_batches=4), batch_size=64, world_size=2)
    assert _arithmetic(four) == (16, 4, 2)
    # mini-batches of 3 and 2 samples on one rank, micro batches of 4: one micro batch of 3 (the largest)
    odd = deepspeed_config(TrainingConfig(micro_batch_size=4, mini_batches=2), batch_size=5)
    assert _arithmetic(odd) == (3, 3, 1)


def test_config_fields_default_to_one_update_and_are_bounded() -> None:
    cfg = TrainingConfig()
    assert (cfg.mini_batches, cfg.epochs) == (1, 1)
    assert TrainingConfig(mini_batches=64, epochs=16).epochs == 16
    for field, value in (("mini_batches", 0), ("epochs", 0), ("epochs", 17)):
        with pytest.raises(ValueError, match=field):
            TrainingConfig(**{field: value})


@pytest.mark.parametrize(("override", "needle"), [
    ("training.mini_batches=65", "training.mini_batches: expected <= rollout.prompts_per_step * "
                                 "rollout.samples_per_prompt = 64 (every mini-batch needs a sample), got 65"),
    ("training.mini_batches=0", "training.mini_batches: Input should be greater than or equal to 1"),
    ("training.epochs=17", "training.epochs: Input should be less than or equal to 16"),
])
def test_run_config_errors_name_the_field(override: str, needle: str) -> None:
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.max_new_tokens=12", override])
    assert needle in str(err.value)


def test_run_config_takes_as_many_mini_batches_as_samples() -> None:
    cfg = load_config(None, ["rollout.max_new_tokens=12", "training.mini_batches=64", "training.epochs=2"])
    assert (cfg.training.mini_batches, cfg.training.epochs) == (64, 2)
