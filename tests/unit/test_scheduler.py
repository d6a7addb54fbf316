"""The sans-IO rollout scheduler: admission window, replication, routing, staleness aborts, emission."""

import pytest

from asyncrl.rollout.scheduler import Abort, EmitGroup, RolloutScheduler, Start


def make(alpha=1, b=2, n=3, servers=2):
    return RolloutScheduler(async_ratio=alpha, prompts_per_step=b, samples_per_prompt=n, num_servers=servers)


def test_window_is_alpha_plus_one_times_b():
    s = make(alpha=1, b=2)
    admitted = 0
    while s.can_admit():
        s.admit(admitted)
        admitted += 1
    assert admitted == 4  # (1 + 1) * 2
    with pytest.raises(RuntimeError, match="window full"):
        s.admit(99)


def test_alpha_zero_is_synchronous():
    s = make(alpha=0, b=2, n=2)
    starts = s.admit(0) + s.admit(1)
    assert not s.can_admit()
    for d in starts:
        s.sample_finished(d.group_id, d.sample_index)
    assert not s.can_admit()  # finished but not consumed: still outstanding
    s.version_advanced(1, consumed=2)
    assert s.can_admit() and s.outstanding == 0


def test_replication_and_least_loaded_routing():
    s = make(alpha=0, b=2, n=3, servers=2)
    d0 = s.admit(7)
    assert [d.sample_index for d in d0] == [0, 1, 2]
    assert all(isinstance(d, Start) and d.prompt_index == 7 and d.start_version == 0 for d in d0)
    assert [d.server for d in d0] == [0, 1, 0]
    assert s.server_load == [2, 1]
    d1 = s.admit(8)
    assert [d.server for d in d1] == [1, 0, 1]
    assert s.server_load == [3, 3]


def test_group_emitted_once_when_all_samples_finish():
    s = make(alpha=0, b=1, n=2, servers=1)
    a, b = s.admit(5)
    assert s.sample_finished(a.group_id, 0) == []
    assert s.sample_finished(a.group_id, 0) == []  # duplicate completion ignored
    out = s.sample_finished(b.group_id, 1)
    assert out == [EmitGroup(a.group_id, 5, 0)]
    assert s.stats.emitted == 1 and s.server_load == [0]
    assert s.sample_finished(b.group_id, 1) == []


def test_stale_running_groups_are_aborted_and_replaced():
    s = make(alpha=1, b=1, n=2, servers=2)
    g0 = s.admit(0)  # start_version 0
    g1 = s.admit(1)
    assert not s.can_admit()
    # finish group 1 only; trainer consumes it and advances to version 1: floor = 0, nothing stale yet
    for d in g1:
        s.sample_finished(d.group_id, d.sample_index)
    assert s.version_advanced(1, consumed=1) == []
    g2 = s.admit(2)  # start_version 1
    assert g2[0].start_version == 1
    # version 2: floor = 1, group 0 (start 0) can never be trained on -> both samples aborted
    out = s.version_advanced(2, consumed=1)
    assert out == [Abort(g0[0].group_id, 0, g0[0].server, "stale: start_version 0 < 1"),
                   Abort(g0[0].group_id, 1, g0[1].server, "stale: start_version 0 < 1")]
    assert s.stats.aborted_groups == 1 and s.stats.aborted_samples == 2
    assert s.outstanding == 1 and s.can_admit()  # the aborted prompt frees its slot
    # a late completion of an aborted sample is ignored
    assert s.sample_finished(g0[0].group_id, 0) == []


def test_failed_sample_aborts_its_group():
    s = make(alpha=0, b=1, n=3, servers=1)
    ds = s.admit(0)
    s.sample_finished(ds[0].group_id, 0)
    out = s.sample_failed(ds[1].group_id, 1)
    assert out == [Abort(ds[0].group_id, 2, 0, "sample failed")]
    assert s.stats.failed_samples == 1 and s.stats.aborted_groups == 1
    assert s.server_load == [0] and s.can_admit()


def test_version_cannot_go_back():
    s = make()
    s.version_advanced(3, consumed=2)
    with pytest.raises(ValueError, match="must not go back"):
        s.version_advanced(2, consumed=2)


def test_bad_arguments():
    with pytest.raises(ValueError, match="async_ratio"):
        make(alpha=-1)
