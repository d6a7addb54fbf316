"""The trainer's group read-ahead and the reader's rare writer discovery: pure, no server (fake reader / store).

Exact expectations: taken vs prefetched cursors, the `consumed` counts the trainer publishes, resume cursors,
staleness judged when taken, the idle backoff schedule (injected wait), errors surfacing, clean close.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.roles.training import TrainingRunner
from asyncrl.roles.training_report import TrainingReport
from asyncrl.storage.group_prefetch import (
    Backoff,
    GroupPrefetcher,
    environment_writer_ids,
    idle_backoff_cap_s,
)
from asyncrl.storage.groups import GapRecord, GroupReader, QuarantineRecord
from asyncrl.storage.run_layout import RunPaths
from asyncrl.types import Group, Sample

Got = list[tuple[str, int, Group]]


def group(gid: str, start_version: int = 0) -> Group:
    s = Sample(group_id=gid, sample_index=0, prompt_token_ids=[1, 2], token_ids=[3, 4], logprobs=[-0.1, -0.2],
               token_versions=[start_version] * 2, start_version=start_version, reward=1.0, finish_reason="stop")
    return Group(group_id=gid, prompt_index=0, task="arithmetic", samples=[s])


class ScriptedReader:
    """A GroupReader stand-in: each poll plays the next step of a script, moving the cursors like the real one."""

    def __init__(self, script: Iterable[Callable[[ScriptedReader, int | None], Got]] = (),
                 cursors: Mapping[str, int] | None = None) -> None:
        self.script = list(script)
        self._cursors = dict(cursors or {})
        self.quarantined: list[QuarantineRecord] = []
        self.gaps_skipped: list[GapRecord] = []
        self.max_groups_asked: list[int | None] = []

    @property
    def cursors(self) -> dict[str, int]:
        return dict(self._cursors)

    def restore(self, cursors: Mapping[str, int]) -> None:
        self._cursors.update(cursors)

    def poll(self, max_groups: int | None = None, discover: bool = True) -> Got:
        self.max_groups_asked.append(max_groups)
        if not self.script:
            return []
        return self.script.pop(0)(self, max_groups)

    def deliver(self, *items: tuple[str, int, Group]) -> Got:
        for w, seq, _ in items:
            self._cursors[w] = seq + 1
        return list(items)


def returns(*items: tuple[str, int, Group]) -> Callable[[ScriptedReader, int | None], Got]:
    return lambda r, _: r.deliver(*items)


def nothing(r: ScriptedReader, _: int | None) -> Got:
    return []


def ids(got: Got) -> list[tuple[str, int, str]]:
    return [(w, s, g.group_id) for w, s, g in got]


def prefetcher(reader: ScriptedReader, capacity: int = 8, **kw: Any) -> GroupPrefetcher:
    return GroupPrefetcher(reader, capacity=capacity, **kw)  # type: ignore[arg-type]


def test_backoff_doubles_to_the_cap_and_resets() -> None:
    b = Backoff(0.01, 0.2)
    assert [b.next() for _ in range(7)] == [0.01, 0.02, 0.04, 0.08, 0.16, 0.2, 0.2]
    b.reset()
    assert [b.next() for _ in range(2)] == [0.01, 0.02]
    with pytest.raises(ValueError):
        Backoff(0.5, 0.2)
    with pytest.raises(ValueError):
        Backoff(0.0, 0.2)


def test_idle_backoff_cap_grows_with_writers_past_three() -> None:
    assert [idle_backoff_cap_s(n) for n in (1, 3, 4, 8, 64)] == [0.2, 0.2, 0.24, 0.48, 3.84]


def test_writer_ids_follow_the_launcher() -> None:
    assert environment_writer_ids(3) == ["env0", "env1", "env2"]


def test_prefetched_groups_are_not_taken_until_take() -> None:
    reader = ScriptedReader([returns(("env0", 0, group("a0")), ("env1", 0, group("b0")), ("env0", 1, group("a1")),
                                     ("env0", 2, group("a2")))], cursors={"env0": 0, "env1": 0})
    p = prefetcher(reader)
    assert p.fetch_once(8) == 4
    assert reader.cursors == {"env0": 3, "env1": 1}  # the reader read ahead...
    assert p.cursors == {"env0": 0, "env1": 0}  # ...but nothing is taken
    assert p.buffered == 4
    assert ids(p.take(2)) == [("env0", 0, "a0"), ("env1", 0, "b0")]  # round robin
    assert p.cursors == {"env0": 1, "env1": 1}
    assert ids(p.take(5)) == [("env0", 1, "a1"), ("env0", 2, "a2")]
    assert p.cursors == {"env0": 3, "env1": 1} and p.buffered == 0
    assert p.take(1) == []


def test_take_is_round_robin_across_writers_and_calls() -> None:
    items = [("env0", 0, group("a0")), ("env0", 1, group("a1")), ("env0", 2, group("a2")),
             ("env1", 0, group("b0")), ("env2", 0, group("c0")), ("env2", 1, group("c1"))]
    p = prefetcher(ScriptedReader([returns(*items)]))
    p.fetch_once(8)
    assert [w for w, _, _ in p.take(2)] == ["env0", "env1"]
    assert [w for w, _, _ in p.take(4)] == ["env2", "env0", "env2", "env0"]


def test_an_object_of_several_groups_may_be_taken_in_part() -> None:
    # one object at index 0 holding x, y (indexes 0, 1), the next at index 2 holding z
    reader = ScriptedReader([returns(("env0", 0, group("x")), ("env0", 1, group("y")), ("env0", 2, group("z")))])
    p = prefetcher(reader)
    p.fetch_once(8)
    assert ids(p.take(1)) == [("env0", 0, "x")]
    assert p.cursors == {"env0": 1}  # inside the first object: a resume re-reads y
    assert ids(p.take(5)) == [("env0", 1, "y"), ("env0", 2, "z")]
    assert p.cursors == {"env0": 3}


def test_quarantine_and_gap_records_count_once_the_taken_cursor_passes_them() -> None:
    def quarantine_then_read(r: ScriptedReader, _: int | None) -> Got:
        got = r.deliver(("env0", 0, group("a0")))
        r.quarantined.append(QuarantineRecord("env0", 1, "k1", "q1", "not Parquet"))
        r.gaps_skipped.append(GapRecord("env0", 2, 4, 60.0))
        return got + r.deliver(("env0", 4, group("a4")))

    p = prefetcher(ScriptedReader([quarantine_then_read]))
    p.fetch_once(8)
    assert p.cursors == {"env0": 0} and p.quarantined == [] and p.gaps_skipped == []
    p.take(1)  # a0: the taken cursor (the next buffered object, seq 4) is past seq 1 and the gap 2..3
    assert p.cursors == {"env0": 4}
    assert [r.seq for r in p.quarantined] == [1] and [r.first_missing for r in p.gaps_skipped] == [2]


def test_objects_skipped_with_nothing_buffered_move_the_taken_cursor() -> None:
    def only_quarantine(r: ScriptedReader, _: int | None) -> Got:
        r._cursors["env0"] = 1
        r.quarantined.append(QuarantineRecord("env0", 0, "k0", "q0", "bad"))
        return []

    p = prefetcher(ScriptedReader([only_quarantine]))
    assert p.fetch_once(8) == 0
    assert p.cursors == {"env0": 1} and len(p.quarantined) == 1


def test_restore_before_start_only_and_resume_cursors_reread_prefetched() -> None:
    reader = ScriptedReader([returns(("env0", 5, group("a5")), ("env0", 6, group("a6")), ("env1", 2, group("b2")))])
    p = prefetcher(reader)
    p.restore({"env0": 5, "env1": 2})
    p.fetch_once(8)
    p.take(1)
    saved = p.cursors  # what a checkpoint stores
    assert saved == {"env0": 6, "env1": 2}  # a6 and b2 were only prefetched: a resume reads them again
    resumed = ScriptedReader()
    p2 = prefetcher(resumed)
    p2.restore(saved)
    assert resumed.cursors == {"env0": 6, "env1": 2}
    p.start()
    with pytest.raises(RuntimeError, match="started"):
        p.restore({"env0": 0})
    p.close()


def fake_runner(groups: GroupPrefetcher, need: int = 2, alpha: int = 1) -> tuple[TrainingRunner, list[dict]]:
    """A TrainingRunner (rank 0, at version 3) with only what collect/publish/checkpoint cursors use (no model)."""
    published: list[dict] = []
    r = TrainingRunner.__new__(TrainingRunner)
    r.cfg = SimpleNamespace(rollout=SimpleNamespace(prompts_per_step=need, async_ratio=alpha),  # type: ignore[assignment]
                            timeouts=SimpleNamespace(batch_wait_s=0.5))
    ctx = SimpleNamespace(store=SimpleNamespace(put_json=lambda key, doc: published.append(doc)),
                          paths=RunPaths("runs", "r"), cfg=r.cfg)
    r.ctx, r.groups, r.version = ctx, groups, 3  # type: ignore[assignment]
    r.report = TrainingReport(ctx, groups, SimpleNamespace(document=lambda: {}))  # type: ignore[arg-type]
    return r, published


def test_publish_ahead_counts_the_step_being_pushed_and_keeps_the_previous_metrics() -> None:
    """`versions/latest.json` written while a step's weights are pushed: the new version, this step's groups
    trained and consumed (what admission reads), no checksum; the counters and metrics are the previous step's."""
    items = [("env0", 0, group("a", 3)), ("env1", 0, group("b", 3)), ("env0", 1, group("c", 3))]
    p = prefetcher(ScriptedReader([returns(*items)]))
    p.fetch_once(8)
    runner, published = fake_runner(p, need=2)
    runner.report.counters.trained_by_writer = {"env0": 6, "env1": 4}
    runner.report.publish(runner.version, {"reward/mean": 0.25})
    taken = runner.collect(3)
    assert taken.by_writer == {"env0": 1, "env1": 1}
    runner.report.publish_ahead(4, taken).join(30)
    doc = published[-1]
    assert (doc["version"], doc["trained"], doc["consumed"]) == (4, {"env0": 7, "env1": 5}, {"env0": 1, "env1": 1})
    assert doc["checksum"] == {} and doc["metrics"] == {"reward/mean": 0.25}
    assert (published[-2]["metrics_version"], doc["metrics_version"]) == (3, 3)  # version 4's doc: step 3's figures
    assert runner.report.counters.trained_by_writer == {"env0": 6, "env1": 4}  # after_step counts the step in
    runner.report.publish(4, {"reward/mean": 0.5})
    assert (published[-1]["version"], published[-1]["metrics_version"]) == (4, 4)


