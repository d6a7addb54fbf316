"""The simulator's control-plane and CPU-sharing terms, by hand: the pure pieces, then two whole runs timed exactly."""

import pytest

from asyncrl.sim import CostModel, Dist, SimConfig, Workload, simulate
from asyncrl.sim.cost_model import CODE_CONSTANTS, CONTROL_PLANE_FIELDS, preset
from asyncrl.sim.overheads import (
    FifoStage,
    PollSchedule,
    notice_time,
    padded_tokens,
    score_latency,
    step_budget,
)
from asyncrl.sim.simulator import Simulator


def _cost(**kw) -> CostModel:
    base = dict(decode_a=0.1, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0, train_per_token=0.01,
                sync_latency=0.2, sync_bandwidth=1e9, model_bytes=0.0, max_seqs=2)
    return CostModel(**(base | kw))


def test_fifo_stage_spreads_a_burst_and_idles_between():
    s = FifoStage()
    assert [s.enter(0.0, 0.01) for _ in range(3)] == pytest.approx([0.01, 0.02, 0.03])
    assert s.enter(1.0, 0.01) == pytest.approx(1.01)  # idle since 0.03: starts on arrival
    assert s.busy_s == pytest.approx(0.04)


def test_poll_schedule_doubles_to_its_cap_and_resets():
    p = PollSchedule(_cost(poll_backoff_s=0.01, poll_backoff_cap_s=0.2, s3_get_s=0.003))
    waits = [p.after_empty(0.0) for _ in range(7)]
    assert waits == pytest.approx([0.013, 0.023, 0.043, 0.083, 0.163, 0.203, 0.203])
    p.reset()
    assert p.after_empty(1.0) == pytest.approx(1.013)


def test_notice_time_is_the_next_poll_tick_plus_a_get():
    assert notice_time(0.23, 0.1, 0.005) == pytest.approx(0.305)
    assert notice_time(0.3, 0.1, 0.0) == pytest.approx(0.4)  # a tick at the very instant read the old version
    assert notice_time(0.23, 0.0, 0.005) == pytest.approx(0.235)  # no polling: at once, plus the GET


def test_padded_tokens_per_micro_batch():
    assert padded_tokens([3, 5, 2, 7], 2) == 2 * 5 + 2 * 7
    assert padded_tokens([3, 5, 2, 7], 4) == 4 * 7
    assert padded_tokens([3, 5, 2, 7], 0) == 17
    assert padded_tokens([3, 5, 2], 2) == 2 * 5 + 1 * 2


def test_score_latency_train_time_and_budget():
    c = _cost(score_call_s=0.05, score_s=0.001, train_fixed_s=0.05, env_s=1e-4, frontend_s=2e-4, request_s=3e-4,
              http_call_s=0.04, group_put_s=0.015, group_put_token_s=1e-6, group_get_s=0.012, group_get_token_s=2e-6,
              poll_backoff_s=0.01, poll_backoff_cap_s=0.2, s3_get_s=0.003, version_poll_s=0.1, publish_s=0.08,
              log_s=0.07, checkpoint_s=0.5)
    assert score_latency(c, 10) == pytest.approx(0.06)
    assert c.train_time(1000, 2) == pytest.approx(0.05 + 0.01 * 500)
    b = step_budget(c, requests=8192, servers=256, objects=2.0, tokens=1e5, checkpoint_every=10)
    assert b == pytest.approx({
        "environment_cpu_s": 0.8192, "frontend_cpu_s_per_server": 32 * 2e-4, "engine_request_s_per_server": 32 * 3e-4,
        "sample_latency_s": 0.09, "group_writes_s": 0.03 + 0.1, "group_reads_s": 0.024 + 0.2,
        "poll_wait_s_max": 0.203, "version_notice_s_mean": 0.053, "trainer_step_s": 0.05 + 0.08 + 0.07 + 0.05,
        "sync_s": 0.2})


def test_without_control_plane_keeps_the_compute():
    c, _ = preset("gpu-7b")
    bare = c.without_control_plane()
    assert all(getattr(bare, k) == 0 for k in CONTROL_PLANE_FIELDS)
    assert (bare.decode_a, bare.request_s, bare.train_fixed_s, bare.sync_time) == (c.decode_a, c.request_s,
                                                                                    c.train_fixed_s, c.sync_time)
    assert not bare.has_data_path and c.has_data_path


