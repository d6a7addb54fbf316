"""MLflow logging that an outage cannot stop (asyncrl.tracking.spooling_log): a failing batch is retried until the
deadline, then kept in S3 (a real SeaweedFS server) and replayed, oldest first and once, when MLflow takes calls
again; refusals are not retried; the trainer's reporter thread goes on meanwhile. The failing log function is
injected (a fault on purpose); the S3 spool is real, and so is MLflow's store where its behaviour is relied on."""

from __future__ import annotations

import math
import os
import socket
import threading
import uuid

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException
from mlflow.protos.databricks_pb2 import RESOURCE_DOES_NOT_EXIST, TEMPORARILY_UNAVAILABLE

from asyncrl.roles.step_reporter import Figures, StepReporter
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.mlflow_calls import REQUEST_TIMEOUT_S, retry_until, transient
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.tracking.spool import MetricSpool, StepMetrics
from asyncrl.tracking.spooling_log import SpoolingLog, replay_run_spool


@pytest.fixture(autouse=True)
def _restore_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trackers bound the MLflow client's requests through the environment: restored after each test."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


DOWN = MlflowException("API request to http://mlflow/api/2.0/mlflow/runs/log-batch failed: connection refused")
REFUSED = MlflowException.invalid_parameter_value("Invalid value for metric")


class FakeMlflow:
    """The send function under test's control: up or down; every call costs `call_s` of the fake clock (a request
    that waits for its timeout), so the number of attempts within a deadline is exact."""

    def __init__(self, call_s: float = 0.0) -> None:
        self.now = 0.0
        self.up = True
        self.error: Exception = DOWN
        self.call_s = call_s
        self.attempts = 0
        self.logged: list[int] = []  # the steps MLflow took, in order

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.now += s

    def send(self, run: str, steps) -> None:
        self.attempts += 1
        self.now += self.call_s
        if not self.up:
            raise self.error.with_traceback(None)  # one shared instance: its traceback would grow with every raise
        self.logged.extend(step for _, step, _ in steps)


def _steps(*numbers: int) -> list[StepMetrics]:
    return [({"reward/mean": n / 10, "train/loss": float("nan")}, n, 1_000 + n) for n in numbers]


def _spool(s3_store: S3Store) -> MetricSpool:
    return MetricSpool(s3_store, RunPaths("runs", f"r-{uuid.uuid4().hex[:8]}"))


def test_a_batch_is_retried_until_the_deadline_then_spooled_and_replayed_first_once_mlflow_is_back(
        s3_store: S3Store) -> None:
    mlflow, spool = FakeMlflow(call_s=REQUEST_TIMEOUT_S), _spool(s3_store)
    log = SpoolingLog(mlflow.send, spool, deadline_s=15.0, clock=mlflow.clock, sleep=mlflow.sleep)
    log(_steps(1))
    assert mlflow.logged == [1] and spool.keys() == []
    mlflow.up = False
    mlflow.attempts = 0
    log(_steps(2, 3))  # t=10 after the first try, retried once within 15 s; at t≈20 the deadline has passed
    assert mlflow.attempts == 2 and 20.0 <= mlflow.now - 10.0 <= 15.0 + REQUEST_TIMEOUT_S
    assert len(spool.keys()) == 1 and spool.read(spool.keys()[0])[0][1:] == (2, 1_002)
    log(_steps(4))  # the spool's oldest entry fails again: the new steps go behind it, not to MLflow
    assert mlflow.attempts == 4 and len(spool.keys()) == 2
    assert log.counters() == {"tracking/spooled_total": 3.0, "tracking/replayed_total": 0.0,
                              "tracking/failures_total": 4.0}
    mlflow.up = True
    log(_steps(5))
    assert mlflow.logged == [1, 2, 3, 4, 5]  # in order, each once
    assert spool.keys() == []
    assert log.counters() == {"tracking/spooled_total": 3.0, "tracking/replayed_total": 3.0,
                              "tracking/failures_total": 4.0}
    log(_steps(6))  # the spool is known empty now: no listing, straight to MLflow
    assert mlflow.logged[-1] == 6


def test_spooled_values_come_back_exactly_nan_and_timestamps_included(s3_store: S3Store) -> None:
    spool = _spool(s3_store)
    steps = [({"a": 0.1, "b": float("nan"), "c": 3}, 7, 1_764_670_000_123)]
    log = SpoolingLog(lambda r, s: (_ for _ in ()).throw(DOWN.with_traceback(None)), spool, deadline_s=0.01)
    log(steps)
    [(metrics, step, ts)] = spool.read(spool.keys()[0])
    assert (step, ts, metrics["a"], metrics["c"]) == (7, 1_764_670_000_123, 0.1, 3.0) and math.isnan(metrics["b"])


