"""Liveness: the peer-watch decision on exact observation sequences, and role-named heartbeat metrics."""

from asyncrl.roles.liveness import PeerWatch
from asyncrl.roles.role_metrics import heartbeat_metrics


def test_peer_alive_while_seq_advances_and_gone_after_peer_s_of_no_change() -> None:
    w = PeerWatch(first_s=100.0, peer_s=10.0, now=0.0)
    assert w.observe(1, 1.0) is None
    assert w.observe(2, 5.0) is None
    assert w.observe(2, 15.0) is None  # 10 s since the change at t=5: not more than peer_s
    gone = w.observe(2, 15.5)
    assert gone == "heartbeat stuck at seq 2 for 10s (limit 10s)"
    assert w.observe(3, 16.0) is None  # it came back: alive again, clock restarted
    assert w.observe(3, 26.0) is None


def test_no_first_heartbeat_within_first_s() -> None:
    w = PeerWatch(first_s=30.0, peer_s=10.0, now=100.0)
    assert w.observe(None, 129.0) is None
    assert w.observe(None, 131.0) == "no heartbeat within 30s"


def test_a_heartbeat_that_disappears_counts_from_its_last_change() -> None:
    w = PeerWatch(first_s=30.0, peer_s=10.0, now=0.0)
    assert w.observe(7, 1.0) is None
    assert w.observe(None, 11.0) is None
    assert w.observe(None, 11.5) == "heartbeat gone for 10s (limit 10s)"


def test_seq_going_backwards_is_a_change_a_restarted_peer() -> None:
    w = PeerWatch(first_s=30.0, peer_s=10.0, now=0.0)
    assert w.observe(50, 1.0) is None
    assert w.observe(1, 9.0) is None  # a restarted trainer starts at 1
    assert w.observe(1, 18.0) is None
    assert w.observe(1, 19.5) is not None


def test_heartbeat_metrics_name_role_and_instance_and_skip_the_trainer_and_junk() -> None:
    docs = [
        {"role": "generation", "id": "0", "metrics": {"tokens_generated": 120, "busy_s": 1.5, "ok": True}},
        {"role": "generation", "id": "1", "metrics": {"tokens_generated": 80, "bad": float("nan")}},
        {"role": "reward", "id": "0", "metrics": {"scored": 16}},
        {"role": "training", "id": "0", "metrics": {"step": 3}},
        {"role": "environment", "id": "env0", "metrics": "not a dict"},
        None,
        ["junk"],
    ]
    assert heartbeat_metrics(docs) == {
        "generation/0/tokens_generated": 120.0,
        "generation/0/busy_s": 1.5,
        "generation/1/tokens_generated": 80.0,
        "reward/0/scored": 16.0,
    }
