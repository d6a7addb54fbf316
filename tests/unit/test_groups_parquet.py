"""Parquet encoding of groups and the S3 key layout: pure, no server."""

from __future__ import annotations

import io

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from asyncrl.storage.groups import GROUP_SCHEMA, decode_group, decode_groups, encode_group, encode_groups
from asyncrl.storage.run_layout import RunPaths, parse_run_url, run_url
from asyncrl.types import Group, Sample


def make_group(gid: str = "g1", n: int = 3, prompt_index: int = 7) -> Group:
    samples = [
        Sample(
            group_id=gid,
            sample_index=i,
            prompt_token_ids=[1, 20, 30 + i],
            token_ids=[5 + i, 6, 2],
            # values that float32 would round: the encoding must keep them exactly
            logprobs=[-0.1, -1.0 / 3.0, -2.718281828459045 * (i + 1)],
            token_versions=[3, 4, 4 + i],
            start_version=3,
            reward=float(i) * 0.5,
            finish_reason="stop" if i else "length",
        )
        for i in range(n)
    ]
    return Group(group_id=gid, prompt_index=prompt_index, task="arithmetic", samples=samples)


def test_round_trip_is_exact() -> None:
    g = make_group()
    data = encode_group(g)
    assert data[:4] == b"PAR1"
    back = decode_group(data, "mem://g1")
    assert back == g
    assert back.samples[1].logprobs[1] == -1.0 / 3.0  # float64, bit-exact
    assert back.start_version == 3 and back.rewards == [0.0, 0.5, 1.0]


def test_loss_mask_round_trips_and_is_checked() -> None:
    g = make_group(n=2)
    g.samples[0].loss_mask = [1, 0, 0]
    back = decode_group(encode_group(g), "mem://g1")
    assert back.samples[0].loss_mask == [1, 0, 0] and back.samples[1].loss_mask is None
    g.samples[1].loss_mask = [1, 1]
    with pytest.raises(ValueError, match="loss_mask must hold one 0/1 entry per response token"):
        encode_group(g)


def test_segmented_sample_round_trips() -> None:
    g = make_group(n=2)
    s = g.samples[0]
    s.token_ids, s.logprobs, s.token_versions = [5, 6, 40, 7], [-0.1, -0.2, 0.0, -0.3], [3, 3, 3, 4]
    s.loss_mask, s.segment_offsets = [1, 1, 0, 1], [2]  # segment 1: prompt [40], response [7]
    back = decode_group(encode_group(g), "mem://g1")
    assert back == g
    assert back.samples[0].segment_offsets == [2] and back.samples[1].segment_offsets is None


def test_file_schema_and_compression() -> None:
    meta = pq.ParquetFile(pa.BufferReader(encode_group(make_group()))).metadata
    assert meta.num_rows == 3
    assert meta.row_group(0).column(0).compression == "ZSTD"
    schema = pq.read_schema(pa.BufferReader(encode_group(make_group())))
    assert schema.names == GROUP_SCHEMA.names
    assert schema.field("token_ids").type.value_type == pa.int32()
    assert schema.field("logprobs").type.value_type == pa.float64()


def test_several_groups_in_one_object_keep_order() -> None:
    a, b = make_group("a", 2, 1), make_group("b", 4, 2)
    back = decode_groups(encode_groups([a, b]), "mem://ab")
    assert [g.group_id for g in back] == ["a", "b"]
    assert back == [a, b]
    with pytest.raises(ValueError, match="mem://ab: expected exactly one group, found 2"):
        decode_group(encode_groups([a, b]), "mem://ab")


def test_encode_rejects_invalid_group() -> None:
    g = make_group()
    g.samples[0].logprobs.pop()
    with pytest.raises(ValueError, match="one entry per response token"):
        encode_group(g)
    with pytest.raises(ValueError, match="at least one group"):
        encode_groups([])


def _table_bytes(table: pa.Table) -> bytes:
    buf = io.BytesIO()
    pq.write_table(table, buf)
    return buf.getvalue()


def _good_table() -> pa.Table:
    return pq.read_table(pa.BufferReader(encode_group(make_group())))


def test_decode_names_source_and_missing_column() -> None:
    data = _table_bytes(_good_table().drop_columns(["token_versions"]))
    with pytest.raises(ValueError, match=r"s3://b/k\.parquet: missing column 'token_versions'"):
        decode_group(data, "s3://b/k.parquet")


