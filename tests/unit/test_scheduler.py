"""The sans-IO rollout scheduler: exact event sequences for admission, routing, replication, redundancy,
filtering, staleness, partial-rollout resubmits and multi-turn trajectories; invariants after every event."""

import random

import pytest

from asyncrl.rollout.scheduler import (
    Abort,
    DropGroup,
    DropSample,
    EmitGroup,
    RolloutScheduler,
    SchedulerConfig,
    Start,
)


def make(alpha=1, b=2, n=3, servers=2, **kw) -> RolloutScheduler:
    kw.setdefault("max_new_tokens", 8)
    return RolloutScheduler(SchedulerConfig(async_ratio=alpha, prompts_per_step=b, group_size=n, num_servers=servers,
                                            **kw))


def admit_all(s: RolloutScheduler, prompt_tokens: int = 4) -> list[list[Start]]:
    groups = []
    while s.can_admit():
        groups.append(s.offer_prompt(len(groups), prompt_tokens))
        s.check_invariants()
    return groups


def finish(s: RolloutScheduler, d: Start, reward: float = 1.0, tokens: int = 3) -> list:
    assert s.request_finished(d.group_id, d.sample_index, tokens) == []
    out = s.sample_scored(d.group_id, d.sample_index, reward)
    s.check_invariants()
    return out


def test_window_is_alpha_plus_one_times_b():
    s = make(alpha=1, b=2)
    assert len(admit_all(s)) == 4  # (1 + 1) * 2
    with pytest.raises(RuntimeError, match="admission closed"):
        s.offer_prompt(99, 4)
    s = make(alpha=3, b=2)
    assert len(admit_all(s)) == 8


def test_alpha_zero_is_the_synchronous_barrier():
    """α = 0: B groups start under version v; nothing starts until the trainer has trained them and published v+1
    (not when it merely read them): the servers idle while the trainer trains."""
    s = make(alpha=0, b=2, n=2)
    groups = admit_all(s)
    assert len(groups) == 2 and all(d.start_version == 0 for g in groups for d in g)
    for g in groups:
        for d in g:
            finish(s, d, reward=float(d.sample_index))
    assert s.stats.emitted == 2 and not s.can_admit()
    s.version_advanced(1, trained=2, consumed=2)  # step 0 done, version 1 published
    nxt = admit_all(s)
    assert len(nxt) == 2 and all(d.start_version == 1 for g in nxt for d in g)


def test_no_sample_starts_that_could_not_be_trained():
    """α = 1: after step 0 the slots of step 1 are taken by written groups: only step 2's are open."""
    s = make(alpha=1, b=2, n=2)
    groups = admit_all(s)  # 4 groups, start 0: steps 0 and 1
    for g in groups:
        for d in g:
            finish(s, d, reward=float(d.sample_index))
    assert not s.can_admit()  # the slots of steps 0 and 1 are filled by written groups
    s.version_advanced(1, trained=2, consumed=2)
    assert len(admit_all(s)) == 2  # start 1 → step 2 (1 + α), the only free slots


def test_replication_spreads_a_group_over_servers():
    s = make(alpha=0, b=1, n=4, servers=4)
    (g,) = admit_all(s)
    assert [d.server for d in g] == [0, 1, 2, 3]
    assert [d.request_id for d in g] == [f"env0-000000000-{i}-0" for i in range(4)]
    s = make(alpha=0, b=1, n=4, servers=4, replicate=False)
    (g,) = admit_all(s)
    assert {d.server for d in g} == {0}


def test_least_loaded_routing_counts_tokens_not_requests():
    """Work of a request = context tokens + expected new tokens (max_new_tokens / 2 = 4 before any finishes)."""
    s = make(alpha=0, b=3, n=1, servers=2)
    (a,) = s.offer_prompt(0, 20)  # server 0: 24
    (b,) = s.offer_prompt(1, 4)  # server 1: 8
    (c,) = s.offer_prompt(2, 4)  # least tokens: server 1 (8 < 24), although it has as many requests
    assert (a.server, b.server, c.server) == (0, 1, 1)
    assert s.server_work == [24.0, 16.0] and s.server_requests == [1, 2]
    r = make(alpha=0, b=3, n=1, servers=2, routing="least_requests")
    assert [r.offer_prompt(i, t)[0].server for i, t in enumerate([20, 4, 4])] == [0, 1, 0]
    rr = make(alpha=0, b=3, n=2, servers=2, routing="round_robin")
    assert [d.server for d in rr.offer_prompt(0, 4) + rr.offer_prompt(1, 4)] == [0, 1, 0, 1]


