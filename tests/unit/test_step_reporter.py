"""The trainer's step reporter: steps logged in order, several per call, the roles' figures once per read (the job's
with the newest step, each role instance's in its child run at that step); failures counted and never raised; flush
and close bounded."""

from __future__ import annotations

import threading
from collections.abc import Callable

from asyncrl.roles.step_reporter import Figures, RunSteps, StepMetrics, StepReporter


def job(read: Callable[[], dict[str, float]]) -> Callable[[], Figures]:
    """A read of figures for the job's run only."""
    return lambda: Figures(job=read())


def job_steps(log: Callable[[list[StepMetrics]], object]) -> Callable[[list[RunSteps]], None]:
    """A log function given the job's steps (the calls here have no child figures)."""
    def log_fn(batches: list[RunSteps]) -> None:
        assert [run for run, _ in batches] == [""], batches
        log(batches[0][1])
    return log_fn


def test_steps_are_logged_in_order_and_the_figures_once_per_read() -> None:
    reads = iter([{"rollout/a": 1.0}, {"rollout/a": 2.0, "gen/b": 5.0}])
    calls: list[list[StepMetrics]] = []
    r = StepReporter(job(lambda: next(reads)), job_steps(lambda entries: calls.append([(m, s, 0) for m, s, _ in entries])))
    assert r.external() == {}
    r.submit({"loss": 0.5, "rollout/a": 0.0}, 1)
    assert r.flush(10.0)
    r.submit({"loss": 0.25}, 2)
    assert r.flush(10.0)
    assert calls == [[({"loss": 0.5, "rollout/a": 1.0}, 1, 0)], [({"loss": 0.25, "rollout/a": 2.0, "gen/b": 5.0}, 2, 0)]]
    assert r.external() == {"rollout/a": 2.0, "gen/b": 5.0}
    assert (r.logged, r.failures, r.calls) == (2, 0, 2)
    r.close()
    r.close()  # idempotent


def test_steps_queued_within_log_every_s_go_in_one_call_with_the_figures_on_the_newest() -> None:
    now = {"t": 0.0}
    calls: list[list[tuple[dict[str, float], int]]] = []
    r = StepReporter(job(lambda: {"rollout/x": 7.0}), job_steps(lambda entries: calls.append([(m, s) for m, s, _ in entries])),
                     read_every_s=0.0, log_every_s=3600.0, clock=lambda: now["t"])
    r.submit({"loss": 1.0}, 1)
    assert r.flush(10.0)  # the first call goes at once
    for step in (2, 3, 4):
        r.submit({"loss": float(step)}, step)
    assert r.flush(10.0)  # a flush logs what is queued without waiting the hour
    assert calls == [[({"loss": 1.0, "rollout/x": 7.0}, 1)],
                     [({"loss": 2.0}, 2), ({"loss": 3.0}, 3), ({"loss": 4.0, "rollout/x": 7.0}, 4)]]
    assert (r.logged, r.calls) == (4, 2)
    r.close()


def test_a_fresh_step_is_logged_without_waiting() -> None:
    logged = threading.Event()
    r = StepReporter(Figures, lambda batches: logged.set(), log_every_s=3600.0)
    r.submit({}, 1)
    assert r.flush(10.0)
    logged.clear()
    r.submit({}, 2)
    assert not logged.wait(0.2)  # waits for log_every_s
    r.submit({}, 3, fresh=True)
    assert logged.wait(10.0)
    assert r.flush(10.0) and r.logged == 3
    r.close()


def test_failures_are_counted_never_raised_and_the_last_figures_stay() -> None:
    reads = {"n": 0}

    def read() -> dict[str, float]:
        reads["n"] += 1
        if reads["n"] == 2:
            raise ConnectionError("S3 down")
        return {"x": float(reads["n"])}

    def log_fn(entries: list[StepMetrics]) -> None:
        if entries[-1][1] == 3:
            raise RuntimeError("MLflow down")

    r = StepReporter(job(read), job_steps(log_fn))
    for step in (1, 2, 3):
        r.submit({"s": float(step)}, step)
        assert r.flush(10.0)
    assert r.failures == 2 and r.logged == 2
    assert r.external() == {"x": 3.0}
    r.close()


