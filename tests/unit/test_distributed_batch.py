"""The data-parallel helpers of `asyncrl.training.distributed`: the row split, the padding micro batch, the header
bytes, the control channel over a real 2-process gloo group (command + batch broadcast, JSON gather, the
follower's deadline), and rank 0's decisions shared with every rank (`Decisions`: the batch, stop only while the
others wait)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.batch import TrainBatch, build_batch
from asyncrl.training.distributed import (
    ChannelTimeout,
    Command,
    batch_from_tensors,
    batch_tensors,
    decode_header,
    encode_header,
    masked_row,
    micro_batches_per_rank,
    rank_rows,
    shard_micro_batches,
)
from asyncrl.training.losses import policy_loss
from asyncrl.types import Group, Sample

RESPONSES = [[5], [6, 7], [5, 8, 9], [9], [6, 10]]


def _batch() -> TrainBatch:
    """5 rows in two groups (3 + 2 samples), responses of 1 to 3 tokens, rewards 1 for token 5 first."""
    samples = [Sample(f"g{i // 3}", i % 3, [1, 2, 3][: 1 + i % 3], r, [-0.5 - 0.1 * j for j in range(len(r))],
                      [0] * len(r), 0, reward=float(r[0] == 5)) for i, r in enumerate(RESPONSES)]
    groups = [Group("g0", 0, "t", samples[:3]), Group("g1", 1, "t", samples[3:])]
    return build_batch(groups, norm_std=True, pad_id=0)


# ---- pure --------------------------------------------------------------------------------------------------

def test_rank_rows_tile_in_order_and_differ_by_at_most_one():
    assert [rank_rows(5, r, 2) for r in range(2)] == [range(0, 3), range(3, 5)]
    assert [rank_rows(7, r, 3) for r in range(3)] == [range(0, 3), range(3, 5), range(5, 7)]
    assert [rank_rows(1, r, 3) for r in range(3)] == [range(0, 1), range(1, 1), range(1, 1)]
    assert rank_rows(4, 0, 1) == range(0, 4)
    with pytest.raises(ValueError, match="rank"):
        rank_rows(4, 2, 2)


def test_micro_batches_per_rank():
    assert micro_batches_per_rank(5, 2, 2) == 2  # shares 3 and 2 rows -> 2 and 1 micro batches
    assert micro_batches_per_rank(5, 1, 2) == 3
    assert micro_batches_per_rank(1, 4, 8) == 1  # ranks without rows still run one (padding) micro batch
    assert micro_batches_per_rank(8, 2, 4) == 1


def test_masked_row_trains_on_nothing():
    pad = masked_row(_batch())
    assert pad.num_samples == 1 and pad.num_tokens == 0 and pad.num_nonempty == 0
    assert float(pad.entropy_mask.abs().sum()) == 0.0 and float(pad.advantages.abs().sum()) == 0.0
    assert pad.input_ids[0].tolist() == [1, 5]  # row 0 (prompt [1], response [5]) trimmed to its length


def test_shard_equal_counts_and_padding():
    batch = _batch()
    r0 = shard_micro_batches(batch, 0, 2, 2)
    r1 = shard_micro_batches(batch, 1, 2, 2)
    assert [(mb.num_samples, pad) for mb, pad in r0] == [(2, False), (1, False)]
    assert [(mb.num_samples, pad) for mb, pad in r1] == [(2, False), (1, True)]
    assert r1[0][0].input_ids[:, :3].tolist() == batch.input_ids[3:5, :3].tolist()
    assert r1[1][0].num_tokens == 0
    # W = 1: exactly batch.split, no padding
    one = shard_micro_batches(batch, 0, 1, 2)
    split = batch.split(2)
    assert len(one) == 3 and not any(p for _, p in one)
    assert all(torch.equal(a.input_ids, b.input_ids) for (a, _), b in zip(one, split, strict=True))


@pytest.mark.parametrize("aggregation", ["seq-mean-token-mean", "token-mean"])
def test_rank_losses_sum_to_the_batch_loss(aggregation):
    """Σ over ranks and micro batches (padding included) of the micro losses = the whole batch's loss, so W·(the
    rank's sum) averaged over W ranks is the W = 1 gradient target."""
    batch = _batch()
    cfg = TrainingConfig(aggregation=aggregation, loss="decoupled_ppo")
    torch.manual_seed(0)
    logp_full = -torch.rand(batch.input_ids.shape) - 0.2

    def loss_of(mb: TrainBatch, logp: torch.Tensor) -> float:
        loss, _ = policy_loss(cfg, logp, logp + 0.05, mb.behav_logprobs, mb.advantages, mb.response_mask, mb.rewards,
                              num_samples=batch.num_nonempty, num_tokens=batch.num_tokens)
        return float(loss)

    whole = loss_of(batch, logp_full)
    total = 0.0
    for rank in range(2):
        rows = rank_rows(batch.num_samples, rank, 2)
        start = rows.start
        for mb, pad in shard_micro_batches(batch, rank, 2, 2):
            if pad:
                total += loss_of(mb, torch.zeros(mb.input_ids.shape))
                continue
            n, t = mb.num_samples, mb.input_ids.shape[1]
            total += loss_of(mb, logp_full[start : start + n, :t])
            start += n
    assert abs(whole) > 1e-3
    assert total == pytest.approx(whole, abs=1e-6)


