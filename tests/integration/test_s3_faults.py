"""Object-store faults against a real SeaweedFS server: an outage ridden out, a deadline honoured, a
corrupt group quarantined, a conditional PUT whose response was lost, a gap in a writer's stream."""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from typing import Any

import pytest
from botocore.exceptions import EndpointConnectionError, ReadTimeoutError

from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.groups import GapRecord, GroupReader, GroupWriter, encode_group
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store, StorageError
from asyncrl.types import Group, Sample

pytestmark = pytest.mark.integration


def group(gid: str) -> Group:
    s = Sample(gid, 0, [1, 2], [3, 4], [-0.5, -0.25], [0, 1], start_version=0, reward=1.0)
    return Group(gid, prompt_index=0, task="arithmetic", samples=[s])


@pytest.fixture(scope="module")
def own_s3(s3_server: EmbeddedS3, tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """A private server (stopping it must not break other tests), with the session server's keys so
    the credentials in os.environ fit both."""
    server = EmbeddedS3(tmp_path_factory.mktemp("faults") / "data", s3_server.access_key, s3_server.secret_key)
    server.start(timeout_s=90)
    try:
        yield server
    finally:
        server.stop()


def test_deadline_shorter_than_outage_names_the_key(own_s3: EmbeddedS3) -> None:
    store = S3Store(own_s3.endpoint_url, "deadline", timeout_s=2.0, retry_deadline_s=3.0, retry_base_s=0.1)
    store.ensure_bucket()
    own_s3.stop()
    try:
        t0 = time.monotonic()
        with pytest.raises(StorageError, match=r"get s3://deadline/some/key: gave up after \d+ attempt") as info:
            store.get_bytes("some/key")
        elapsed = time.monotonic() - t0
        assert 3.0 <= elapsed < 3.0 + 2.0, elapsed
        assert "deadline 3s" in str(info.value)
        assert store.stats.gave_up == 1 and store.stats.retries >= 3
    finally:
        own_s3.start(timeout_s=90, same_ports=True)


def test_outage_of_several_seconds_is_ridden_out(own_s3: EmbeddedS3) -> None:
    endpoint = own_s3.endpoint_url
    store = S3Store(endpoint, "outage", timeout_s=5.0, retry_deadline_s=60.0, retry_cap_s=1.0)
    store.ensure_bucket()
    store.put_json("before.json", {"x": 0})
    own_s3.stop()
    results: dict[str, Any] = {}

    def run(name: str, fn: Any) -> None:
        try:
            results[name] = fn()
        except Exception as e:  # recorded and asserted on below
            results[name] = e

    threads = [
        threading.Thread(target=run, args=("put", lambda: store.put_json("during.json", {"x": 1}, if_absent=True))),
        threading.Thread(target=run, args=("get", lambda: store.get_json("before.json"))),
    ]
    for t in threads:
        t.start()
    time.sleep(5.0)
    assert all(t.is_alive() for t in threads), results  # still retrying, not failed
    own_s3.start(timeout_s=90, same_ports=True)
    assert own_s3.endpoint_url == endpoint
    for t in threads:
        t.join(timeout=60)
    assert not any(t.is_alive() for t in threads)
    assert results == {"put": None, "get": {"x": 0}}
    assert store.get_json("during.json") == {"x": 1}
    assert store.stats.retries >= 4  # each call failed at least twice while the server was down
    assert store.stats.gave_up == 0


def test_truncated_group_is_quarantined_counted_and_skipped(s3_store: S3Store) -> None:
    paths = RunPaths("runs", "q1")
    writer = GroupWriter(s3_store, paths, "env0")
    keys = [writer.write(group(f"g{i}")) for i in range(3)]
    good = s3_store.get_bytes(keys[1])
    assert good is not None
    bad = good[: len(good) // 2]
    s3_store.put_bytes(keys[1], bad)  # raw overwrite: a truncated object

    reader = GroupReader(s3_store, paths)
    got = reader.poll()
    assert [(w, s, g.group_id) for w, s, g in got] == [("env0", 0, "g0"), ("env0", 2, "g2")]
    assert reader.cursors == {"env0": 3}
    assert [(r.writer, r.seq, r.key, r.quarantine_key) for r in reader.quarantined] == [
        ("env0", 1, keys[1], paths.quarantine_group("env0", 1))
    ]
    assert "not a readable Parquet" in reader.quarantined[0].reason
    assert s3_store.get_bytes(paths.quarantine_group("env0", 1)) == bad
    assert s3_store.get_bytes(keys[1]) == bad  # the original is left in place
    assert reader.poll() == []  # nothing is returned twice
    writer.write(group("g3"))
    assert [g.group_id for _, _, g in reader.poll()] == ["g3"]
    assert len(reader.quarantined) == 1

    # a reader restored from an older checkpoint meets the same object: quarantined again, no error
    r2 = GroupReader(s3_store, paths)
    r2.restore({"env0": 1})
    assert [g.group_id for _, _, g in r2.poll()] == ["g2", "g3"]
    assert [r.seq for r in r2.quarantined] == [1]


def test_wrong_schema_and_invalid_group_are_quarantined(s3_store: S3Store) -> None:
    import io

    import pyarrow as pa
    import pyarrow.parquet as pq

    paths = RunPaths("runs", "q2")
    buf = io.BytesIO()
    pq.write_table(pa.table({"group_id": ["x"]}), buf)
    s3_store.put_bytes(paths.group("envA", 0), buf.getvalue())
    s3_store.put_bytes(paths.group("envA", 1), encode_group(group("ok")))
    reader = GroupReader(s3_store, paths)
    assert [(w, s) for w, s, _ in reader.poll()] == [("envA", 1)]
    assert [(r.seq, "missing column" in r.reason) for r in reader.quarantined] == [(0, True)]


def test_conditional_put_after_lost_response(s3_store: S3Store, s3_server: EmbeddedS3) -> None:
    def lose_first_response(op: str, where: str, attempt: int, phase: str) -> None:
        if op == "put" and phase == "after" and attempt == 1:
            raise ReadTimeoutError(endpoint_url=where)  # the server wrote it; we never heard back

    store = S3Store(s3_server.endpoint_url, s3_store.bucket, retry_base_s=0.01, fault_hook=lose_first_response)
    store.put_bytes("once", b"ours", if_absent=True)  # retried, 412, same bytes: success
    assert store.get_bytes("once") == b"ours"
    assert store.stats.retries == 1

    # the same through a group writer: one object at seq 0, no duplicate at seq 1
    paths = RunPaths("runs", "lost")
    writer = GroupWriter(store, paths, "env0")
    assert writer.write(group("g0")) == paths.group("env0", 0)
    assert writer.write(group("g1")) == paths.group("env0", 1)
    assert s3_store.list_keys(paths.groups_prefix()) == [paths.group("env0", 0), paths.group("env0", 1)]

    def fail_first_request(op: str, where: str, attempt: int, phase: str) -> None:
        if op == "put" and phase == "before" and attempt == 1:
            raise EndpointConnectionError(endpoint_url=where)

    other = S3Store(s3_server.endpoint_url, s3_store.bucket, retry_base_s=0.01, fault_hook=fail_first_request)
    with pytest.raises(ObjectExists, match="once already exists"):
        other.put_bytes("once", b"theirs", if_absent=True)  # retried, 412, other bytes
    assert s3_store.get_bytes("once") == b"ours"
    with pytest.raises(ObjectExists):  # a 412 on the first attempt: no retry, no read-back
        s3_store.put_bytes("once", b"ours", if_absent=True)


def test_gap_is_waited_for_then_skipped_and_reported(s3_store: S3Store) -> None:
    paths = RunPaths("runs", f"gap-{uuid.uuid4().hex[:6]}")
    s3_store.put_bytes(paths.group("env0", 0), encode_group(group("g0")))
    s3_store.put_bytes(paths.group("env0", 2), encode_group(group("g2")))
    reader = GroupReader(s3_store, paths, gap_wait_s=1.5, gap_check_interval_s=0.0)
    assert [g.group_id for _, _, g in reader.poll()] == ["g0"]
    assert reader.cursors == {"env0": 1} and reader.gaps_skipped == []
    # the missing object arrives within the wait: read in order, nothing skipped
    s3_store.put_bytes(paths.group("env0", 1), encode_group(group("g1")))
    assert [g.group_id for _, _, g in reader.poll()] == ["g1", "g2"]
    assert reader.gaps_skipped == []

    s3_store.put_bytes(paths.group("env0", 5), encode_group(group("g5")))  # seqs 3 and 4 never come
    assert reader.poll() == []
    time.sleep(0.5)
    assert reader.poll() == []  # still waiting
    time.sleep(1.2)
    assert [(s, g.group_id) for _, s, g in reader.poll()] == [(5, "g5")]
    assert len(reader.gaps_skipped) == 1
    rec = reader.gaps_skipped[0]
    assert (rec.writer, rec.first_missing, rec.resumed_at) == ("env0", 3, 5)
    assert isinstance(rec, GapRecord) and rec.waited_s >= 1.5
    assert reader.cursors == {"env0": 6}


def test_end_of_stream_is_not_a_gap(s3_store: S3Store) -> None:
    paths = RunPaths("runs", "eos")
    s3_store.put_bytes(paths.group("env0", 0), encode_group(group("g0")))
    s3_store.put_bytes(paths.quarantine_group("env0", 7), b"x")  # outside the writer's folder
    reader = GroupReader(s3_store, paths, gap_wait_s=0.0, gap_check_interval_s=0.0)
    assert len(reader.poll()) == 1
    assert reader.poll() == [] and reader.poll() == []
    assert reader.gaps_skipped == [] and reader.cursors == {"env0": 1}
