"""Liveness: the peer-watch decision on exact observation sequences, and role-named heartbeat metrics."""

from asyncrl.roles.liveness import PeerWatch
from asyncrl.roles.role_metrics import heartbeat_metrics, instance_figures


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


def test_system_figures_of_every_role_the_trainer_included() -> None:
    docs = [
        {"role": "generation", "id": "0", "metrics": {"busy_s": 1.5}, "system": {"cpu_cores": 0.75, "threads": 12}},
        {"role": "training", "id": "0", "metrics": {"step": 3}, "system": {"memory_rss_mb": 900.5, "x": "text"}},
        {"role": "reward", "id": "0", "system": "not a dict"},
    ]
    assert heartbeat_metrics(docs) == {
        "generation/0/busy_s": 1.5,
        "system/generation/0/cpu_cores": 0.75,
        "system/generation/0/threads": 12.0,
        "system/training/0/memory_rss_mb": 900.5,
    }


def test_instance_figures_are_keyed_by_child_run_with_the_role_and_mlflow_system_names() -> None:
    docs = [
        {"role": "generation", "id": "0", "metrics": {"busy_s": 1.5, "ok": True},
         "system": {"cpu_utilization_percentage": 40.0, "gpu_0_utilization_percentage": 90, "cpu_cores": 0.5}},
        {"role": "generation", "id": "1", "metrics": {"busy_s": 0.5}},
        {"role": "training", "id": "0", "metrics": {"step": 3}, "system": {"system_memory_usage_percentage": 61.0}},
        {"role": "reward", "id": "0", "metrics": {}, "system": {}},  # nothing to log: no child run
        {"role": "reward", "id": "a'b", "metrics": {"scored": 1}},  # not a valid id: left out
        {"role": "sampler", "id": "0", "metrics": {"x": 1}},  # not a role: left out
        None,
    ]
    assert instance_figures(docs) == {
        "generation-0": {"generation/busy_s": 1.5, "system/cpu_utilization_percentage": 40.0,
                         "system/gpu_0_utilization_percentage": 90.0, "system/cpu_cores": 0.5},
        "generation-1": {"generation/busy_s": 0.5},
        "training-0": {"system/system_memory_usage_percentage": 61.0},  # the trainer's own metrics are the job's
    }


def test_system_sampler_measures_this_process_tree() -> None:
    import subprocess
    import sys
    import time

    from asyncrl.roles.system_metrics import SystemSampler

    child = subprocess.Popen([sys.executable, "-c", "import time\nt=time.time()\nwhile time.time()-t<30: pass"])
    try:
        sampler = SystemSampler()
        time.sleep(1.0)
        busy = sampler.sample()  # the spinning child is part of the tree: its CPU counts
    finally:
        child.kill()
        child.wait()
    assert set(busy) >= {"cpu_cores", "memory_rss_mb", "threads", "cpu_utilization_percentage",
                         "system_memory_usage_megabytes", "system_memory_usage_percentage"}
    assert busy["cpu_cores"] > 0.05 and 0 < busy["cpu_utilization_percentage"] <= 100  # MLflow's names: the machine
    assert busy["memory_rss_mb"] > 10 and busy["threads"] >= 1 and 0 < busy["system_memory_usage_percentage"] <= 100
    # the machine's memory in use, not compared with the tree's RSS (which counts shared and file-backed pages
    # that the machine's figure leaves out: after the whole suite the pytest process's RSS exceeds it)
    import psutil

    assert 0 < busy["system_memory_usage_megabytes"] <= psutil.virtual_memory().total / 1e6
    assert not any(k.startswith("gpu_") for k in busy)  # no NVIDIA library on this machine


def test_system_sampler_lists_the_tree_again_only_after_its_refresh_interval() -> None:
    import subprocess
    import sys

    from asyncrl.roles.system_metrics import SystemSampler

    rarely, always = SystemSampler(tree_refresh_s=3600.0), SystemSampler(tree_refresh_s=0.0)
    child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)"])
    try:
        # listed at construction, before the child: the slow sampler keeps that list, the other lists again
        # (other children of the test process, if any, are in both lists)
        assert child.pid not in [p.pid for p in rarely._tree()]
        assert child.pid in [p.pid for p in always._tree()]
        assert set(rarely.sample()) == set(always.sample())
    finally:
        child.kill()
        child.wait()
    assert "memory_rss_mb" in always.sample()  # a listed process that ended is skipped, never raised
