"""Objects of several groups on the real S3 server (SeaweedFS): stream indexes, partial takes and resume inside an
object, a quarantined object of several groups, a restarted writer and a lost race, and the α accounting (a cursor
is the number of groups consumed)."""

from __future__ import annotations

import uuid

from asyncrl.storage.group_prefetch import GroupPrefetcher
from asyncrl.storage.groups import GroupReader, GroupWriter, encode_groups
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.types import Group, Sample


def group(gid: str) -> Group:
    s = Sample(group_id=gid, sample_index=0, prompt_token_ids=[1, 2], token_ids=[3, 4], logprobs=[-0.1, -0.2],
               token_versions=[0, 0], start_version=0, reward=1.0, finish_reason="stop")
    return Group(group_id=gid, prompt_index=0, task="arithmetic", samples=[s])


def names(got: list[tuple[str, int, Group]]) -> list[tuple[int, str]]:
    return [(i, g.group_id) for _, i, g in got]


def fresh_paths() -> RunPaths:
    return RunPaths("runs", f"multi-{uuid.uuid4().hex[:6]}")


def test_objects_are_named_by_their_first_group_and_read_with_stream_indexes(s3_store: S3Store) -> None:
    paths = fresh_paths()
    w = GroupWriter(s3_store, paths, "env0")
    assert w.write_many([group("a"), group("b"), group("c")]) == paths.group("env0", 0)
    assert w.write(group("d")) == paths.group("env0", 3)
    assert w.write_many([group("e"), group("f")]) == paths.group("env0", 4)
    assert w.next_seq == 6
    reader = GroupReader(s3_store, paths, writers=["env0"])
    assert names(reader.poll()) == [(0, "a"), (1, "b"), (2, "c"), (3, "d"), (4, "e"), (5, "f")]
    assert reader.cursors == {"env0": 6}  # = groups consumed: what the writers' admission counts
    # a restarted writer continues after the last object's groups
    assert GroupWriter(s3_store, paths, "env0").next_seq == 6


def test_partial_take_then_resume_inside_an_object(s3_store: S3Store) -> None:
    paths = fresh_paths()
    w = GroupWriter(s3_store, paths, "env0")
    w.write_many([group("a"), group("b"), group("c")])
    w.write_many([group("d"), group("e")])
    p = GroupPrefetcher(GroupReader(s3_store, paths, writers=["env0"]), capacity=16)
    assert p.fetch_once(16) == 5
    assert names(p.take(4)) == [(0, "a"), (1, "b"), (2, "c"), (3, "d")]
    saved = p.cursors
    assert saved == {"env0": 4}  # inside the second object (it starts at 3)
    p.close()

    resumed = GroupReader(s3_store, paths, writers=["env0"])
    resumed.restore(saved)
    assert names(resumed.poll()) == [(4, "e")]  # "d" was taken: never read twice
    assert resumed.cursors == {"env0": 5}
    w.write(group("f"))
    assert names(resumed.poll()) == [(5, "f")]

    at_end = GroupReader(s3_store, paths, writers=["env0"])
    at_end.restore({"env0": 6})  # the stream's end: nothing new, no error
    assert at_end.poll() == []
    w.write(group("g"))
    assert names(at_end.poll()) == [(6, "g")]


def test_a_quarantined_object_of_several_groups_is_skipped_to_the_next_object(s3_store: S3Store) -> None:
    paths = fresh_paths()
    w = GroupWriter(s3_store, paths, "env0")
    w.write(group("a"))
    bad_key = w.write_many([group("b"), group("c"), group("d")])
    data = s3_store.get_bytes(bad_key)
    assert data is not None
    s3_store.put_bytes(bad_key, data[: len(data) // 2])  # truncated: its groups are unknown to a reader
    reader = GroupReader(s3_store, paths, writers=["env0"])
    assert names(reader.poll()) == [(0, "a")]
    assert [r.seq for r in reader.quarantined] == [1]
    assert reader.cursors == {"env0": 1}  # waits at the bad object until the writer's next object says how long
    assert reader.poll() == [] and len(reader.quarantined) == 1  # quarantined once
    w.write(group("e"))  # the writer knew its own count: the next object starts at 4
    assert names(reader.poll()) == [(4, "e")]
    assert reader.cursors == {"env0": 5}  # b, c, d consumed as quarantined: admission slots are freed


def test_a_lost_race_moves_past_the_groups_of_the_object_found(s3_store: S3Store) -> None:
    paths = fresh_paths()
    old = GroupWriter(s3_store, paths, "env0")
    new = GroupWriter(s3_store, paths, "env0")
    assert new.next_seq == 0  # read before the other incarnation wrote
    old.write_many([group("x"), group("y")])
    assert new.write(group("z")) == paths.group("env0", 2)  # seq 0 taken by 2 groups: the next free index is 2
    retried = GroupWriter(s3_store, paths, "env0")
    retried._next_seq = 2
    # a retried PUT of the same bytes (our own earlier write) is recognised, not moved past
    s3_store.put_bytes(paths.group("env0", 3), encode_groups([group("w")]))
    retried._next_seq = 3
    assert retried.write(group("w")) == paths.group("env0", 3)
    reader = GroupReader(s3_store, paths, writers=["env0"])
    assert names(reader.poll()) == [(0, "x"), (1, "y"), (2, "z"), (3, "w")]
