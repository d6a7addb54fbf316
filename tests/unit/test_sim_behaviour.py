"""Simulator behaviour: async beats sync on a long tail, invariants, determinism, failures, agentic turns."""

import pytest

from asyncrl.sim import Failure, SimConfig, Slowdown, agentic_workload, preset, rlvr_workload, simulate
from asyncrl.sim.simulator import Simulator

COST, _ = preset("gpu-7b")
TAIL = rlvr_workload(median=2000, sigma=1.2, max_tokens=32768, seed=3)


def _cfg(**kw) -> SimConfig:
    return SimConfig.of(**({"gpus": 8, "prompts_per_step": 8, "group_size": 4, "steps": 6, "warmup_steps": 2} | kw))


def test_async_beats_sync_on_a_long_tail():
    sync = simulate(_cfg(mode="sync"), COST, TAIL)
    fast = simulate(_cfg(mode="async", async_ratio=2, train_share=0.25), COST, TAIL)
    assert fast.samples_per_s > 1.5 * sync.samples_per_s
    assert sync.gen_busy < fast.gen_busy
    assert sync.staleness_max == 0 and 0 < fast.staleness_mean <= fast.staleness_max <= 2


@pytest.mark.parametrize("kw", [
    {"mode": "async", "async_ratio": 1, "extra_groups": 2, "extra_samples": 1},
    {"mode": "async", "async_ratio": 2, "partial_rollout": "resubmit", "routing": "round_robin"},
    {"mode": "async", "async_ratio": 1, "dynamic_filter": True, "replicate": False},
    {"mode": "sync", "extra_groups": 2},
])
def test_invariants_hold_after_every_event(kw):
    sim = Simulator(_cfg(check_every=1, **kw), COST, TAIL)
    r = sim.run()
    sim.sched.check_invariants()
    assert r.steps == 6 and r.staleness_max <= (kw.get("async_ratio", 0) if kw["mode"] == "async" else 0)
    if kw.get("dynamic_filter"):
        assert r.filtered_groups > 0  # reward_p = 0.5, 4 samples: 1 in 8 groups all equal
    if kw.get("partial_rollout") == "resubmit":
        assert r.resubmits > 0


def test_same_seed_same_result_and_seed_matters():
    a = simulate(_cfg(async_ratio=2), COST, TAIL).to_dict()
    assert a == simulate(_cfg(async_ratio=2), COST, TAIL).to_dict()
    other = rlvr_workload(median=2000, sigma=1.2, seed=4)
    assert a != simulate(_cfg(async_ratio=2), COST, other).to_dict()


def test_failure_and_slowdown_are_survived_and_counted():
    """A dead server's requests take the production path (`request_lost`): re-sent to live servers, no sample fails;
    the server is marked down once, and comes back through `server_returned`."""
    base = simulate(_cfg(async_ratio=1), COST, TAIL)
    hurt = simulate(_cfg(async_ratio=1, check_every=1, failures=(Failure(0, 30.0),),
                         slowdowns=(Slowdown(1, 10.0, 4.0),)), COST, TAIL)
    assert hurt.failed_requests > 0 and hurt.servers_lost == 1 and hurt.aborted_failed_groups == 0
    assert hurt.steps == 6 and hurt.samples_per_s < base.samples_per_s
    sim = Simulator(_cfg(async_ratio=1, check_every=1, failures=(Failure(0, 30.0, back_at_s=60.0),)), COST, TAIL)
    back = sim.run()
    assert back.servers_lost == 1 and sim.sched.stats.servers_returned == 1 and sim.sched.servers_down == []
    assert sim.servers[0].busy_s > 0 and back.aborted_failed_groups == 0


def test_agentic_turns_and_environment_latency():
    wl = agentic_workload(turns=3, median=300, env_median_s=1.0, seed=1)
    sync = simulate(_cfg(mode="sync", check_every=1), COST, wl)
    fast = simulate(_cfg(async_ratio=2, check_every=1), COST, wl)
    assert fast.samples_per_s > sync.samples_per_s
    assert sync.l_gen_s > 3 * 0.05  # three environment steps of at least 0.05 s each


def test_bad_config_names_the_field():
    with pytest.raises(ValueError, match="train_share"):
        SimConfig(train_share=1.0)
    with pytest.raises(ValueError, match="no GPU left"):
        simulate(SimConfig(gpus=1, mode="async"), COST, TAIL)