def test_header_round_trip_and_errors():
    t = {"a": torch.zeros((2, 3), dtype=torch.float32), "b": torch.ones(4, dtype=torch.int64)}
    data = encode_header(Command("step", 7, {"train": True, "temperature": 0.7}), t)
    assert data.dtype == torch.uint8
    cmd, specs = decode_header(data)
    assert (cmd.command, cmd.step, cmd.info) == ("step", 7, {"train": True, "temperature": 0.7})
    assert specs == [("a", (2, 3), torch.float32), ("b", (4,), torch.int64)]
    with pytest.raises(ValueError, match="command"):
        encode_header(Command("go", 0), {})
    with pytest.raises(ValueError, match="dtype"):
        encode_header(Command("step", 0), {"c": torch.zeros(1, dtype=torch.complex64)})
    with pytest.raises(ValueError, match="control header"):
        decode_header(torch.frombuffer(bytearray(b"{not json"), dtype=torch.uint8))
    bad = json.dumps({"command": "jump", "step": 0, "info": {}, "tensors": []}).encode()
    with pytest.raises(ValueError, match="command expected"):
        decode_header(torch.frombuffer(bytearray(bad), dtype=torch.uint8))


def test_batch_tensors_round_trip_and_missing_field():
    batch = _batch()
    back = batch_from_tensors(batch_tensors(batch))
    assert all(torch.equal(a, b) for a, b in zip(batch_tensors(batch).values(), batch_tensors(back).values(),
                                                  strict=True))
    partial = batch_tensors(batch)
    del partial["rewards"]
    with pytest.raises(ValueError, match="missing \\['rewards'\\]"):
        batch_from_tensors(partial)


# ---- a real 2-process gloo group ---------------------------------------------------------------------------

def _worker(rank: int, store_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from asyncrl.training.distributed import ControlChannel

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    channel = ControlChannel.create(group_timeout_s=60)
    res: dict = {}
    batch = _batch()
    if rank == 0:
        channel.send(Command("step", 3, {"train": True, "next_wait_s": 2.0}), batch_tensors(batch), timeout_s=20)
    else:
        cmd, tensors = channel.receive(timeout_s=20)
        got = batch_from_tensors(tensors)
        res["command"] = [cmd.command, cmd.step, cmd.info]
        res["equal"] = all(torch.equal(a, b) and a.dtype == b.dtype for a, b in
                           zip(batch_tensors(batch).values(), batch_tensors(got).values(), strict=True))
    res["gathered"] = channel.all_gather_json([{"rank": rank, "x": 0.5 * rank}] * (rank + 1), timeout_s=20)
    if rank == 0:
        with pytest.raises(RuntimeError, match="does not receive"):
            channel.receive(timeout_s=1)
        time.sleep(4)  # send nothing: the follower's deadline must bite
    else:
        t0 = time.monotonic()
        try:
            channel.receive(timeout_s=1.5)
            res["timeout"] = "no error"
        except ChannelTimeout as e:
            res["timeout"] = str(e)
            res["timeout_s"] = time.monotonic() - t0
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(res))


