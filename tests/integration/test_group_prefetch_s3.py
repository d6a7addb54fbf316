"""The trainer's group read-ahead against the real S3 server (SeaweedFS): prefetch, take, resume from the taken
cursors re-reads what was only prefetched; quarantine counted once; a late writer is discovered."""

from __future__ import annotations

import time
import uuid

from asyncrl.storage.group_prefetch import GroupPrefetcher, environment_writer_ids
from asyncrl.storage.groups import GroupReader, GroupWriter, encode_group
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.types import Group, Sample


def group(gid: str) -> Group:
    s = Sample(group_id=gid, sample_index=0, prompt_token_ids=[1, 2], token_ids=[3, 4], logprobs=[-0.1, -0.2],
               token_versions=[0, 0], start_version=0, reward=1.0, finish_reason="stop")
    return Group(group_id=gid, prompt_index=0, task="arithmetic", samples=[s])


def wait_buffered(p: GroupPrefetcher, n: int, timeout_s: float = 60.0) -> int:
    """Wait (bounded) until the thread has read `n` groups ahead; the number buffered."""
    deadline = time.monotonic() + timeout_s
    while p.buffered < n and time.monotonic() < deadline:
        time.sleep(0.02)
    return p.buffered


def test_prefetch_take_and_resume_rereads_only_prefetched(s3_store: S3Store) -> None:
    paths = RunPaths("runs", f"pf-{uuid.uuid4().hex[:6]}")
    wa, wb = GroupWriter(s3_store, paths, "env0"), GroupWriter(s3_store, paths, "env1")
    for i in range(4):
        wa.write(group(f"a{i}"))
    s3_store.put_bytes(paths.group("env0", 4), b"garbage")  # undecodable: quarantined when read
    s3_store.put_bytes(paths.group("env0", 5), encode_group(group("a5")))
    wb.write(group("b0"))
    wb.write(group("b1"))

    p = GroupPrefetcher(GroupReader(s3_store, paths, writers=environment_writer_ids(2)), capacity=16)
    p.start()
    try:
        assert wait_buffered(p, 7) == 7  # a0..a3, a5, b0, b1 read ahead; seq 4 quarantined by the reader
        assert p.reader.cursors == {"env0": 6, "env1": 2}
        assert p.cursors == {"env0": 0, "env1": 0}  # nothing taken yet
        assert [(w, s, g.group_id) for w, s, g in p.take(3)] == [("env0", 0, "a0"), ("env1", 0, "b0"), ("env0", 1, "a1")]
        saved = p.cursors
        assert saved == {"env0": 2, "env1": 1}
        assert p.quarantined == [] and len(p.reader.quarantined) == 1  # seq 4 is ahead of the taken cursor
    finally:
        p.close()
    assert p._thread is not None and not p._thread.is_alive()

    # a resumed trainer (a new reader restored from the checkpointed cursors) reads the prefetched groups again
    p2 = GroupPrefetcher(GroupReader(s3_store, paths, writers=environment_writer_ids(2)), capacity=16)
    p2.restore(saved)
    p2.start()
    try:
        assert wait_buffered(p2, 4) == 4
        got = p2.take(10)
        assert [(w, s, g.group_id) for w, s, g in got] == [
            ("env0", 2, "a2"), ("env1", 1, "b1"), ("env0", 3, "a3"), ("env0", 5, "a5")
        ]
        assert p2.cursors == {"env0": 6, "env1": 2}
        assert [(r.writer, r.seq) for r in p2.quarantined] == [("env0", 4)]  # counted once, by the resumed run
        assert s3_store.get_bytes(paths.quarantine_group("env0", 4)) == b"garbage"
        assert p2.take(1) == []  # nothing is taken twice
    finally:
        p2.close()


def test_a_late_writer_is_discovered_and_new_groups_arrive(s3_store: S3Store) -> None:
    paths = RunPaths("runs", f"late-{uuid.uuid4().hex[:6]}")
    reader = GroupReader(s3_store, paths, writers=environment_writer_ids(1), rediscover_interval_s=0.2)
    p = GroupPrefetcher(reader, capacity=8)
    p.start()
    try:
        assert p.take(1, timeout_s=0.3) == []  # nothing written yet: the thread backs off
        GroupWriter(s3_store, paths, "env0").write(group("a0"))
        GroupWriter(s3_store, paths, "other7").write(group("o0"))  # not an env<i> id: found by rediscovery
        got = p.take(2, timeout_s=60)
        if len(got) < 2:  # the late writer's group may come a poll later
            got += p.take(1, timeout_s=60)
        assert sorted(g.group_id for _, _, g in got) == ["a0", "o0"]
        assert p.cursors == {"env0": 1, "other7": 1}
    finally:
        p.close()
