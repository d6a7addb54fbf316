"""The object-store retry policy: error classification, exact backoff sequence, deadline (fake clock)."""

from __future__ import annotations

import pytest
from botocore.exceptions import (
    ClientError,
    ConnectTimeoutError,
    EndpointConnectionError,
    IncompleteReadError,
    NoCredentialsError,
    ParamValidationError,
    ReadTimeoutError,
    ResponseStreamingError,
)

from asyncrl.storage.retry import RetryPolicy, StorageError, StoreStats, call_with_retry, is_transient


def client_error(code: str, status: int) -> ClientError:
    return ClientError({"Error": {"Code": code, "Message": "m"}, "ResponseMetadata": {"HTTPStatusCode": status}}, "Op")


class FakeTime:
    """A clock that only moves when slept on (plus `cost` per attempt)."""

    def __init__(self) -> None:
        self.now = 1000.0
        self.sleeps: list[float] = []

    def clock(self) -> float:
        return self.now

    def sleep(self, s: float) -> None:
        self.sleeps.append(s)
        self.now += s


def cycle(*values: float):
    vals = list(values)
    i = 0

    def rand() -> float:
        nonlocal i
        v = vals[i % len(vals)]
        i += 1
        return v

    return rand


@pytest.mark.parametrize(
    "err",
    [
        client_error("SlowDown", 503),
        client_error("Throttling", 400),
        client_error("RequestLimitExceeded", 400),
        client_error("InternalError", 500),
        client_error("ServiceUnavailable", 503),
        client_error("", 502),
        client_error("", 504),
        client_error("TooManyRequests", 429),
        client_error("503", 503),
        EndpointConnectionError(endpoint_url="http://x"),
        ConnectTimeoutError(endpoint_url="http://x"),
        ReadTimeoutError(endpoint_url="http://x"),
        ResponseStreamingError(error="reset"),
        IncompleteReadError(actual_bytes=1, expected_bytes=2),
        ConnectionResetError("reset"),
        TimeoutError("t"),
    ],
)
def test_transient_errors(err: BaseException) -> None:
    assert is_transient(err)


@pytest.mark.parametrize(
    "err",
    [
        client_error("AccessDenied", 403),
        client_error("NoSuchKey", 404),
        client_error("NoSuchBucket", 404),
        client_error("PreconditionFailed", 412),
        client_error("InvalidRequest", 400),
        client_error("SignatureDoesNotMatch", 403),
        NoCredentialsError(),
        ParamValidationError(report="bad"),
        ValueError("x"),
        StorageError("x"),
    ],
)
def test_permanent_errors(err: BaseException) -> None:
    assert not is_transient(err)


def test_backoff_bounds_and_full_jitter() -> None:
    p = RetryPolicy(deadline_s=60, base_s=0.5, cap_s=3.0)
    assert [p.backoff_bound(n) for n in range(1, 7)] == [0.5, 1.0, 2.0, 3.0, 3.0, 3.0]
    assert p.backoff(3, lambda: 0.25) == 0.5
    assert p.backoff(1, lambda: 0.0) == 0.0
    assert p.backoff_bound(10_000) == 3.0  # no overflow
    with pytest.raises(ValueError, match="attempt"):
        p.backoff_bound(0)
    with pytest.raises(ValueError, match="base_s <= cap_s"):
        RetryPolicy(base_s=2, cap_s=1)
    with pytest.raises(ValueError, match="deadline_s"):
        RetryPolicy(deadline_s=-1)


def test_exact_sequence_until_success() -> None:
    t = FakeTime()
    stats = StoreStats()
    seen: list[int] = []

    def fn(attempt: int) -> str:
        seen.append(attempt)
        if attempt < 5:
            raise EndpointConnectionError(endpoint_url="http://x")
        return "ok"

    p = RetryPolicy(deadline_s=100, base_s=0.5, cap_s=3.0)
    out = call_with_retry(fn, op="put", where="s3://b/k", policy=p, clock=t.clock, sleep=t.sleep,
                          rand=cycle(0.5, 0.25), stats=stats)
    assert out == "ok"
    assert seen == [1, 2, 3, 4, 5]
    # bounds 0.5, 1, 2, 3 times rand 0.5, 0.25, 0.5, 0.25
    assert t.sleeps == [0.25, 0.25, 1.0, 0.75]
    assert (stats.retries, stats.gave_up) == (4, 0)