def test_expected_length_follows_finished_requests():
    s = make(alpha=0, b=2, n=1, servers=1)
    (a,) = s.offer_prompt(0, 4)
    assert s.server_work == [8.0]
    s.request_finished(a.group_id, 0, 6)  # mean of new tokens: 4 → 6
    s.offer_prompt(1, 4)
    assert s.server_work == [10.0]


def test_redundant_samples_keep_the_first_finishers_and_abort_the_rest():
    s = make(alpha=0, b=1, n=2, servers=2, extra_samples=2)
    (g,) = admit_all(s)
    assert len(g) == 4
    gid = g[0].group_id
    assert finish(s, g[3], reward=1.0) == []
    assert s.request_finished(gid, 1, 5) == []  # sample 1 finished decoding, its score is pending
    out = finish(s, g[2], reward=0.0)
    assert out == [
        Abort(gid, 0, g[0].server, f"{gid}-0-0", "redundant: group complete"),
        DropSample(gid, 1, "redundant: group complete"),
        EmitGroup(gid, 0, 0, (2, 3)),
    ]
    assert s.stats.samples_aborted == 1 and s.stats.samples_dropped == 1 and s.server_requests == [0, 0]
    assert s.sample_scored(gid, 1, 1.0) == []  # a late score of a dropped sample is ignored


def test_redundant_groups_first_complete_fill_the_batch_the_rest_are_aborted():
    s = make(alpha=0, b=2, n=1, servers=1, extra_groups=1)
    g = admit_all(s)
    assert len(g) == 3
    finish(s, g[2][0])
    out = finish(s, g[0][0])
    assert out[0] == EmitGroup(g[0][0].group_id, 0, 0, (0,))
    assert out[1:] == [Abort(g[1][0].group_id, 0, 0, f"{g[1][0].group_id}-0-0", "redundant: its training steps are full"),
                       DropGroup(g[1][0].group_id, "surpassed")]
    assert s.stats.aborted_surpassed_groups == 1 and not s.can_admit()


def test_dynamic_filter_drops_groups_without_signal_and_admission_replaces_them():
    s = make(alpha=0, b=1, n=2, servers=1, dynamic_filter=True)
    (g,) = admit_all(s)
    finish(s, g[0], reward=1.0)
    out = finish(s, g[1], reward=1.0)
    assert out == [DropGroup(g[0].group_id, "filtered: all 2 rewards are 1.0")]
    assert s.stats.filtered_groups == 1 and s.stats.emitted == 0
    (g2,) = admit_all(s)
    finish(s, g2[0], reward=0.0)
    assert finish(s, g2[1], reward=1.0) == [EmitGroup(g2[0].group_id, 0, 0, (0, 1))]


def test_dynamic_filter_refills_are_bounded_per_step():
    """max_refill 2, W 1: step 0 drops two all-equal groups (each replaced by admission), the third is emitted anyway
    (A = 0 when trained) and counted; step 1 gets its own two refills."""
    s = make(alpha=0, b=1, n=2, servers=1, dynamic_filter=True, max_refill=2)
    outs = []
    for _ in range(3):
        (g,) = admit_all(s)
        finish(s, g[0], reward=0.0)
        outs.append(finish(s, g[1], reward=0.0))
    assert [type(o[-1]) for o in outs] == [DropGroup, DropGroup, EmitGroup]
    assert outs[2] == [EmitGroup("env0-000000002", 0, 0, (0, 1))]
    assert (s.stats.admitted, s.stats.filtered_groups, s.stats.emitted, s.stats.refill_exhausted_groups) == (3, 2, 1, 1)
    assert not s.can_admit()
    s.version_advanced(1, trained=1, consumed=1)
    (g,) = admit_all(s)
    finish(s, g[0], reward=1.0)
    assert finish(s, g[1], reward=1.0) == [DropGroup(g[0].group_id, "filtered: all 2 rewards are 1.0")]
    assert (s.stats.filtered_groups, s.stats.refill_exhausted_groups) == (3, 1)


