"""The trainer's step reporter: steps logged in order with the roles' latest figures, off the caller's thread;
failures counted and never raised; flush and close bounded."""

from __future__ import annotations

import threading

from asyncrl.roles.step_reporter import StepReporter


def test_steps_are_logged_in_order_with_the_figures_read_for_them() -> None:
    reads = iter([{"rollout/a": 1.0}, {"rollout/a": 2.0, "gen/b": 5.0}])
    logged: list[tuple[dict[str, float], int]] = []
    r = StepReporter(lambda: next(reads), lambda m, step, ts: logged.append((m, step)))
    assert r.external() == {}
    r.submit({"loss": 0.5, "rollout/a": 0.0}, 1)
    r.submit({"loss": 0.25}, 2)
    assert r.flush(10.0)
    assert logged == [({"loss": 0.5, "rollout/a": 1.0}, 1), ({"loss": 0.25, "rollout/a": 2.0, "gen/b": 5.0}, 2)]
    assert r.external() == {"rollout/a": 2.0, "gen/b": 5.0}
    assert (r.logged, r.failures) == (2, 0)
    r.close()
    r.close()  # idempotent


def test_failures_are_counted_never_raised_and_the_last_figures_stay() -> None:
    calls = {"n": 0}

    def read() -> dict[str, float]:
        calls["n"] += 1
        if calls["n"] == 2:
            raise ConnectionError("S3 down")
        return {"x": float(calls["n"])}

    def log_fn(m: dict[str, float], step: int, ts: int) -> None:
        if step == 3:
            raise RuntimeError("MLflow down")

    r = StepReporter(read, log_fn)
    for step in (1, 2, 3):
        r.submit({"s": float(step)}, step)
    assert r.flush(10.0)
    assert r.failures == 2 and r.logged == 2
    assert r.external() == {"x": 3.0}
    r.close()


def test_flush_is_bounded_and_the_caller_never_waits_on_a_slow_log() -> None:
    release = threading.Event()
    r = StepReporter(dict, lambda m, step, ts: release.wait(10))
    r.submit({}, 1)  # returns at once although logging blocks
    assert r.flush(0.05) is False
    release.set()
    assert r.flush(10.0) is True
    r.close()


def test_the_figures_are_read_at_most_every_read_every_s_and_for_a_fresh_step() -> None:
    now = {"t": 100.0}
    reads = {"n": 0}

    def read() -> dict[str, float]:
        reads["n"] += 1
        return {"rollout/reads": float(reads["n"])}

    logged: list[tuple[float, int]] = []
    r = StepReporter(read, lambda m, step, ts: logged.append((m["rollout/reads"], step)), read_every_s=5.0,
                     clock=lambda: now["t"])
    for step, t in ((1, 100.0), (2, 101.0), (3, 104.9), (4, 105.0), (5, 106.0)):
        now["t"] = t
        r.submit({}, step)
        assert r.flush(10.0)
    now["t"] = 107.0
    r.submit({}, 6, fresh=True)
    assert r.flush(10.0)
    assert logged == [(1.0, 1), (1.0, 2), (1.0, 3), (2.0, 4), (2.0, 5), (3.0, 6)]
    assert r.reads == 3
    r.close()