def test_deadline_clips_last_sleep_and_names_everything() -> None:
    t = FakeTime()
    stats = StoreStats()
    calls: list[float] = []

    def fn(attempt: int) -> None:
        calls.append(t.now)
        t.now += 1.0  # each attempt costs 1 s (e.g. a connect timeout)
        raise client_error("SlowDown", 503)

    p = RetryPolicy(deadline_s=10, base_s=1.0, cap_s=4.0)
    with pytest.raises(StorageError) as info:
        call_with_retry(fn, op="get", where="s3://b/groups/x", policy=p, clock=t.clock, sleep=t.sleep,
                        rand=lambda: 0.999, stats=stats)
    # attempts start at 1000, 1002 (1+0.999), 1004.997 (+1+1.998), 1009.993 (+1+3.996);
    # the 4th ends at 1010.993: 1 s past the deadline of 1010, so no 5th attempt
    assert [round(c, 3) for c in calls] == [1000.0, 1001.999, 1004.997, 1009.993]
    assert [round(s, 3) for s in t.sleeps] == [0.999, 1.998, 3.996]
    msg = str(info.value)
    assert msg.startswith("get s3://b/groups/x: gave up after 4 attempt(s) in 11.0s (deadline 10s): ClientError")
    assert "SlowDown" in msg
    assert isinstance(info.value.__cause__, ClientError)
    assert (stats.retries, stats.gave_up) == (3, 1)


def test_sleep_is_clipped_to_remaining_time() -> None:
    t = FakeTime()

    def fn(attempt: int) -> None:
        raise ConnectionRefusedError("down")

    p = RetryPolicy(deadline_s=2.5, base_s=2.0, cap_s=2.0)
    with pytest.raises(StorageError, match="gave up after 3 attempt"):
        call_with_retry(fn, op="head", where="s3://b/k", policy=p, clock=t.clock, sleep=t.sleep, rand=lambda: 0.9)
    assert [round(s, 3) for s in t.sleeps] == [1.8, 0.7]  # the second sleep ends exactly at the deadline


def test_permanent_error_is_not_retried_and_passes_unchanged() -> None:
    t = FakeTime()
    err = client_error("AccessDenied", 403)
    stats = StoreStats()

    def fn(attempt: int) -> None:
        raise err

    with pytest.raises(ClientError) as info:
        call_with_retry(fn, op="get", where="k", policy=RetryPolicy(), clock=t.clock, sleep=t.sleep, stats=stats)
    assert info.value is err
    assert t.sleeps == []
    assert (stats.retries, stats.gave_up) == (0, 0)


def test_max_attempts_caps_retries() -> None:
    t = FakeTime()
    n = 0

    def fn(attempt: int) -> None:
        nonlocal n
        n += 1
        raise EndpointConnectionError(endpoint_url="http://x")

    with pytest.raises(StorageError, match="gave up after 1 attempt"):
        call_with_retry(fn, op="get", where="k", policy=RetryPolicy(max_attempts=1), clock=t.clock, sleep=t.sleep)
    assert n == 1 and t.sleeps == []
    with pytest.raises(ValueError, match="max_attempts"):
        RetryPolicy(max_attempts=0)


def test_zero_deadline_means_one_attempt() -> None:
    t = FakeTime()

    def fn(attempt: int) -> None:
        raise TimeoutError("t")

    with pytest.raises(StorageError, match="gave up after 1 attempt"):
        call_with_retry(fn, op="list", where="k", policy=RetryPolicy(deadline_s=0), clock=t.clock, sleep=t.sleep)
