"""Many samples per call: /generate_batch (streamed NDJSON), /abort_batch and the coalescing `GenerationClient`,
over the session's real vLLM server (tiny random Qwen2 without EOS, CPU).

What is shown: concurrent `generate` calls travel as one batch call and each sample gets exactly what /generate
gives it alone (same seed, same tokens); answers stream in finishing order; a bad item is refused alone, a bad body
whole; a client that disconnects half-way ends its requests and the server keeps serving; per-sample abort works
inside a batch.
"""

from __future__ import annotations

import asyncio
import json
import time
from typing import Any

import httpx
import pytest

from asyncrl.generation.client import GenerationClient
from tests.helpers.generation_server import ServerProcess, shared_generation_server

pytestmark = pytest.mark.integration

VOCAB = 32


@pytest.fixture(scope="module")
def server() -> ServerProcess:
    srv, _ = shared_generation_server()
    httpx.post(f"{srv.url}/generate", json={"request_id": "batch-warmup", "prompt_token_ids": [1], "max_tokens": 1},
               timeout=300)
    return srv


def _body(rid: str, n: int = 4, seed: int = 1, prompt: list[int] | None = None) -> dict[str, Any]:
    return {"request_id": rid, "prompt_token_ids": prompt or [3, 4, 5], "max_tokens": n, "temperature": 1.0,
            "top_p": 1.0, "seed": seed, "stop_token_ids": [], "min_tokens": 0, "ignore_eos": False}


def _lines(r: httpx.Response) -> list[dict[str, Any]]:
    return [json.loads(line) for line in r.text.splitlines() if line]


def test_concurrent_generates_travel_as_one_call_and_match_single_requests(server: ServerProcess) -> None:
    n = 40

    async def main() -> tuple[list[Any], int, int]:
        async with httpx.AsyncClient() as http:
            client = GenerationClient(server.url, http, timeout_s=120)
            outs = await asyncio.gather(*(
                client.generate(f"co-{i}", [3, 4, 5 + i % 7], max_tokens=5, temperature=1.0, top_p=1.0, seed=100 + i,
                                stop_token_ids=[]) for i in range(n)))
            return outs, client.batch_calls, client.requests

    outs, calls, requests = asyncio.run(main())
    assert calls == 1 and requests == n
    for i in (0, 17, 39):
        alone = httpx.post(f"{server.url}/generate", json=_body(f"alone-{i}", 5, 100 + i, [3, 4, 5 + i % 7]),
                           timeout=120).json()
        assert outs[i].token_ids == alone["token_ids"]
        assert outs[i].logprobs == pytest.approx(alone["logprobs"], abs=1e-5)
        assert outs[i].token_versions == alone["token_versions"] and outs[i].finish_reason == "length"
    assert all(len(o.token_ids) == len(o.logprobs) == len(o.token_versions) == 5 for o in outs)


def test_answers_stream_in_finishing_order(server: ServerProcess) -> None:
    body = {"requests": [_body("slow", 400), _body("quick", 2)]}
    with httpx.stream("POST", f"{server.url}/generate_batch", json=body, timeout=120) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        lines = [json.loads(line) for line in r.iter_lines() if line]
    assert [d["request_id"] for d in lines] == ["quick", "slow"]
    assert len(lines[0]["token_ids"]) == 2 and len(lines[1]["token_ids"]) == 400


def test_a_bad_item_is_refused_alone(server: ServerProcess) -> None:
    bad_vocab = _body("oov", prompt=[3, VOCAB + 5])
    too_long = _body("long", n=8192)
    r = httpx.post(f"{server.url}/generate_batch", json={"requests": [_body("fine"), bad_vocab, too_long]},
                   timeout=120)
    assert r.status_code == 200
    by_id = {d["request_id"]: d for d in _lines(r)}
    assert len(by_id["fine"]["token_ids"]) == 4
    assert by_id["oov"]["error"]["status"] == 422
    assert "vocabulary" in json.dumps(by_id["oov"]["error"]["detail"])
    assert by_id["long"]["error"]["status"] in (400, 422)


@pytest.mark.parametrize("body, where", [
    ({"requests": []}, "requests"),
    ({"requests": [_body("same"), _body("same")]}, "distinct"),
    ({"requests": [_body("a"), {**_body("b"), "max_tokens": "3"}]}, "max_tokens"),
    ({"requests": [_body(f"r{i}", 1) for i in range(4097)]}, "requests"),
    ({"requests": "not a list"}, "requests"),
    ({"request_ids": ["x"]}, "requests"),
])
def test_a_bad_body_is_refused_whole_naming_the_field(server: ServerProcess, body: dict[str, Any], where: str) -> None:
    r = httpx.post(f"{server.url}/generate_batch", json=body, timeout=60)
    assert r.status_code == 422, r.text
    assert where in r.text
    assert httpx.post(f"{server.url}/generate", json=_body("after-bad-body"), timeout=120).status_code == 200


def test_garbage_and_oversized_bodies(server: ServerProcess) -> None:
    assert httpx.post(f"{server.url}/generate_batch", content=b"{\"requests\": [", timeout=60).status_code == 422
    huge = {"requests": [_body(f"h{i}", 1, prompt=[3] * 4000) for i in range(1200)]}  # ~ 9.7 MB of JSON
    assert httpx.post(f"{server.url}/generate_batch", json=huge, timeout=60).status_code == 413
    assert httpx.post(f"{server.url}/abort_batch", json={"request_ids": []}, timeout=60).status_code == 422


def test_a_client_that_disconnects_ends_its_requests(server: ServerProcess) -> None:
    ids = [f"gone-{i}" for i in range(3)]
    body = {"requests": [_body("gone-quick", 1)] + [_body(rid, 6000) for rid in ids]}
    with httpx.stream("POST", f"{server.url}/generate_batch", json=body, timeout=120) as r:
        first = json.loads(next(line for line in r.iter_lines() if line))
        assert first["request_id"] == "gone-quick"
    # the connection is closed: the long requests end (no longer in flight) and the server serves on
    deadline = time.monotonic() + 60
    while True:
        still = httpx.post(f"{server.url}/abort_batch", json={"request_ids": ids}, timeout=30).json()["aborted"]
        if not still:
            break
        assert time.monotonic() < deadline, f"requests of a disconnected batch still in flight: {still}"
        time.sleep(0.5)
    assert httpx.post(f"{server.url}/generate", json=_body("after-disconnect"), timeout=120).status_code == 200


def test_abort_one_sample_of_a_batch(server: ServerProcess) -> None:
    async def main() -> tuple[Any, Any, bool]:
        async with httpx.AsyncClient() as http:
            client = GenerationClient(server.url, http, timeout_s=120)
            long = asyncio.create_task(client.generate("ab-long", [3, 4], max_tokens=6000, temperature=1.0,
                                                       top_p=1.0, seed=3, stop_token_ids=[]))
            short = asyncio.create_task(client.generate("ab-short", [3, 4], max_tokens=3, temperature=1.0,
                                                        top_p=1.0, seed=3, stop_token_ids=[]))
            done = await short
            aborted = False
            for _ in range(100):  # until the server has the long request in flight and says it aborted it
                aborted = await client.abort("ab-long")
                if aborted or long.done():
                    break
                await asyncio.sleep(0.1)
            return done, await long, aborted

    short, long, aborted = asyncio.run(main())
    assert aborted and long.finish_reason == "abort" and 1 <= len(long.token_ids) < 6000
    assert short.finish_reason == "length" and len(short.token_ids) == 3