@pytest.mark.timeout(120)
def test_control_channel_over_two_gloo_ranks(tmp_path):
    mp.start_processes(_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2, start_method="spawn")
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r1["command"] == ["step", 3, {"train": True, "next_wait_s": 2.0}]
    assert r1["equal"] is True
    expected = [[{"rank": 0, "x": 0.0}], [{"rank": 1, "x": 0.5}, {"rank": 1, "x": 0.5}]]
    assert r0["gathered"] == expected and r1["gathered"] == expected
    assert "waiting for the leader" in r1["timeout"]
    assert 1.4 < r1["timeout_s"] < 4.0


def _decisions_worker(rank: int, store_file: str, out_dir: str) -> None:
    import torch.distributed as dist

    from asyncrl.training.distributed import ControlChannel, Decisions

    dist.init_process_group("gloo", init_method=f"file://{store_file}", rank=rank, world_size=2)
    decisions = Decisions(ControlChannel.create(group_timeout_s=60), send_timeout_s=20)
    batch = _batch()
    res: dict = {}
    if rank == 0:
        cmd, got = decisions.share(Command("step", 4, {"checkpoint": True}), batch, wait_s=20)
        res["own_batch"] = got is batch  # rank 0 trains on its own batch, not a copy
        decisions.stop_peers(4)  # the other rank is in no `share` yet: nothing is sent
        decisions.share(Command("step", 5, {"checkpoint": False}), None, wait_s=20)  # a step without actor update
        decisions.peers_idle()
        decisions.stop_peers(5)  # now it waits in `share`: told to stop
        res["waiting_after_stop"] = decisions.peers_waiting
    else:
        cmd, got = decisions.share(None, None, wait_s=20)
        res["first"] = [cmd.command, cmd.step, cmd.info]
        res["equal"] = got is not None and all(torch.equal(a, b) for a, b in
                                               zip(batch_tensors(batch).values(), batch_tensors(got).values(),
                                                   strict=True))
        cmd, got = decisions.share(None, None, wait_s=20)
        res["second"] = [cmd.command, cmd.step, got is None]
        decisions.peers_idle()
        res["follower_waiting"] = decisions.peers_waiting  # only rank 0 tracks the others
        cmd, got = decisions.share(None, None, wait_s=20)
        res["third"] = [cmd.command, cmd.step, cmd.info]
    (Path(out_dir) / f"rank{rank}.json").write_text(json.dumps(res))
    dist.barrier()  # neither rank leaves while the other still uses the groups, then both take them down
    dist.destroy_process_group()


@pytest.mark.timeout(120)
def test_decisions_share_rank0s_command_and_stop_only_while_the_others_wait(tmp_path):
    mp.start_processes(_decisions_worker, args=(str(tmp_path / "store"), str(tmp_path)), nprocs=2,
                       start_method="spawn")
    r0 = json.loads((tmp_path / "rank0.json").read_text())
    r1 = json.loads((tmp_path / "rank1.json").read_text())
    assert r0 == {"own_batch": True, "waiting_after_stop": False}
    assert r1["first"] == ["step", 4, {"checkpoint": True}] and r1["equal"] is True
    assert r1["second"] == ["step", 5, True] and r1["follower_waiting"] is False
    assert r1["third"] == ["stop", 5, {"failed": True}]


def test_decisions_with_one_rank_return_what_rank_0_passed():
    from asyncrl.training.distributed import Decisions

    decisions = Decisions(None, send_timeout_s=1)
    batch = _batch()
    cmd = Command("step", 0, {"checkpoint": False})
    assert decisions.share(cmd, batch, wait_s=1) == (cmd, batch)
    decisions.peers_idle()
    assert decisions.peers_waiting is False
    decisions.stop_peers(0)  # nothing to tell
    with pytest.raises(ValueError, match="rank 0 decides"):
        decisions.share(None, None, wait_s=1)


def test_world_size_must_match_the_config():
    from asyncrl.roles.training import check_world_size

    check_world_size(1, 1)
    check_world_size(4, 4)
    with pytest.raises(ValueError, match=r"training.num_processes is 2 .*\(WORLD_SIZE=1\)"):
        check_world_size(2, 1)
