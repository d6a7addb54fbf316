"""The generation server over a real vLLM engine (tiny random Qwen2, CPU): /generate, /abort, /health.

Most tests use the session server (a model without EOS: requests run to max_tokens unless a stop id ends
them); the `min_tokens`/`ignore_eos` tests also use the session EOS server (same weights, EOS_TOKEN as EOS).
"""

from __future__ import annotations

import math
import threading
import time
from typing import Any

import httpx
import pytest

from tests.helpers.generation_server import (
    EOS_TOKEN,
    MAX_MODEL_LEN,
    ServerProcess,
    shared_eos_server,
    shared_generation_server,
)

pytestmark = pytest.mark.integration


@pytest.fixture(scope="session")
def server() -> ServerProcess:
    srv, _ = shared_generation_server()
    # The first request after start is slow (lazy kernel set-up); keep it out of the timed tests.
    httpx.post(f"{srv.url}/generate", json={"request_id": "warmup", "prompt_token_ids": [1], "max_tokens": 1}, timeout=300)
    return srv


@pytest.fixture(scope="session")
def eos_server() -> ServerProcess:
    srv, _ = shared_eos_server()
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


def _health(url: str) -> dict[str, Any]:
    return dict(httpx.get(f"{url}/health", timeout=30).json())


def _abort_mid_request(url: str, rid: str, n_max: int) -> dict[str, Any] | None:
    """Start a request of `n_max` tokens and abort it once it has begun: `/abort` is sent every 0.25 s from 1 s after
    the request was sent until the server says it aborted it. Returns its answer, or None for a miss: the request
    ran to its end first (on 2 shared cores an HTTP call can stall for seconds), or was aborted before its first
    token. Leftover requests of other tests on the shared engine do not matter: only this request id is aborted."""
    result: dict[str, Any] = {}
    body = {"request_id": rid, "prompt_token_ids": [2, 3], "max_tokens": n_max, "seed": 1}
    t = threading.Thread(target=lambda: result.update(_generate(url, **body)))
    t.start()
    aborted = False
    try:
        time.sleep(1.0)
        deadline = time.monotonic() + 60
        while t.is_alive() and not aborted:
            assert time.monotonic() < deadline, "the request neither ended nor could be aborted within 60 s"
            r = httpx.post(f"{url}/abort", json={"request_id": rid}, timeout=60)
            assert r.status_code == 200, r.text
            aborted = r.json() == {"request_id": rid, "aborted": True}
            if not aborted:
                time.sleep(0.25)
    finally:
        t.join(timeout=120)
    if not aborted:
        assert result["finish_reason"] == "length", result.get("finish_reason")
        return None
    return result if result["token_ids"] else None


def test_abort_returns_partial_tokens(server: ServerProcess) -> None:
    # Half the model length (~15 s of decoding), so that even a missed abort never runs a sequence up to
    # max_model_len on the shared engine. Up to five attempts: an abort that misses is retried, never skipped.
    n_max = MAX_MODEL_LEN // 2
    for attempt in range(5):
        before = _health(server.url)
        rid = f"long-{attempt}"
        result = _abort_mid_request(server.url, rid, n_max)
        if result is not None:
            break
    else:
        raise AssertionError("five aborts in a row missed their request")
    assert result["finish_reason"] == "abort"
    n = len(result["token_ids"])
    assert 1 <= n < n_max
    assert len(result["logprobs"]) == len(result["token_versions"]) == n
    assert httpx.post(f"{server.url}/abort", json={"request_id": rid}).json()["aborted"] is False
    after = _health(server.url)
    assert after["running"] == 0 and after["load"] == 0
    assert after["requests_aborted"] == before["requests_aborted"] + 1
    assert after["requests_finished"] == before["requests_finished"]
    assert after["tokens_generated"] == before["tokens_generated"] + n


HEALTH_FIELDS = {"status", "version", "running", "waiting", "load", "uptime_s", "busy_s", "tokens_generated",
                 "requests_finished", "requests_aborted", "updates", "lora_scale"}


def test_health_fields(server: ServerProcess) -> None:
    h = _health(server.url)
    assert set(h) == HEALTH_FIELDS
    assert h["status"] == "ok" and isinstance(h["version"], int)
    assert 0 <= h["busy_s"] <= h["uptime_s"]


