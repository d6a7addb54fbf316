"""Reward calls: a transient failure (no answer, 429, 5xx) is retried with backoff, a refusal (4xx) is not, and when
the attempts run out the error reaches the caller (which drops and counts the sample: never a default reward).
The reward server is a real uvicorn process on loopback whose faults are injected on purpose: it answers 503 to
the first N calls of each response text, then scores."""

import asyncio
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from asyncrl.rollout.clients import RemoteError, RewardClient
from asyncrl.transport.retry import RetryPolicy

pytestmark = pytest.mark.integration

SERVER = textwrap.dedent("""
    import sys
    from collections import Counter
    import uvicorn
    from fastapi import FastAPI, HTTPException
    app, calls = FastAPI(), Counter()
    failures = int(sys.argv[2])
    @app.post("/score")
    def score(body: dict):
        calls[body["response"]] += 1
        if body["response"] == "refused":
            raise HTTPException(422, "metadata.answer: expected a string")
        if calls[body["response"]] <= failures:
            raise HTTPException(503, "overloaded")
        return {"reward": 1.0, "details": {"calls": calls[body["response"]]}}
    uvicorn.run(app, host="127.0.0.1", port=int(sys.argv[1]), log_level="warning")
""")


@pytest.fixture(scope="module")
def flaky_server():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-c", SERVER, str(port), "2"])
    try:
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                httpx.get(f"http://127.0.0.1:{port}/docs", timeout=1)
                break
            except httpx.HTTPError:
                time.sleep(0.1)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.kill()
        proc.wait(timeout=10)


def _score(url: str, response: str, attempts: int) -> tuple[tuple[float, dict] | RemoteError, int]:
    async def go():
        async with httpx.AsyncClient() as http:
            client = RewardClient(url, http, timeout_s=5, token="t" * 20, attempts=attempts,
                                  backoff=RetryPolicy(base_s=0.01, cap_s=0.05))
            try:
                return await client.score("arithmetic", "1+1=", response, {"answer": "2"}), client.retries
            except RemoteError as err:
                return err, client.retries
    return asyncio.run(go())


def test_transient_failures_are_retried_until_the_reward_comes(flaky_server):
    (reward, details), retries = _score(flaky_server, "a", attempts=4)
    assert reward == 1.0 and details == {"calls": 3} and retries == 2


def test_out_of_attempts_the_error_reaches_the_caller(flaky_server):
    err, retries = _score(flaky_server, "b", attempts=2)
    assert isinstance(err, RemoteError) and err.status == 503 and err.transient and retries == 1


def test_a_refusal_is_not_retried(flaky_server):
    err, retries = _score(flaky_server, "refused", attempts=4)
    assert isinstance(err, RemoteError) and err.status == 422 and not err.transient and retries == 0


def test_no_answer_is_transient():
    with socket.socket() as s:  # nobody listens
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    err, retries = _score(f"http://127.0.0.1:{port}", "c", attempts=3)
    assert isinstance(err, RemoteError) and err.status is None and retries == 2