def test_object_without_segment_offsets_column_reads_as_single_segments() -> None:
    old = _good_table().drop_columns(["segment_offsets"])  # an object written before the column existed
    back = decode_group(_table_bytes(old), "mem://old")
    assert back == make_group() and all(s.segment_offsets is None for s in back.samples)


def test_decode_names_mistyped_column() -> None:
    t = _good_table()
    i = t.schema.get_field_index("reward")
    t = t.set_column(i, "reward", pa.array(["1", "2", "3"]))
    with pytest.raises(ValueError, match=r"src: column 'reward' has type string, expected double"):
        decode_group(_table_bytes(t), "src")


def test_decode_rejects_nulls_garbage_and_invalid_samples() -> None:
    t = _good_table()
    i = t.schema.get_field_index("task")
    with pytest.raises(ValueError, match="column 'task' has 1 null"):
        decode_group(_table_bytes(t.set_column(i, "task", pa.array(["x", None, "x"]))), "src")
    with pytest.raises(ValueError, match="src: not a readable Parquet file"):
        decode_group(b"not parquet at all", "src")
    # token_versions below start_version: Group.validate() runs on decode
    j = t.schema.get_field_index("start_version")
    bad = t.set_column(j, "start_version", pa.array([9, 9, 9], pa.int64()))
    with pytest.raises(ValueError, match="src: sample g1/0: token_versions must be non-decreasing"):
        decode_group(_table_bytes(bad), "src")


def test_run_paths_layout() -> None:
    p = RunPaths("runs/exp", "r-1")
    assert p.root == "runs/exp/r-1"
    assert p.config() == "runs/exp/r-1/config.json"
    assert p.tracking() == "runs/exp/r-1/tracking.json"
    assert p.rendezvous("generation", "0") == "runs/exp/r-1/rendezvous/generation/0.json"
    assert p.rendezvous_prefix("reward") == "runs/exp/r-1/rendezvous/reward/"
    assert p.group("env0", 42) == "runs/exp/r-1/groups/env0/000000000042.parquet"
    assert p.groups_prefix() == "runs/exp/r-1/groups/"
    assert p.groups_prefix("env0") == "runs/exp/r-1/groups/env0/"
    assert p.versions_latest() == "runs/exp/r-1/versions/latest.json"
    assert p.checkpoint(12, "model.safetensors") == "runs/exp/r-1/checkpoints/12/model.safetensors"
    assert p.checkpoint_prefix(12) == "runs/exp/r-1/checkpoints/12/"
    assert p.checkpoint_committed(3) == "runs/exp/r-1/checkpoints/3/COMMITTED"
    assert p.done() == "runs/exp/r-1/done"
    assert p.parse_group_key(p.group("env0", 42)) == ("env0", 42)
    assert p.parse_group_key("runs/exp/r-1/groups/env0/42.parquet") is None
    assert RunPaths("", "r1").config() == "r1/config.json"
    assert RunPaths("/a//b/", "r1").root == "a/b/r1"


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda p: p.group("env/0", 1), "writer"),
        (lambda p: p.group("env.0", 1), "writer"),
        (lambda p: p.group("env0", -1), "seq"),
        (lambda p: p.rendezvous("gen", "a b"), "rendezvous id"),
        (lambda p: p.rendezvous("ge/n", "0"), "role"),
        (lambda p: p.checkpoint(1, "a/b"), "checkpoint file name"),
    ],
)
def test_run_paths_reject_bad_ids(call, match: str) -> None:  # noqa: ANN001
    with pytest.raises(ValueError, match=match):
        call(RunPaths("runs", "r1"))


def test_run_url_round_trip_and_errors() -> None:
    assert parse_run_url("s3://asyncrl/runs/exp/r-1") == ("asyncrl", "runs/exp", "r-1")
    assert parse_run_url("s3://asyncrl/r-1") == ("asyncrl", "", "r-1")
    assert run_url("asyncrl", "runs/exp", "r-1") == "s3://asyncrl/runs/exp/r-1"
    assert run_url("asyncrl", "", "r-1") == "s3://asyncrl/r-1"
    for bad in ("http://asyncrl/runs/r1", "s3://asyncrl", "s3://Bad_Bucket/runs/r1", "s3://asyncrl/runs/r 1"):
        with pytest.raises(ValueError):
            parse_run_url(bad)
    with pytest.raises(ValueError, match="run_id"):
        RunPaths("runs", "..")