def test_consumed_counts_only_taken_groups_and_staleness_is_judged_when_taken() -> None:
    # read ahead under version 0; taken for step 3 with alpha 1: start_version 0 < 3 - 1 is stale then
    items = [("env0", 0, group("old", 0)), ("env0", 1, group("f1", 2)), ("env0", 2, group("f2", 3)),
             ("env0", 3, group("f3", 3)), ("env0", 4, group("f4", 3))]
    p = prefetcher(ScriptedReader([returns(*items)]))
    p.fetch_once(8)
    runner, published = fake_runner(p, need=2)
    runner.report.publish(runner.version, {})
    assert published[-1]["consumed"] == {"env0": 0}  # five prefetched, none consumed
    taken = runner.collect(3)
    assert [g.group_id for g in taken.kept] == ["f1", "f2"] and [g.group_id for g in taken.dropped] == ["old"]
    assert taken.by_writer == {"env0": 2}
    runner.report.counters.trained_by_writer = {"env0": 2}
    runner.report.publish(runner.version, {})
    assert published[-1]["consumed"] == {"env0": 3} and published[-1]["trained"] == {"env0": 2}
    assert p.cursors == {"env0": 3} and p.buffered == 2  # f3, f4 wait for the next step


def test_collect_announces_stale_drops_mid_step_and_keeps_its_deadline() -> None:
    p = prefetcher(ScriptedReader([returns(("env0", 0, group("old", 0)))]))
    p.fetch_once(8)
    runner, published = fake_runner(p, need=1)
    with pytest.raises(TimeoutError, match="0 of 1 groups"):
        runner.collect(5)  # nothing fresh arrives (the thread is not started): the deadline ends the wait
    # the dropped group was published as consumed (kept_by_writer empty) so its writer may admit again
    assert published[0]["consumed"] == {"env0": 1}