def test_a_refusal_is_neither_retried_nor_spooled(s3_store: S3Store) -> None:
    mlflow, spool = FakeMlflow(), _spool(s3_store)
    mlflow.up, mlflow.error = False, REFUSED
    log = SpoolingLog(mlflow.send, spool, deadline_s=60.0, clock=mlflow.clock, sleep=mlflow.sleep)
    with pytest.raises(MlflowException):
        log(_steps(1))
    assert mlflow.attempts == 1 and spool.keys() == [] and log.counters()["tracking/failures_total"] == 1.0


def test_an_entry_that_does_not_decode_or_that_mlflow_refuses_is_moved_aside_not_lost(s3_store: S3Store) -> None:
    mlflow, spool = FakeMlflow(), _spool(s3_store)
    log = SpoolingLog(mlflow.send, spool, deadline_s=60.0, clock=mlflow.clock, sleep=mlflow.sleep)
    spool.store.put_bytes(spool.prefix + "000000000000.json", b'{"kind": "metrics", "steps": [{"step": "x"}]}')
    mlflow.up = False
    log(_steps(1))  # the bad entry is moved aside; then MLflow is down: step 1 spooled behind nothing
    assert spool.keys() == [spool.prefix + "000000000001.json"]
    rejected = spool.paths.file("tracking/rejected/000000000000.json")
    assert spool.store.get_bytes(rejected) == b'{"kind": "metrics", "steps": [{"step": "x"}]}'
    mlflow.error = REFUSED  # MLflow answers again, but refuses that entry (it goes aside too) and the new steps
    with pytest.raises(MlflowException):
        log(_steps(2))
    assert spool.keys() == [] and spool.store.exists(spool.paths.file("tracking/rejected/000000000001.json"))
    mlflow.up = True
    log(_steps(3))
    assert mlflow.logged == [3]


def test_the_reporter_thread_goes_on_while_mlflow_is_down_and_logs_everything_after(s3_store: S3Store) -> None:
    up = threading.Event()
    logged: list[int] = []

    def send(run: str, steps) -> None:
        if not up.is_set():
            raise ConnectionError("MLflow down")
        logged.extend(s for _, s, _ in steps)

    spool = _spool(s3_store)
    log = SpoolingLog(send, spool, deadline_s=0.2)
    reporter = StepReporter(Figures, log.log_runs)
    for step in range(1, 6):
        reporter.submit({"loss": float(step)}, step)
        assert reporter.flush(30.0)
    assert reporter.failures == 0 and reporter.logged == 5 and logged == []
    assert log.spooled_total == 5 and len(spool.keys()) >= 1
    up.set()
    reporter.submit({"loss": 6.0}, 6, fresh=True)
    assert reporter.flush(30.0)
    reporter.close()
    assert logged == [1, 2, 3, 4, 5, 6] and spool.keys() == [] and log.replayed_total == 5


def test_retry_until_honours_the_deadline_and_retries_only_transient_failures() -> None:
    clock = {"t": 0.0}
    calls: list[float] = []

    def fail() -> None:
        calls.append(clock["t"])
        raise ConnectionError("refused")

    with pytest.raises(ConnectionError):
        retry_until(fail, 30.0, "test", clock=lambda: clock["t"],
                    sleep=lambda s: clock.__setitem__("t", clock["t"] + s))
    assert len(calls) >= 2 and all(t <= 30.0 for t in calls) and clock["t"] <= 30.0
    assert transient(DOWN) and transient(ConnectionError()) and transient(MlflowException("x", TEMPORARILY_UNAVAILABLE))
    assert not transient(REFUSED) and not transient(MlflowException("gone", RESOURCE_DOES_NOT_EXIST))
    assert not transient(ValueError("metric 'x': expected a number"))


def test_mlflow_keeps_one_point_when_a_batch_is_replayed_twice_and_the_run_spool_replays(
        s3_store: S3Store, tmp_path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker.create(uri, "spool-test", "r")
    spool = _spool(s3_store)
    for steps in (_steps(1, 2), _steps(2, 3)):  # step 2 twice, as a replay of a batch MLflow did take would
        SpoolingLog(lambda r, s: (_ for _ in ()).throw(DOWN.with_traceback(None)), spool, deadline_s=0.01)(steps)
    tracking = {"tracking_uri": uri, "mlflow_run_id": tracker.run_id}
    assert replay_run_spool(s3_store, spool.paths, tracking, 30.0) == {"replayed": 4, "left": 0, "failures": 0}
    history = MlflowClient(tracking_uri=uri).get_metric_history(tracker.run_id, "reward/mean")
    assert sorted((m.step, m.timestamp) for m in history) == [(1, 1_001), (2, 1_002), (3, 1_003)]


def test_attach_to_an_unreachable_server_is_a_warning_with_bounded_requests() -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    tracker = Tracker.attach(f"http://127.0.0.1:{port}", "abc")
    assert os.environ["MLFLOW_HTTP_REQUEST_MAX_RETRIES"] == "0"
    assert os.environ["MLFLOW_HTTP_REQUEST_TIMEOUT"] == str(REQUEST_TIMEOUT_S)
    with pytest.raises(MlflowException) as err:
        tracker.log_metrics({"a": 1.0}, step=1)
    assert transient(err.value)