def test_max_refill_zero_never_drops_a_group():
    s = make(alpha=0, b=2, n=2, servers=1, dynamic_filter=True, max_refill=0)
    g0, g1 = admit_all(s)
    finish(s, g0[0], reward=1.0)
    assert finish(s, g0[1], reward=1.0) == [EmitGroup(g0[0].group_id, 0, 0, (0, 1))]
    finish(s, g1[0], reward=0.0)
    assert finish(s, g1[1], reward=1.0) == [EmitGroup(g1[0].group_id, 1, 0, (0, 1))]
    assert (s.stats.filtered_groups, s.stats.refill_exhausted_groups, s.stats.emitted) == (0, 1, 2)


def test_refills_count_for_the_step_the_next_emitted_group_fills():
    """α 1, W 2, max_refill 1: two filtered groups per step. With n = 1 every group is all-equal. The window holds
    steps 0 and 1; the step a group would fill is (trained + written unconsumed) // W, so step 0's refills are spent
    before its first group is written, and step 1's budget opens once step 0's two groups are written, before any
    version moves."""
    s = make(alpha=1, b=2, n=1, servers=1, dynamic_filter=True, max_refill=1)
    queue: list[Start] = []
    kinds = []
    for _ in range(7):
        queue += [g[0] for g in admit_all(s)]
        kinds.append(type(finish(s, queue.pop(0))[-1]).__name__)
    assert kinds == ["DropGroup", "DropGroup", "EmitGroup", "EmitGroup", "DropGroup", "DropGroup", "EmitGroup"]
    assert (s.stats.filtered_groups, s.stats.refill_exhausted_groups, s.stats.emitted) == (4, 3, 3)
    assert s.emitted_unconsumed == 3 and s.version == 0 and s.stats.admitted == 8


def test_stale_running_groups_are_aborted_and_replaced():
    s = make(alpha=1, b=1, n=2, servers=2)
    g0, g1 = admit_all(s)  # both start_version 0
    for d in g1:
        finish(s, d)
    assert s.version_advanced(1, trained=1, consumed=1) == []  # floor 0: nothing stale
    (g2,) = admit_all(s)
    assert g2[0].start_version == 1
    out = s.version_advanced(2, trained=1, consumed=1)  # floor 1: group 0 can never be trained
    gid = g0[0].group_id
    assert out == [Abort(gid, 0, g0[0].server, f"{gid}-0-0", "stale: start_version 0 < 1"),
                   Abort(gid, 1, g0[1].server, f"{gid}-1-0", "stale: start_version 0 < 1"),
                   DropGroup(gid, "stale")]
    assert s.stats.aborted_stale_groups == 1 and s.stats.samples_aborted == 2
    s.check_invariants()
    assert s.request_finished(gid, 0, 3) == []  # the aborted request's late answer is ignored


def test_failed_sample_with_a_spare_does_not_fail_the_group():
    s = make(alpha=0, b=1, n=2, servers=1, extra_samples=1)
    (g,) = admit_all(s)
    assert s.sample_failed(g[0].group_id, 0) == []
    finish(s, g[1])
    out = s.sample_failed(g[0].group_id, 2)  # now only one sample can finish: the group fails
    assert out == [DropGroup(g[0].group_id, "failed")]
    assert s.stats.aborted_failed_groups == 1 and s.stats.samples_failed == 2 and s.can_admit()
    s.check_invariants()