def test_thread_backs_off_while_idle_resets_on_a_group_and_surfaces_its_error() -> None:
    def boom(r: ScriptedReader, _: int | None) -> Got:
        raise RuntimeError("boom")

    waits: list[float] = []
    reader = ScriptedReader([nothing] * 4 + [returns(("env0", 0, group("a0")))] + [nothing] * 2 + [boom])
    p = prefetcher(reader, backoff=Backoff(0.01, 0.05), idle_wait=waits.append)
    p.start()
    assert ids(p.take(4, timeout_s=30)) == [("env0", 0, "a0")]
    with pytest.raises(RuntimeError, match="boom"):
        p.take(4, timeout_s=30)
    # four empty polls back off to the cap; the poll that found a0 ended on a miss too, so the thread waits the
    # reset backoff before the next poll (it never polls again at once after a poll that found something)
    assert waits == [0.01, 0.02, 0.04, 0.05, 0.01, 0.02, 0.04]
    assert len(reader.max_groups_asked) == 8  # one poll per scripted answer, none repeated at once
    with pytest.raises(RuntimeError, match="boom"):  # and keeps raising it
        p.take(1)
    p.close()


def test_groups_read_before_an_error_are_handed_over_first() -> None:
    def boom(r: ScriptedReader, _: int | None) -> Got:
        raise OSError("store down")

    p = prefetcher(ScriptedReader([returns(("env0", 0, group("a0")), ("env1", 0, group("b0"))), boom]),
                   idle_wait=lambda s: None)
    p.start()
    p._thread.join(30)  # type: ignore[union-attr]
    assert ids(p.take(1)) == [("env0", 0, "a0")]
    assert ids(p.take(1)) == [("env1", 0, "b0")]
    with pytest.raises(OSError, match="store down"):
        p.take(1)