def _role_constant(name: str) -> float:
    """The environment writer's constant `name`, wherever the role keeps it (its driver module, or the role's)."""
    import importlib

    for module in ("asyncrl.roles.rollout_driver", "asyncrl.roles.environment"):
        try:
            found = getattr(importlib.import_module(module), name, None)
        except ImportError:
            continue
        if found is not None:
            return found
    raise AssertionError(f"{name}: not found in the environment role's modules")


def test_code_constants_are_the_codes():
    from asyncrl.sim import trainer
    from asyncrl.storage import group_prefetch

    assert {"version_poll_s": _role_constant("POLL_S"),
                              "poll_backoff_s": group_prefetch.IDLE_BACKOFF_INITIAL_S,
                              "poll_backoff_cap_s": group_prefetch.idle_backoff_cap_s(1)} == CODE_CONSTANTS
    assert _role_constant("MAX_GROUPS_PER_OBJECT") == trainer.MAX_GROUPS_PER_OBJECT


WL = Workload(response_tokens=Dist("fixed", 10, lo=1, hi=10), prompt_tokens=Dist("fixed", 4))


def test_one_sample_path_through_the_control_plane_by_hand():
    """Sync (α = 0), 1 server, W = 1 prompt of n = 2 samples (4-token prompt + 10 tokens), step a = 0.1 s.
    Step 1: the two requests leave the environment at 0.01, 0.02 and the front end at 0.03, 0.05; the engine's
    request_s (0.03 each) stalls it until 0.09; 10 steps: both finish at 1.09; answer +0.04 = 1.13; reward +0.05 =
    1.18; the object is written at 1.18 + 0.015 = 1.195. Polls (backoff 0.1 doubling to 0.2, GETs free) at 0, 0.1,
    0.3, ..., 1.1, 1.3: read at 1.3 + 0.012 = 1.312; training 0.05 + 0.01 × 28 = 0.33 → 1.642; sync 0.2 → 1.842.
    Published at 1.922 (publish 0.08), seen at the 2.0 tick; the trainer is ready at 1.992 (log 0.07).
    Step 2: admitted at 2.0, finishes at 3.09, written at 3.195; polls after the read at 1.312: 1.412, then every
    0.2 s: 3.212 reads it (3.224); train → 3.554; sync → 3.754. The trainer measures step 2 as wait 3.224 − 1.992,
    train 0.33, sync 0.2."""
    cost = _cost(request_s=0.03, train_fixed_s=0.05, env_s=0.01, frontend_s=0.02, http_call_s=0.04, score_call_s=0.05,
                 group_put_s=0.015, group_get_s=0.012, poll_backoff_s=0.1, poll_backoff_cap_s=0.2, version_poll_s=0.1,
                 publish_s=0.08, log_s=0.07)
    cfg = SimConfig.of(gpus=1, mode="sync", prompts_per_step=1, group_size=2, steps=2, warmup_steps=1, check_every=1)
    sim = Simulator(cfg, cost, WL)
    r = sim.run()
    assert sim.trainer.step_ends == pytest.approx([1.842, 3.754], abs=1e-9)
    assert sim.trainer.steps[0] == pytest.approx((1.312, 0.33, 0.2), abs=1e-9)
    assert sim.trainer.steps[1] == pytest.approx((3.224 - 1.992, 0.33, 0.2), abs=1e-9)
    assert r.mean_step_s == pytest.approx(3.754 - 1.842, abs=1e-9)
    assert r.trainer_samples_per_s == pytest.approx(2 / (3.224 - 1.992 + 0.53), abs=1e-9)
    assert r.extra["objects_per_step"] == 1.0 and r.extra["tokens_per_step"] == 28.0