def test_failed_trajectory_is_replaced_within_its_group_until_the_replacements_run_out():
    s = make(alpha=0, b=1, n=2, servers=2, replace_failed=2)
    (g,) = admit_all(s, prompt_tokens=5)
    gid = g[0].group_id
    assert s.request_finished(gid, 0, 3) == []
    # the environment failed sample 0: a new sample (index 2) of the same group starts from the prompt
    assert s.env_failed(gid, 0) == [Start(gid, 0, 2, 0, 0, turn=0, context_tokens=5)]
    assert s.sample_failed(gid, 2) == [Start(gid, 0, 3, 0, 0, turn=0, context_tokens=5)]
    assert s.stats.samples_replaced == 2 and s.stats.samples_started == 4 and s.stats.samples_failed == 2
    s.check_invariants()
    finish(s, g[1])
    assert finish(s, Start(gid, 0, 3, 0, 0, turn=0, context_tokens=5)) == [EmitGroup(gid, 0, 0, (1, 3))]
    s.check_invariants()
    s.version_advanced(1, trained=1, consumed=1)
    (h,) = admit_all(s)  # replacements are per group: the next group has its own two
    assert s.sample_failed(h[0].group_id, 0)[0].sample_index == 2


def test_unrequested_abort_fails_the_sample():
    s = make(alpha=0, b=1, n=2, servers=1)
    (g,) = admit_all(s)
    out = s.request_finished(g[0].group_id, 0, 2, aborted=True)
    assert out == [Abort(g[0].group_id, 1, 0, f"{g[0].group_id}-1-0", "failed: too few samples left"),
                   DropGroup(g[0].group_id, "failed")]


def test_partial_rollout_resubmit_continues_with_the_partial_tokens():
    s = make(alpha=1, b=1, n=1, servers=2, partial_rollout="resubmit")
    (a,), (b,) = admit_all(s)
    finish(s, b)
    out = s.version_advanced(1, trained=1, consumed=1)
    assert out == [Abort(a.group_id, 0, a.server, a.request_id, "resubmit under version 1", resubmit=True)]
    cont = s.request_finished(a.group_id, 0, 3, aborted=True)
    assert cont == [Start(a.group_id, 0, 0, 0, 0, turn=1, context_tokens=7)]  # both idle: lowest index; 4 + 3 tokens
    assert cont[0].request_id == f"{a.group_id}-0-1"
    assert s.stats.resubmits == 1 and s.stats.samples_started == 2
    assert finish(s, cont[0]) == [EmitGroup(a.group_id, 0, 0, (0,))]  # keeps start_version 0


def test_continue_mode_leaves_running_requests_alone():
    s = make(alpha=1, b=1, n=1, servers=1)
    (a,), (b,) = admit_all(s)
    finish(s, b)
    assert s.version_advanced(1, trained=1, consumed=1) == []


def test_multi_turn_env_steps_start_the_next_turn_on_the_least_loaded_server():
    s = make(alpha=0, b=2, n=1, servers=2)
    (a,), (b,) = admit_all(s)
    assert s.request_finished(a.group_id, 0, 5) == []
    nxt = s.env_stepped(a.group_id, 0, observation_tokens=6, done=False)
    assert nxt == [Start(a.group_id, 0, 0, a.server, 0, turn=1, context_tokens=15)]
    s.check_invariants()
    assert s.request_finished(a.group_id, 0, 2) == []
    assert s.env_stepped(a.group_id, 0, observation_tokens=1, done=True) == []
    assert s.sample_scored(a.group_id, 0, 1.0) == [EmitGroup(a.group_id, 0, 0, (0,))]
    assert s.env_failed(b.group_id, 0) == [DropGroup(b.group_id, "failed")]
    s.check_invariants()


def test_version_and_counts_cannot_go_back():
    s = make()
    s.version_advanced(3, trained=2, consumed=2)
    with pytest.raises(ValueError, match="must not go back"):
        s.version_advanced(2, trained=2, consumed=2)
    with pytest.raises(ValueError, match="cannot exceed"):
        s.version_advanced(3, trained=5, consumed=4)


def test_bad_arguments_name_the_field():
    with pytest.raises(ValueError, match="async_ratio"):
        make(alpha=-1)
    with pytest.raises(ValueError, match="group_size"):
        make(n=0)
    with pytest.raises(ValueError, match="extra_groups"):
        make(extra_groups=-1)
    with pytest.raises(ValueError, match="max_refill: expected >= 0, got -1"):
        make(max_refill=-1)


