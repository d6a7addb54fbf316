"""Reward calls: a transient failure (no answer, 429, 5xx) is retried with backoff, a refusal (4xx) is not, and when
the attempts run out the error reaches the caller (which drops and counts the sample: never a default reward).
The reward server is a real uvicorn process on loopback speaking `/score_batch`, whose faults are injected on purpose:
it answers 503 to a whole batch call while an item's response text has been seen in at most N calls, a per-item 503
to the first N calls of a text starting with "item-", a per-item 422 to the text "refused", then scores. The client
sends the score calls of one event-loop iteration as one batch call; each caller retries its own item."""

import asyncio
import socket
import subprocess
import sys
import textwrap
import time

import httpx
import pytest

from asyncrl.rewards.client import RewardClient
from asyncrl.rpc.http import RemoteError
from asyncrl.storage.retry import RetryPolicy

pytestmark = pytest.mark.integration

SERVER = textwrap.dedent("""
    import sys
    from collections import Counter
    import uvicorn
    from fastapi import FastAPI, HTTPException
    app, calls, batches = FastAPI(), Counter(), []
    failures = int(sys.argv[2])
    @app.post("/score_batch")
    def score_batch(body: dict):
        texts = [item["response"] for item in body["items"]]
        batches.append(texts)
        calls.update(texts)
        if any(calls[t] <= failures and not t.startswith("item-") and t != "refused" for t in texts):
            raise HTTPException(503, "overloaded")
        results = []
        for t in texts:
            if t == "refused":
                results.append({"error": {"status": 422, "detail": "metadata.answer: expected a string"}})
            elif t.startswith("item-") and calls[t] <= failures:
                results.append({"error": {"status": 503, "detail": "busy"}})
            else:
                results.append({"reward": 1.0, "details": {"calls": calls[t]}})
        return {"results": results}
    @app.get("/batches")
    def get_batches():
        return batches
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


def _score_many(url: str, responses: list[str], attempts: int) -> tuple[list, int, int]:
    async def go():
        async with httpx.AsyncClient() as http:
            client = RewardClient(url, http, timeout_s=5, token="t" * 20, attempts=attempts,
                                  backoff=RetryPolicy(base_s=0.01, cap_s=0.05), rand=lambda: 0.0)
            out = await asyncio.gather(*[client.score("arithmetic", "1+1=", r, {"answer": "2"}) for r in responses],
                                       return_exceptions=True)
            return out, client.retries, client.calls
    return asyncio.run(go())


def _batches_since(url: str, start: int) -> list[list[str]]:
    return httpx.get(f"{url}/batches", timeout=5).json()[start:]


def test_concurrent_calls_share_batches_and_their_retries_coalesce(flaky_server):
    start = len(_batches_since(flaky_server, 0))
    out, retries, calls = _score_many(flaky_server, ["d1", "d2", "d3"], attempts=4)
    assert out == [(1.0, {"calls": 3})] * 3 and retries == 6 and calls == 3
    assert _batches_since(flaky_server, start) == [["d1", "d2", "d3"]] * 3


def test_a_refused_or_failing_item_does_not_fail_the_others(flaky_server):
    start = len(_batches_since(flaky_server, 0))
    out, retries, calls = _score_many(flaky_server, ["item-e", "refused", "item-f"], attempts=3)
    assert out[0] == (1.0, {"calls": 3}) and out[2] == (1.0, {"calls": 3})
    assert isinstance(out[1], RemoteError) and out[1].status == 422 and not out[1].transient
    assert retries == 4 and calls == 3  # the per-item 503s of "item-e" and "item-f", twice each
    assert _batches_since(flaky_server, start) == [["item-e", "refused", "item-f"], ["item-e", "item-f"],
                                                   ["item-e", "item-f"]]
