"""Deadlines on MLflow calls: no call waits on MLflow longer than asyncrl decides.

By default the MLflow client retries each HTTP request itself, 7 times with exponential backoff, each try waiting up
to 120 s for an answer (`MLFLOW_HTTP_REQUEST_MAX_RETRIES`, `MLFLOW_HTTP_REQUEST_TIMEOUT`): one call to a server that
is down took minutes, and one to a stopped (hung) server up to ~20 minutes. `bound_http_requests` turns the
client's own retries off and caps one request at `REQUEST_TIMEOUT_S` for this process (and the processes it starts);
`retry_until` then retries a call with exponential backoff and full jitter until a deadline asyncrl sets. A call in
flight when the deadline passes ends within one request timeout, so a retried call never takes longer than
`deadline_s + REQUEST_TIMEOUT_S`. A local `sqlite:///` store makes no HTTP request and is not affected.

`transient` says which failures are worth retrying: the server could not be reached or answered 5xx, 408, 429, 401
or 403 (a login that may be fixed). A refusal of the request itself (400, 404: a bad value, a deleted run) is not.
"""

from __future__ import annotations

import logging
import os
import random
import time
from collections.abc import Callable
from typing import TypeVar

from mlflow.exceptions import MlflowException

log = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 10  # one HTTP request to MLflow (connect, and then each read); MLflow takes whole seconds
RETRIES_ENV = "MLFLOW_HTTP_REQUEST_MAX_RETRIES"
TIMEOUT_ENV = "MLFLOW_HTTP_REQUEST_TIMEOUT"
_RETRIED_HTTP = {401, 403, 408, 429}
T = TypeVar("T")


def bound_http_requests() -> None:
    """No retries inside the MLflow client and at most `REQUEST_TIMEOUT_S` per request, for this process and its
    children (the client reads both variables at every request). Idempotent."""
    for name, value in ((RETRIES_ENV, "0"), (TIMEOUT_ENV, str(REQUEST_TIMEOUT_S))):
        if os.environ.get(name) != value:
            if name in os.environ:
                log.info("%s=%s replaced by %s: asyncrl retries MLflow calls itself, with its own deadline",
                         name, os.environ[name], value)
            os.environ[name] = value


def transient(err: BaseException) -> bool:
    """True when a failed MLflow call may succeed if tried again (see the module docstring)."""
    if isinstance(err, MlflowException):
        status = err.get_http_status_code()
        return status >= 500 or status in _RETRIED_HTTP
    return isinstance(err, OSError | ConnectionError | TimeoutError) or type(err).__module__.startswith(
        ("requests", "urllib3"))


def retry_until(call: Callable[[], T], deadline: float, what: str, *, first_backoff_s: float = 0.5,
                max_backoff_s: float = 8.0, clock: Callable[[], float] = time.monotonic,
                sleep: Callable[[float], None] = time.sleep,
                on_failure: Callable[[BaseException], None] | None = None) -> T:
    """`call()` until it succeeds, retrying transient failures with exponential backoff and full jitter while
    `clock()` is before `deadline`; the last error once it has passed (or at once for a refusal). `on_failure` is
    told of every failed attempt."""
    backoff = first_backoff_s
    attempt = 0
    while True:
        attempt += 1
        try:
            return call()
        except Exception as err:
            if on_failure is not None:
                on_failure(err)
            left = deadline - clock()
            if not transient(err) or left <= 0:
                raise
            pause = min(left, random.uniform(0.0, backoff))
            log.info("%s: attempt %d failed (%s); again in %.1f s (%.0f s left)", what, attempt,
                     str(err).splitlines()[0][:200], pause, left)
            sleep(pause)
            backoff = min(max_backoff_s, backoff * 2)