@pytest.mark.parametrize("seed", range(8))
def test_invariants_hold_under_random_event_sequences(seed):
    """A random driver (finishes, scores, failures, resubmits, env steps, version bumps) never breaks the
    bookkeeping, never emits a group twice, and never emits a group that its step could not train."""
    rng = random.Random(seed)
    s = make(alpha=rng.randint(0, 2), b=rng.randint(1, 3), n=rng.randint(1, 3), servers=rng.randint(1, 3),
             extra_samples=rng.randint(0, 2), extra_groups=rng.randint(0, 2), dynamic_filter=rng.random() < 0.5,
             partial_rollout=rng.choice(["continue", "resubmit"]), replace_failed=rng.randint(0, 2),
             max_refill=rng.randint(0, 2))
    running: dict[str, Start] = {}
    awaiting: list[tuple[str, int]] = []
    emitted: list[EmitGroup] = []
    trained = consumed = 0

    def apply(out):
        for d in out:
            if isinstance(d, Start):
                running[d.request_id] = d
            elif isinstance(d, EmitGroup):
                emitted.append(d)

    for _ in range(400):
        while s.can_admit():
            apply(s.offer_prompt(rng.randint(0, 99), rng.randint(2, 6)))
        roll = rng.random()
        if running and roll < 0.5:
            d = running.pop(rng.choice(sorted(running)))
            aborted = rng.random() < 0.1
            apply(s.request_finished(d.group_id, d.sample_index, rng.randint(0, 8), aborted))
            if not aborted:
                awaiting.append((d.group_id, d.sample_index))
        elif awaiting and roll < 0.8:
            gid, i = awaiting.pop(rng.randrange(len(awaiting)))
            if rng.random() < 0.2:
                apply(s.env_stepped(gid, i, rng.randint(1, 4), done=False))
            elif rng.random() < 0.05:
                apply(s.sample_failed(gid, i))
            else:
                apply(s.sample_scored(gid, i, float(rng.randint(0, 1))))
        elif roll < 0.9:
            # the trainer publishes between steps: it may drop a written group as stale, or train a full step
            w = s.cfg.prompts_per_step
            if s.stats.emitted - consumed >= 1 and rng.random() < 0.2:
                consumed += 1
                apply(s.version_advanced(s.version, trained, consumed))
            elif s.stats.emitted - consumed >= w:
                consumed += w
                trained += w
                apply(s.version_advanced(s.version + 1, trained, consumed))
        s.check_invariants()
    assert len({e.group_id for e in emitted}) == len(emitted)
    assert all(len(e.sample_indices) == s.cfg.group_size for e in emitted)


def test_least_tokens_heap_picks_the_same_server_as_a_full_scan():
    rng = random.Random(5)
    s = make(alpha=8, b=16, n=3, servers=7, extra_samples=1)
    running: list[Start] = []
    for _ in range(300):
        if s.can_admit() and rng.random() < 0.5:
            expected = min(range(7), key=lambda k: (s.server_work[k], s.server_requests[k], k))
            out = s.offer_prompt(0, rng.randint(1, 30))
            assert out[0].server == expected
            running += out
        elif running:
            d = running.pop(rng.randrange(len(running)))
            s.request_finished(d.group_id, d.sample_index, rng.randint(0, 9))
        s.check_invariants()


def test_a_restarted_writer_counts_its_written_groups_and_names_new_groups_apart():
    """After a resume, the 5 groups the writer had written (3 consumed) fill the α window: with α=1, B=2 the window
    is (α+1)·B = 4 groups, 2 of them unconsumed, so exactly 2 more are admitted; new ids carry the restart."""
    s = make(alpha=1, b=2, incarnation=5)
    s.restore_emitted(5)
    s.version_advanced(1, 2, 3)  # version 1; 2 trained, 3 consumed (1 dropped as stale)
    assert s.emitted_unconsumed == 2
    admitted = []
    while s.can_admit():
        admitted.append(s.offer_prompt(len(admitted), 4)[0].group_id)
    assert admitted == ["env0-r5-000000005", "env0-r5-000000006"]
    s.check_invariants()
    with pytest.raises(ValueError, match="restore_emitted"):
        s.restore_emitted(1)


