"""asyncrl's vLLM plugin: the engine's processes sleep between looks at their shared-memory ring instead of spinning,
only when asked, within vLLM's busy window only; the plugin is registered where vLLM looks for it."""

from __future__ import annotations

import time
from importlib.metadata import entry_points

import pytest

from asyncrl.generation import vllm_plugin
from asyncrl.generation.engine import EngineSettings, engine_process_env


@pytest.fixture
def spin_condition():
    """vLLM's real SpinCondition class, restored after the test (register() patches it in place)."""
    from vllm.distributed.device_communicators import shm_broadcast

    cls = shm_broadcast.SpinCondition
    saved = {k: cls.__dict__[k] for k in ("wait", "_asyncrl_original_wait", "_asyncrl_poll_s") if k in cls.__dict__}
    yield cls
    for k in ("_asyncrl_original_wait", "_asyncrl_poll_s"):
        if k in cls.__dict__ and k not in saved:
            delattr(cls, k)
    for k, v in saved.items():
        setattr(cls, k, v)


def reader(cls, busy_loop_s: float, last_read: float):
    r = object.__new__(cls)  # only the two fields wait() reads; no sockets
    r.busy_loop_s, r.last_read = busy_loop_s, last_read
    return r


def test_registered_as_a_vllm_general_plugin():
    found = {ep.name: ep.value for ep in entry_points(group="vllm.general_plugins")}
    assert found.get("asyncrl") == "asyncrl.generation.vllm_plugin:register"


def test_unset_leaves_vllm_alone(monkeypatch, spin_condition):
    monkeypatch.delenv(vllm_plugin.POLL_ENV, raising=False)
    before = spin_condition.wait
    vllm_plugin.register()
    assert spin_condition.wait is before


@pytest.mark.parametrize("raw", ["abc", "-0.001", "0.5", "nan"])
def test_bad_value_names_the_variable(monkeypatch, raw):
    monkeypatch.setenv(vllm_plugin.POLL_ENV, raw)
    with pytest.raises(ValueError, match=vllm_plugin.POLL_ENV):
        vllm_plugin.poll_s_from_env()


def test_sleeps_inside_the_busy_window_and_defers_to_vllm_after_it(monkeypatch, spin_condition):
    calls: list[tuple[str, object]] = []
    spin_condition.wait = lambda self, timeout_ms=None: calls.append(("vllm", timeout_ms))  # stands for vLLM's wait
    monkeypatch.setattr(vllm_plugin.time, "sleep", lambda s: calls.append(("sleep", s)))
    monkeypatch.setenv(vllm_plugin.POLL_ENV, "0.0005")
    vllm_plugin.register()
    vllm_plugin.register()  # vLLM may load plugins more than once in a process: no double wrapping

    now = time.monotonic()
    reader(spin_condition, busy_loop_s=1.0, last_read=now).wait(timeout_ms=7)  # read just now: busy window
    reader(spin_condition, busy_loop_s=1.0, last_read=now - 5).wait(timeout_ms=7)  # idle: vLLM's notification wait
    assert calls == [("sleep", 0.0005), ("vllm", 7)]


def test_engine_process_env():
    env = engine_process_env(EngineSettings(model="m", cpu_threads=2, ring_poll_s=0.001))
    assert env == {"VLLM_CPU_OMP_THREADS_BIND": "nobind", "OMP_NUM_THREADS": "2", vllm_plugin.POLL_ENV: "0.001"}
    assert engine_process_env(EngineSettings(model="m", cpu_threads=0, ring_poll_s=None)) == {}