def test_flush_is_bounded_and_the_caller_never_waits_on_a_slow_log() -> None:
    release = threading.Event()
    r = StepReporter(Figures, lambda batches: release.wait(10))
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

    logged: list[tuple[float | None, int]] = []
    r = StepReporter(job(read), job_steps(lambda entries: logged.extend((m.get("rollout/reads"), s)
                                                                  for m, s, _ in entries)),
                     read_every_s=5.0, clock=lambda: now["t"])
    for step, t in ((1, 100.0), (2, 101.0), (3, 104.9), (4, 105.0), (5, 106.0)):
        now["t"] = t
        r.submit({}, step)
        assert r.flush(10.0)
    now["t"] = 107.0
    r.submit({}, 6, fresh=True)
    assert r.flush(10.0)
    assert logged == [(1.0, 1), (None, 2), (None, 3), (2.0, 4), (None, 5), (3.0, 6)]
    assert r.reads == 3
    assert r.external() == {"rollout/reads": 3.0}
    r.close()


def test_no_step_gets_the_figures_twice_nor_an_older_step_after_a_newer_one() -> None:
    reads = {"n": 0}

    def read() -> dict[str, float]:
        reads["n"] += 1
        return {"rollout/reads": float(reads["n"])}

    calls: list[list[tuple[dict[str, float], int]]] = []
    r = StepReporter(job(read), job_steps(lambda entries: calls.append([(m, s) for m, s, _ in entries])))
    r.submit({"loss": 1.0}, 3, fresh=True)  # the last step
    assert r.flush(10.0)
    r.submit({"tracking/spooled_total": 0.0}, 3, fresh=True)  # logged again at the same step: no second read
    assert r.flush(10.0)
    r.submit({"eval/accuracy": 0.5}, 2, fresh=True)  # an evaluation point at an older version: no figures either
    assert r.flush(10.0)
    r.submit({"loss": 0.5}, 4)
    assert r.flush(10.0)
    assert calls == [[({"loss": 1.0, "rollout/reads": 1.0}, 3)], [({"tracking/spooled_total": 0.0}, 3)],
                     [({"eval/accuracy": 0.5}, 2)], [({"loss": 0.5, "rollout/reads": 2.0}, 4)]]
    assert r.reads == 2
    r.close()


def test_each_instance_figures_go_to_its_child_run_at_the_step_the_job_figures_go_with() -> None:
    reads = iter([Figures(), Figures(job={"rollout/a": 1.0}, children={"generation-0": {"generation/busy_s": 1.5},
                                                            "reward-0": {}},
                          published={"rollout/a": 1.0, "generation/0/busy_s": 1.5})])
    calls: list[list[RunSteps]] = []
    r = StepReporter(lambda: next(reads), calls.append, log_every_s=3600.0)
    r.submit({}, 0)
    assert r.flush(10.0)  # the first call goes at once; the next waits for the flush
    r.submit({"loss": 1.0}, 1)
    r.submit({"loss": 0.5}, 2)
    assert r.flush(10.0)
    batches = calls[1]
    job_steps_, [(generation_run, [(figures, step, ts)])] = batches[0], batches[1:]  # reward-0 had none: no batch
    assert job_steps_[0] == "" and [(m, s) for m, s, _ in job_steps_[1]] == [({"loss": 1.0}, 1),
                                                                          ({"loss": 0.5, "rollout/a": 1.0}, 2)]
    assert (generation_run, figures, step, ts) == ("generation-0", {"generation/busy_s": 1.5}, 2, job_steps_[1][1][2])
    assert r.external() == {"rollout/a": 1.0, "generation/0/busy_s": 1.5}
    r.close()
