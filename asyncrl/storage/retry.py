"""The object-store retry policy: which errors are transient, how long to back off, when to give up.

Pure logic: no I/O of its own. The clock, the sleep and the random source are injected, so the exact
backoff sequence and the deadline are testable with fakes (tests/unit/test_s3_retry.py).

Invariants:
- only transient errors are retried: connection failures, timeouts, a response cut short, HTTP
  429/500/502/503/504 and the throttling / internal-error codes in `TRANSIENT_CODES`; everything else
  (403, 404, 412, a malformed request, bad credentials) propagates at once, unchanged;
- backoff is exponential with full jitter: the sleep before attempt n+1 is
  `rand() * min(cap_s, base_s * 2**(n-1))`, clipped to the time left before the deadline;
- a call never starts an attempt after its deadline (`deadline_s` after the first attempt began);
  since one attempt is bounded by the client's own connect/read timeouts, the whole call ends by
  `deadline_s + one attempt's timeout` at the latest;
- when it gives up it raises `StorageError` naming the operation, the key, the attempts made and the
  last error (chained as `__cause__`); `max_attempts` (optional) caps the attempts as well.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TypeVar

from botocore.exceptions import ClientError, HTTPClientError, IncompleteReadError
from botocore.exceptions import ConnectionError as BotoConnectionError

log = logging.getLogger(__name__)

T = TypeVar("T")

TRANSIENT_CODES = frozenset(
    {
        "SlowDown",
        "Throttling",
        "ThrottlingException",
        "ThrottledException",
        "RequestThrottled",
        "RequestThrottledException",
        "RequestLimitExceeded",
        "TooManyRequestsException",
        "ProvisionedThroughputExceededException",
        "BandwidthLimitExceeded",
        "InternalError",
        "ServiceUnavailable",
        "RequestTimeout",
        "RequestTimeoutException",
        "PriorRequestNotComplete",
        "503",
        "500",
    }
)
TRANSIENT_STATUS = frozenset({429, 500, 502, 503, 504})


class StorageError(RuntimeError):
    """An object-store call failed; the message names the bucket and key."""


def error_code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def error_status(err: ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


def is_transient(err: BaseException) -> bool:
    """True for errors worth retrying: the same request may well succeed a moment later."""
    if isinstance(err, ClientError):
        return error_code(err) in TRANSIENT_CODES or error_status(err) in TRANSIENT_STATUS
    # botocore: EndpointConnectionError, ConnectTimeoutError (ConnectionError family), ReadTimeoutError,
    # ConnectionClosedError, ResponseStreamingError (HTTPClientError family), a body cut short.
    if isinstance(err, BotoConnectionError | HTTPClientError | IncompleteReadError):
        return True
    # urllib3/socket errors that escape botocore while a response body is being read
    return isinstance(err, ConnectionError | TimeoutError)


@dataclass(frozen=True)
class RetryPolicy:
    """Exponential backoff with full jitter under a per-call deadline (seconds)."""

    deadline_s: float = 120.0
    base_s: float = 0.2
    cap_s: float = 5.0
    max_attempts: int | None = None

    def __post_init__(self) -> None:
        if not self.deadline_s >= 0:
            raise ValueError(f"retry deadline_s: expected >= 0, got {self.deadline_s}")
        if not (self.base_s > 0 and self.cap_s >= self.base_s):
            raise ValueError(f"retry backoff: expected 0 < base_s <= cap_s, got base_s={self.base_s}, cap_s={self.cap_s}")
        if self.max_attempts is not None and self.max_attempts < 1:
            raise ValueError(f"retry max_attempts: expected >= 1 or None, got {self.max_attempts}")

    def backoff_bound(self, attempt: int) -> float:
        """The upper bound of the sleep after failed attempt `attempt` (1-based): min(cap, base * 2^(n-1))."""
        if attempt < 1:
            raise ValueError(f"attempt: expected >= 1, got {attempt}")
        return min(self.cap_s, self.base_s * 2.0 ** min(attempt - 1, 60))

    def backoff(self, attempt: int, rand: Callable[[], float]) -> float:
        """Full jitter: a uniform draw in [0, backoff_bound(attempt)); `rand()` returns a float in [0, 1)."""
        return rand() * self.backoff_bound(attempt)


GET_MISSING = "get_missing"  # the kind under which StoreStats counts a GET that found no object, besides "get"


@dataclass
class StoreStats:
    """Counters of one store: retried attempts, calls that gave up, and requests sent by kind (`requests`: one per
    attempt, keyed by operation, "get", "put", "list", ...; a GET that found no object is counted under "get" and
    again under "get_missing"). Thread-safe increments."""

    retries: int = 0
    gave_up: int = 0
    requests: dict[str, int] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False, compare=False)

    def add(self, retries: int = 0, gave_up: int = 0) -> None:
        with self._lock:
            self.retries += retries
            self.gave_up += gave_up

    def count(self, kind: str) -> None:
        with self._lock:
            self.requests[kind] = self.requests.get(kind, 0) + 1

    def requests_total(self) -> int:
        """Every request sent (a missing GET once)."""
        with self._lock:
            return sum(n for k, n in self.requests.items() if k != GET_MISSING)

    def missing_gets(self) -> int:
        """The GETs that found no object."""
        with self._lock:
            return self.requests.get(GET_MISSING, 0)


def call_with_retry(
    fn: Callable[[int], T],
    *,
    op: str,
    where: str,
    policy: RetryPolicy,
    transient: Callable[[BaseException], bool] = is_transient,
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    rand: Callable[[], float] = random.random,
    stats: StoreStats | None = None,
) -> T:
    """Run `fn(attempt)` (attempt = 1, 2, ...) until it returns, retrying transient errors.

    A non-transient error propagates unchanged from whichever attempt raised it. When the deadline
    (or `max_attempts`) is reached, raise StorageError("<op> <where>: gave up after N attempts in
    X.Xs (deadline Ys): <last error>").
    """
    start = clock()
    deadline = start + policy.deadline_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return fn(attempt)
        except Exception as e:
            if not transient(e):
                raise
            last = e
        now = clock()
        remaining = deadline - now
        if remaining <= 0 or (policy.max_attempts is not None and attempt >= policy.max_attempts):
            if stats is not None:
                stats.add(gave_up=1)
            raise StorageError(
                f"{op} {where}: gave up after {attempt} attempt(s) in {now - start:.1f}s "
                f"(deadline {policy.deadline_s:g}s): {type(last).__name__}: {last}"
            ) from last
        delay = min(policy.backoff(attempt, rand), remaining)
        if stats is not None:
            stats.add(retries=1)
        log.log(logging.INFO if attempt == 1 else logging.DEBUG,
                "%s %s: attempt %d failed (%s); retrying in %.2fs", op, where, attempt, last, delay)
        sleep(delay)