def test_cpu_sharing_by_hand():
    """Async α = 1, 1 server (max_seqs 1) + 1 trainer, W = 1 prompt of 1 sample (4 + 10 tokens), step a = 0.1 s;
    training 0.01 × 14 = 0.14 s alone, ×2 while the server decodes; decoding ×1.5 while the trainer trains.
    A decodes 0-1.0; B then decodes while A trains 1.0-1.28 (0.28/0.15 = 1.8667 steps), the sync pauses it until
    1.48 (step 1 ends), it finishes the other 8.1333 steps at 2.29333; B trains 2.29333-2.57333 (C decoding),
    the sync ends step 2 at 2.77333."""
    cost = _cost(max_seqs=1, corun_train_factor=2.0, corun_decode_factor=1.5)
    cfg = SimConfig.of(gpus=2, train_share=0.5, mode="async", async_ratio=1, prompts_per_step=1, group_size=1, steps=2,
                       warmup_steps=0, check_every=1)
    sim = Simulator(cfg, cost, WL)
    r = sim.run()
    end_b = 1.48 + (10 - 0.28 / 0.15) * 0.1
    assert sim.trainer.step_ends == pytest.approx([1.48, end_b + 0.28 + 0.2], abs=1e-9)
    assert sim.trainer.steps[1] == pytest.approx((end_b - 1.48, 0.28, 0.2), abs=1e-9)
    assert r.staleness_hist == {0: 1, 1: 1}
    bare = simulate(cfg, _cost(max_seqs=1), WL)  # no sharing: B decodes 1.4 steps while A trains 1.0-1.14, the
    assert bare.sim_time_s == pytest.approx(1.34 + 0.86 + 0.14 + 0.2, abs=1e-9)  # rest after the sync


def test_per_token_and_reward_call_cpu_on_shared_cores_by_hand():
    """Sync, 1 server (max_seqs 1), W = 1 prompt of 2 samples (4 + 10 tokens), step a = 0.1 s, shared cores:
    each request costs (0.001 + 0.0005)·10 = 0.015 s of the engine's time when it joins. A joins at 0, finishes at
    1.015; B joins then (0.015) and A's reward call (0.05) stalls B too: B finishes at 1.015 + 0.065 + 1.0 = 2.08;
    B's reward call finds the server idle and costs it nothing. Training 0.01 × 28 = 0.28, sync 0.2 → 2.56."""
    wl = Workload(response_tokens=Dist("fixed", 10, lo=1, hi=10), prompt_tokens=Dist("fixed", 4))
    cfg = SimConfig.of(gpus=1, mode="sync", prompts_per_step=1, group_size=2, steps=1, warmup_steps=0, check_every=1)
    cost = _cost(max_seqs=1, shared_cpu=1.0, frontend_token_s=0.001, env_token_s=0.0005, score_call_cpu_s=0.05)
    sim = Simulator(cfg, cost, wl)
    sim.run()
    assert sim.trainer.step_ends == pytest.approx([2.56], abs=1e-9)
    assert cost.request_cpu(10) == pytest.approx((0.005, 0.01))
    queued = Simulator(cfg, cost.with_overrides(shared_cpu=0.0), wl)  # own cores: the decode is not slowed
    queued.run()
    assert queued.trainer.step_ends == pytest.approx([2.48], abs=1e-9)
    b = step_budget(cost, requests=2, servers=1, objects=1.0, tokens=28, checkpoint_every=0, decoded=20)
    assert (b["environment_cpu_s"], b["frontend_cpu_s_per_server"]) == pytest.approx((0.01, 0.02))


def test_an_async_step_without_a_checkpoint_publishes_its_version_as_the_sync_begins():
    """Async α = 0, 1 server, W = 1 prompt of 2 samples (4 + 10 tokens), step a = 0.1 s, writers polling every 0.5 s.
    Published as the sync begins (no checkpoint): the writer sees version k at train end + publish 0.08 + GET 0.01,
    and its requests wait at the paused server until the sync ends, so each step is decode 1.0 + train 0.28 + sync
    0.2 = 1.48 s. With a checkpoint every step the version is published after the sync (1.48 + 0.08) and seen at the
    next 0.5 s tick plus the GET (2.01), so step 2 ends at 2.01 + 1.48 = 3.49, and every later step 2.0 s after."""
    def step_ends(checkpoint_every: int) -> list[float]:
        cost = _cost(version_poll_s=0.5, publish_s=0.08, s3_get_s=0.01, log_s=0.07)
        cfg = SimConfig.of(gpus=2, mode="async", async_ratio=0, prompts_per_step=1, group_size=2, steps=4,
                           warmup_steps=1, checkpoint_every=checkpoint_every)
        sim = Simulator(cfg, cost, WL)
        sim.run()
        return sim.trainer.step_ends

    assert step_ends(0) == pytest.approx([1.48, 2.96, 4.44, 5.92], abs=1e-9)
    assert step_ends(1) == pytest.approx([1.48, 3.49, 5.49, 7.49], abs=1e-9)
