"""Simulator timing against hand-computed figures: the analytic server and a two-step synchronous makespan."""

import pytest

from asyncrl.sim import CostModel, Dist, SimConfig, Workload, simulate
from asyncrl.sim.server import SimServer


def _cost(**kw) -> CostModel:
    base = dict(decode_a=0.1, decode_b=0.0, decode_c=0.0, prefill_per_token=0.0, train_per_token=0.01,
                sync_latency=0.2, sync_bandwidth=1e9, model_bytes=0.0, max_seqs=2)
    return CostModel(**(base | kw))


def test_server_step_time_grows_with_context():
    """One request, context 100, 10 new tokens, step = a + b·B + c·C with a=0.01, b=0.001, c=1e-4, B=1:
    t = 10·(0.01 + 0.001 + 1e-4·100) + 1e-4·1·10²/2 = 0.21 + 0.005 = 0.215 s (fluid steps)."""
    s = SimServer(0, _cost(decode_a=0.01, decode_b=0.001, decode_c=1e-4))
    s.submit(0.0, "r", 100, 10)
    assert s.next_completion() == pytest.approx(0.215, abs=1e-12)
    s.advance(0.1)
    assert s.next_completion() == pytest.approx(0.215, abs=1e-12)
    assert s.complete(0.215) == [("r", 10)] and s.load == 0


def test_server_pause_and_abort_count_whole_tokens():
    """a = 0.1 s/step: paused 0..0.5, then 3.5 steps by t = 0.85: an abort returns 3 whole tokens."""
    s = SimServer(0, _cost())
    s.pause(0.0, 0.5)
    s.submit(0.0, "r", 4, 10)
    assert s.next_completion() == pytest.approx(1.5)
    assert s.remove(0.85, "r") == 3
    assert s.busy_s == pytest.approx(0.35)


@pytest.mark.parametrize(("max_seqs", "end"), [(2, 2.96), (1, 4.96)])
def test_two_synchronous_steps_by_hand(max_seqs, end):
    """1 server, sync (α = 0, colocated, 1 GPU), W = 1 prompt, n = 2 samples of a 4-token prompt + 10 tokens,
    step a = 0.1 s (b = c = prefill = 0), training 0.01 s/token, sync 0.2 s.
    One step: generation 10 × 0.1 = 1.0 s when both run together (max_seqs 2), 2 × 1.0 = 2.0 s one after the
    other (max_seqs 1); training 2 × (4 + 10) × 0.01 = 0.28 s; weight sync 0.2 s; servers paused meanwhile.
    Two steps: 2 × (1.0 + 0.28 + 0.2) = 2.96 s, or 2 × (2.0 + 0.48) = 4.96 s."""
    wl = Workload(response_tokens=Dist("fixed", 10, lo=1, hi=10), prompt_tokens=Dist("fixed", 4))
    cfg = SimConfig.of(gpus=1, mode="sync", prompts_per_step=1, group_size=2, steps=2, warmup_steps=0, check_every=1)
    r = simulate(cfg, _cost(max_seqs=max_seqs), wl)
    assert r.sim_time_s == pytest.approx(end, abs=1e-9)
    assert r.mean_step_s == pytest.approx(end / 2, abs=1e-9)
    assert r.samples_per_s == pytest.approx(4 / end, abs=1e-9)
    assert r.tokens_per_s == pytest.approx(40 / end, abs=1e-9)
    assert r.train_busy == pytest.approx(0.56 / end, abs=1e-9)
    assert r.staleness_hist == {0: 4} and r.dropped_stale == 0 and r.aborted_groups == 0