def test_thread_reads_only_while_the_buffer_has_room() -> None:
    counter = iter(range(1000))

    def fill(r: ScriptedReader, max_groups: int | None) -> Got:
        assert max_groups is not None
        return r.deliver(*[("env0", next(counter), group("g")) for _ in range(max_groups)])

    reader = ScriptedReader([fill] * 10)
    p = prefetcher(reader, capacity=4)

    def settle(polls: int) -> None:
        """Wait (bounded) until the thread made `polls` polls and filled the buffer again."""
        deadline = time.monotonic() + 30
        while (len(reader.max_groups_asked) < polls or p.buffered < 4) and time.monotonic() < deadline:
            time.sleep(0.01)

    p.start()
    settle(1)
    assert p.buffered == 4
    assert len(p.take(3)) == 3
    settle(2)
    assert p.buffered == 4
    p.close()
    assert reader.max_groups_asked == [4, 3]  # full buffer: the thread waits, it does not poll
    assert p.cursors == {"env0": 3}


def test_close_stops_an_idle_thread() -> None:
    p = prefetcher(ScriptedReader())  # always empty: real, interruptible backoff waits
    p.start()
    thread = p._thread
    assert thread is not None and thread.is_alive()
    p.close()
    assert not thread.is_alive()


def test_close_is_idempotent_and_take_after_close_raises() -> None:
    p = prefetcher(ScriptedReader())
    p.start()
    p.close()
    p.close()
    with pytest.raises(RuntimeError, match="closed"):
        p.take(1, timeout_s=5)
    with pytest.raises(RuntimeError, match="closed"):
        p.start()


class CountingStore:
    """The S3Store calls a GroupReader makes, counted; every group object missing."""

    def __init__(self, folders: list[str]) -> None:
        self.folders = folders
        self.calls: dict[str, int] = {"list_subprefixes": 0, "get": 0, "first_key_after": 0}
        self.lock = threading.Lock()

    def list_subprefixes(self, prefix: str) -> list[str]:
        self.calls["list_subprefixes"] += 1
        return [f"{prefix}{f}/" for f in self.folders]

    def get_with_metadata(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        self.calls["get"] += 1
        return None

    def first_key_after(self, prefix: str, start_after: str) -> str | None:
        self.calls["first_key_after"] += 1
        return None


def test_reader_lists_writers_at_start_then_at_most_every_interval() -> None:
    now = [100.0]
    store = CountingStore(["env0"])
    reader = GroupReader(store, RunPaths("runs", "r"), writers=["env0"], clock=lambda: now[0],  # type: ignore[arg-type]
                         rediscover_interval_s=5.0, gap_check_interval_s=5.0)
    for t in (100.0, 101.0, 104.9):
        now[0] = t
        assert reader.poll() == []
    assert store.calls == {"list_subprefixes": 1, "get": 3, "first_key_after": 1}
    store.folders.append("env1")  # a late writer
    now[0] = 105.0
    reader.poll()
    assert store.calls["list_subprefixes"] == 2 and reader.cursors == {"env0": 0, "env1": 0}
    reader.poll(discover=False)
    now[0] = 200.0
    reader.poll(discover=False)
    assert store.calls["list_subprefixes"] == 2


def test_the_trainers_prefetcher_knows_the_runs_writers() -> None:
    p = GroupPrefetcher.for_run(CountingStore([]), RunPaths("runs", "r"), num_writers=8, capacity=16,  # type: ignore[arg-type]
                                gap_wait_s=60.0)
    assert p.cursors == {f"env{i}": 0 for i in range(8)} and p.capacity == 16
    assert (p.backoff.initial_s, p.backoff.cap_s) == (0.01, 0.48) and p.reader.gap_wait_s == 60.0