def test_a_lost_request_is_resent_to_a_live_server_and_its_server_avoided_until_it_returns():
    """Server 1 stops answering: its requests are re-sent to server 0 one by one as they fail (same sample, next
    turn, the tokens so far kept), nothing new is routed to server 1, and routing uses it again once it returns."""
    s = make(alpha=0, b=1, n=2, servers=2, routing="round_robin")
    (a, b), = admit_all(s)
    assert (a.server, b.server) == (0, 1)
    out = s.request_lost(b.group_id, b.sample_index)
    s.check_invariants()
    assert out == [Start(b.group_id, b.prompt_index, 1, 0, 0, 1, 4)]
    assert s.servers_down == [1] and s.server_requests == [2, 0]
    assert s.stats.requests_lost == 1 and s.stats.servers_lost == 1
    # the re-sent request is lost too: server 0 is down as well, so the sample is parked (running, no request)
    # and admission pauses
    assert s.request_lost(b.group_id, b.sample_index) == []
    assert s.stats.servers_lost == 2 and s.servers_down == [0, 1]
    assert s.counts()["running_samples"] == 2 and s.server_requests == [1, 0] and not s.can_admit()
    s.check_invariants()
    out = s.server_returned(1)
    s.check_invariants()
    assert out == [Start(b.group_id, b.prompt_index, 1, 1, 0, 2, 4)] and s.servers_down == [0]
    assert s.server_returned(1) == [] and s.stats.servers_returned == 1
    with pytest.raises(ValueError, match="server: expected 0..1, got 2"):
        s.server_returned(2)


def test_a_lost_request_keeps_its_tokens_and_a_late_or_repeated_report_is_ignored():
    s = make(alpha=1, b=1, n=1, servers=2, routing="least_requests")
    (a,), (c,) = admit_all(s)
    assert (a.server, c.server) == (0, 1)
    assert s.request_finished(a.group_id, 0, 5) == []  # first turn done: 4 + 5 tokens of context
    nxt = s.env_stepped(a.group_id, 0, observation_tokens=2, done=False)
    assert nxt == [Start(a.group_id, a.prompt_index, 0, 0, 0, 1, 11)]
    out = s.request_lost(a.group_id, 0)
    assert out == [Start(a.group_id, a.prompt_index, 0, 1, 0, 2, 11)]  # the context so far, on the live server
    s.check_invariants()
    assert s.request_lost(c.group_id + "-gone", 0) == []  # unknown group: ignored
    assert s.sample_scored(a.group_id, 0, 1.0) == []  # still running, not awaiting: ignored
    assert s.request_finished(a.group_id, 0, 3) == []
    assert [type(d) for d in s.sample_scored(a.group_id, 0, 1.0)] == [EmitGroup]
    s.check_invariants()


def test_a_parked_sample_of_a_closed_group_counts_as_aborted():
    s = make(alpha=0, b=1, n=1, servers=1)
    ((a,),) = admit_all(s)
    assert s.request_lost(a.group_id, 0) == [] and s.servers_down == [0]
    out = s.sample_failed(a.group_id, 0)  # e.g. the group was given up: no server holds it
    assert [type(d) for d in out] == [DropGroup]
    s.check_invariants()
    assert s.stats.samples_failed == 1 and s.live_groups == 0
    assert s.server_returned(0) == [] and s.can_admit()


def test_groups_the_trainer_dropped_mid_step_reopen_admission():
    """The trainer publishes, mid-step, the groups it dropped as stale (consumed grows, the version does not): a writer
    whose whole window was emitted and went stale admits again instead of waiting for a step that cannot fill."""
    s = make(alpha=1, b=2, n=1, servers=1)
    for g in admit_all(s):
        finish(s, g[0])
    assert s.stats.emitted == 4 and s.emitted_unconsumed == 4 and not s.can_admit()
    s.version_advanced(0, trained=0, consumed=2)  # two read and dropped as stale during step 0, none trained yet
    assert s.emitted_unconsumed == 2 and len(admit_all(s)) == 2
    with pytest.raises(ValueError, match="must not go back"):
        s.version_advanced(0, trained=0, consumed=1)
