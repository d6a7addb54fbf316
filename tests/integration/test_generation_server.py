"""The generation server over a real vLLM engine (tiny random Qwen2, CPU): /generate, /abort, /health."""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers.generation_server import ServerProcess, shared_generation_server

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def server() -> ServerProcess:
    srv, _ = shared_generation_server()
    # The first request after start is slow (lazy kernel set-up); keep it out of the timed tests.
    httpx.post(f"{srv.url}/generate", json={"request_id": "warmup", "prompt_token_ids": [1], "max_tokens": 1}, timeout=300)
    return srv


def _generate(url: str, **body: Any) -> dict[str, Any]:
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_generate_shapes_logprobs_versions(server: ServerProcess) -> None:
    version = httpx.get(f"{server.url}/health").json()["version"]
    out = _generate(server.url, request_id="g1", prompt_token_ids=[3, 4, 5], max_tokens=12, temperature=1.0,
                    top_p=1.0, seed=5, stop_token_ids=[])
    assert out["request_id"] == "g1"
    assert out["finish_reason"] == "length"
    assert len(out["token_ids"]) == len(out["logprobs"]) == len(out["token_versions"]) == 12
    assert all(0 <= t < 32 for t in out["token_ids"])
    assert all(math.isfinite(lp) and lp <= 0 for lp in out["logprobs"])
    assert out["token_versions"] == [version] * 12 and out["start_version"] == version
    again = _generate(server.url, request_id="g2", prompt_token_ids=[3, 4, 5], max_tokens=12, seed=5)
    assert again["token_ids"] == out["token_ids"]  # same seed, same sample


def test_stop_token_ids(server: ServerProcess) -> None:
    base = _generate(server.url, request_id="s1", prompt_token_ids=[7, 8], max_tokens=20, seed=11)
    stop = base["token_ids"][4]
    first = base["token_ids"].index(stop)
    out = _generate(server.url, request_id="s2", prompt_token_ids=[7, 8], max_tokens=20, seed=11, stop_token_ids=[stop])
    assert out["finish_reason"] == "stop"
    assert out["token_ids"] == base["token_ids"][: first + 1]
    assert len(out["logprobs"]) == len(out["token_versions"]) == first + 1


def _start_long_request(url: str, request_id: str, max_tokens: int = 2000) -> tuple[threading.Thread, dict[str, Any]]:
    result: dict[str, Any] = {}
    body = {"request_id": request_id, "prompt_token_ids": [2, 3], "max_tokens": max_tokens, "seed": 1}
    t = threading.Thread(target=lambda: result.update(_generate(url, **body)))
    t.start()
    return t, result


def _wait_until_decoding(url: str, t: threading.Thread, max_load: int) -> bool:
    """True once the one request in flight has produced tokens (load <= max_load); False if it ended first."""
    deadline = time.monotonic() + 60
    while t.is_alive():
        health = httpx.get(f"{url}/health").json()
        if health["running"] == 1 and 0 < health["load"] <= max_load:
            return True
        assert time.monotonic() < deadline, f"request never got going: {health}"
    return False


def test_abort_returns_partial_tokens(server: ServerProcess) -> None:
    # Decoding the tiny model is fast (~1-4 ms per token), so the request may finish before the abort
    # lands; retry with a fresh request until an abort catches one mid-way.
    for attempt in range(5):
        rid = f"long-{attempt}"
        t, result = _start_long_request(server.url, rid)
        caught = _wait_until_decoding(server.url, t, max_load=1995)
        if caught:
            r = httpx.post(f"{server.url}/abort", json={"request_id": rid})
            assert r.status_code == 200 and r.json()["request_id"] == rid
        t.join(timeout=60)
        if result["finish_reason"] == "abort":
            break
    else:
        pytest.fail("no abort landed while the request was decoding in 5 attempts")
    n = len(result["token_ids"])
    assert 5 <= n < 2000
    assert len(result["logprobs"]) == len(result["token_versions"]) == n
    assert httpx.post(f"{server.url}/abort", json={"request_id": rid}).json()["aborted"] is False
    assert httpx.get(f"{server.url}/health").json()["running"] == 0


def test_health_fields(server: ServerProcess) -> None:
    h = httpx.get(f"{server.url}/health").json()
    assert set(h) == {"status", "version", "running", "waiting", "load"}
    assert h["status"] == "ok" and isinstance(h["version"], int)


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt_token_ids": [1], "max_tokens": 4}, "request_id"),
        ({"request_id": "x", "prompt_token_ids": [], "max_tokens": 4}, "prompt_token_ids"),
        ({"request_id": "x", "prompt_token_ids": ["a"], "max_tokens": 4}, "prompt_token_ids"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 0}, "max_tokens"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "top_p": 1.5}, "top_p"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "bogus": 1}, "bogus"),
    ],
)
def test_bad_bodies_name_the_field(server: ServerProcess, body: dict[str, Any], field: str) -> None:
    r = httpx.post(f"{server.url}/generate", json=body)
    assert r.status_code == 422
    assert any(field in [str(x) for x in err["loc"]] for err in r.json()["detail"]), r.text


def test_too_long_is_400(server: ServerProcess) -> None:
    r = httpx.post(f"{server.url}/generate", json={"request_id": "x", "prompt_token_ids": [1] * 10, "max_tokens": 2045})
    assert r.status_code == 400 and "max_tokens" in r.json()["detail"]