def test_health_counters_increase_after_requests(server: ServerProcess) -> None:
    h0 = _health(server.url)
    _generate(server.url, request_id="c1", prompt_token_ids=[3, 4], max_tokens=50, seed=2)
    h1 = _health(server.url)
    assert h1["tokens_generated"] == h0["tokens_generated"] + 50
    assert h1["requests_finished"] == h0["requests_finished"] + 1
    assert h1["requests_aborted"] == h0["requests_aborted"] and h1["updates"] == h0["updates"]
    assert 0 < h1["busy_s"] - h0["busy_s"] <= h1["uptime_s"] - h0["uptime_s"]
    # Two overlapping requests: busy time counts the overlap once, so it never exceeds the wall time.
    threads = [threading.Thread(target=_generate, args=(server.url,),
                                kwargs={"request_id": f"c{i}", "prompt_token_ids": [5], "max_tokens": 300, "seed": i})
               for i in (2, 3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    h2 = _health(server.url)
    assert h2["tokens_generated"] == h1["tokens_generated"] + 600
    assert h2["requests_finished"] == h1["requests_finished"] + 2
    assert 0 < h2["busy_s"] - h1["busy_s"] <= h2["uptime_s"] - h1["uptime_s"]
    assert h2["busy_s"] <= h2["uptime_s"]


def test_min_tokens_holds_back_stop_token_ids(server: ServerProcess) -> None:
    base = _generate(server.url, request_id="m1", prompt_token_ids=[7, 8], max_tokens=400, seed=11)
    stop = max(set(base["token_ids"]), key=base["token_ids"].count)  # most frequent: it recurs after min_tokens
    first = base["token_ids"].index(stop)
    out = _generate(server.url, request_id="m2", prompt_token_ids=[7, 8], max_tokens=400, seed=11,
                    stop_token_ids=[stop], min_tokens=first + 30)
    n = len(out["token_ids"])
    assert n >= first + 30 and stop not in out["token_ids"][: first + 30]
    assert out["finish_reason"] == "stop" and out["token_ids"][-1] == stop
    assert len(out["logprobs"]) == len(out["token_versions"]) == n


def test_eos_from_generation_config_and_ignore_eos(eos_server: ServerProcess) -> None:
    url = eos_server.url
    body = {"prompt_token_ids": [3, 4, 5], "max_tokens": 300, "seed": 7}
    full = _generate(url, request_id="e1", ignore_eos=True, **body)
    assert full["finish_reason"] == "length" and len(full["token_ids"]) == 300  # reaches max_tokens
    assert EOS_TOKEN in full["token_ids"]  # it ran through EOS tokens
    first = full["token_ids"].index(EOS_TOKEN)
    stopped = _generate(url, request_id="e2", **body)
    assert stopped["finish_reason"] == "stop"
    assert stopped["token_ids"] == full["token_ids"][: first + 1]  # same seed, same sample, up to the EOS
    # ignore_eos covers the model's EOS only: an EOS listed in stop_token_ids still ends the request.
    listed = _generate(url, request_id="e3", ignore_eos=True, stop_token_ids=[EOS_TOKEN], **body)
    assert listed["finish_reason"] == "stop" and listed["token_ids"] == stopped["token_ids"]


def test_min_tokens_holds_back_eos(eos_server: ServerProcess) -> None:
    url = eos_server.url
    body = {"prompt_token_ids": [3, 4, 5], "max_tokens": 400, "seed": 7}
    first = len(_generate(url, request_id="e4", **body)["token_ids"])
    out = _generate(url, request_id="e5", min_tokens=first + 50, **body)
    n = len(out["token_ids"])
    assert n >= first + 50 and EOS_TOKEN not in out["token_ids"][: first + 50]
    assert out["finish_reason"] == "stop" and out["token_ids"][-1] == EOS_TOKEN


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ({"prompt_token_ids": [1], "max_tokens": 4}, "request_id"),
        ({"request_id": "x", "prompt_token_ids": [], "max_tokens": 4}, "prompt_token_ids"),
        ({"request_id": "x", "prompt_token_ids": ["a"], "max_tokens": 4}, "prompt_token_ids"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 0}, "max_tokens"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "top_p": 1.5}, "top_p"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "bogus": 1}, "bogus"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "min_tokens": -1}, "min_tokens"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "min_tokens": 5}, "min_tokens"),
        ({"request_id": "x", "prompt_token_ids": [1], "max_tokens": 4, "ignore_eos": "maybe"}, "ignore_eos"),
    ],
)
def test_bad_bodies_name_the_field(server: ServerProcess, body: dict[str, Any], field: str) -> None:
    r = httpx.post(f"{server.url}/generate", json=body)
    assert r.status_code == 422
    assert any(field in [str(x) for x in err["loc"]] for err in r.json()["detail"]), r.text


def test_too_long_is_400(server: ServerProcess) -> None:
    body = {"request_id": "x", "prompt_token_ids": [1] * 10, "max_tokens": MAX_MODEL_LEN - 3}
    r = httpx.post(f"{server.url}/generate", json=body)
    assert r.status_code == 400 and "max_tokens" in r.json()["detail"]
