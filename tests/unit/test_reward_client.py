"""RewardClient (asyncrl.rewards.client): per-sample `score` calls coalesced into `/score_batch` calls, in process.

Against the real reward app over httpx's ASGI transport (calls counted by a request hook), and against scripted
servers (httpx.MockTransport) for what a real server does not do on demand: transient batch and item failures,
malformed answers, whole-batch 413s. Each item keeps `score`'s contract: its own reward or its own RemoteError, a
transient failure retried by its caller, a refusal raised at once, never a default reward."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Awaitable, Callable
from typing import Any

import httpx
import pytest

from asyncrl.rewards.client import RewardClient
from asyncrl.roles.reward import create_app
from asyncrl.rpc.auth import auth_headers
from asyncrl.rpc.http import RemoteError
from asyncrl.storage.retry import RetryPolicy

TOKEN = "t" * 20 + "-reward"
FAST = RetryPolicy(base_s=0.001, cap_s=0.002)
Outcome = tuple[float, dict[str, Any]] | BaseException


def _reward_client(http: httpx.AsyncClient, **kw: Any) -> RewardClient:
    kw.setdefault("token", TOKEN)
    return RewardClient("http://reward/", http, timeout_s=5, backoff=FAST, rand=lambda: 0.0, **kw)


async def _gather(client: RewardClient, responses: list[str], answer: Any = "2") -> list[Outcome]:
    return await asyncio.gather(*[client.score("arithmetic", "1+1=", r, {"answer": answer}) for r in responses],
                                return_exceptions=True)


class Recorder:
    """The items of each `/score_batch` call, by response text."""

    def __init__(self) -> None:
        self.batches: list[list[str]] = []
        self.paths: list[str] = []

    async def hook(self, request: httpx.Request) -> None:
        self.paths.append(request.url.path)
        if request.url.path == "/score_batch":
            self.batches.append([item["response"] for item in json.loads(request.content)["items"]])


def _with_app(test: Callable[[RewardClient, Recorder], Awaitable[Any]], **kw: Any) -> Any:
    """Run `test(client, recorder)` against the real reward app."""
    async def run() -> Any:
        rec = Recorder()
        transport = httpx.ASGITransport(app=create_app(token=TOKEN))
        async with httpx.AsyncClient(transport=transport, event_hooks={"request": [rec.hook]}) as http:
            return await test(_reward_client(http, **kw), rec)

    return asyncio.run(run())


def _with_handler(handler: Callable[[list[dict[str, Any]]], httpx.Response],
                  test: Callable[[RewardClient, Recorder], Awaitable[Any]], **kw: Any) -> Any:
    """Run `test(client, recorder)` against a scripted server: `handler(items)` answers each `/score_batch` call."""
    rec = Recorder()

    def route(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/score_batch" and request.headers["authorization"] == f"Bearer {TOKEN}"
        rec.batches.append([item["response"] for item in json.loads(request.content)["items"]])
        return handler(json.loads(request.content)["items"])

    async def run() -> Any:
        async with httpx.AsyncClient(transport=httpx.MockTransport(route)) as http:
            return await test(_reward_client(http, **kw), rec)

    return asyncio.run(run())


def _scored(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{"reward": 1.0 if it["response"] == it["metadata"]["answer"] else 0.0, "details": {"r": it["response"]}}
            for it in items]


def test_concurrent_scores_travel_as_one_batch_call_in_order() -> None:
    responses = [str(i % 4) for i in range(64)]

    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, responses)
        assert [o[0] for o in out] == [1.0 if r == "2" else 0.0 for r in responses]  # type: ignore[index]
        assert all(o[1]["parsed"] == r for o, r in zip(out, responses, strict=True))  # type: ignore[index]
        assert rec.paths == ["/score_batch"] and rec.batches == [responses]
        assert (client.calls, client.items, client.retries) == (1, 64, 0)
        # a later iteration's calls make a new batch call
        assert await client.score("arithmetic", "1+1=", "2", {"answer": "2"}) == (1.0, {
            "parsed": "2", "expected": "2", "correct": True, "reason": "correct"})
        assert (client.calls, client.items) == (2, 65) and rec.batches[1] == ["2"]

    _with_app(test)


def test_a_refused_item_fails_alone_and_at_once() -> None:
    async def test(client: RewardClient, rec: Recorder) -> None:
        calls = [client.score("arithmetic", "p", "2", {"answer": "2"}),
                 client.score("arithmetic", "p", "2", {"answer": None}),   # refused by the server
                 client.score("gsm8k", "p", "2", {"answer": "2"}),         # unknown task: refused by the server
                 client.score("arithmetic", "p", "3", {"answer": "2"})]
        out = await asyncio.gather(*calls, return_exceptions=True)
        assert out[0][0] == 1.0 and out[3][0] == 0.0  # type: ignore[index]
        for err in out[1:3]:
            assert isinstance(err, RemoteError) and err.status == 422 and not err.transient, err
        assert "metadata.answer" in str(out[1]) and "gsm8k" in str(out[2])
        assert out[1] is not out[2]
        assert client.calls == 1 and client.retries == 0 and len(rec.batches) == 1

    _with_app(test, attempts=4)


def test_what_the_server_would_refuse_as_a_field_is_refused_before_the_batch() -> None:
    async def test(client: RewardClient, rec: Recorder) -> None:
        bad: list[tuple[tuple[Any, ...], type[BaseException], int | None]] = [
            (("", "p", "r", {"answer": "2"}), RemoteError, 422),
            (("t" * 129, "p", "r", {"answer": "2"}), RemoteError, 422),
            (("arithmetic", 5, "r", {"answer": "2"}), RemoteError, 422),
            (("arithmetic", "p", None, {"answer": "2"}), RemoteError, 422),
            (("arithmetic", "p", "r" * ((1 << 20) + 1), {"answer": "2"}), RemoteError, 422),
            (("arithmetic", "p", "r", ["answer"]), RemoteError, 422),
            (("arithmetic", "p", "r", {"answer": float("nan")}), ValueError, None),  # as httpx refuses to encode it
            (("arithmetic", "p", "r", {"answer": object()}), TypeError, None),
            (("arithmetic", "p", "\ud800", {"answer": "2"}), ValueError, None),  # a lone surrogate: not UTF-8
        ]
        good = [client.score("arithmetic", "p", "2", {"answer": "2"}) for _ in range(3)]
        out = await asyncio.gather(*good, *[client.score(*args) for args, _, _ in bad], return_exceptions=True)
        assert out[:3] == [(1.0, {"parsed": "2", "expected": "2", "correct": True, "reason": "correct"})] * 3
        for (args, kind, status), err in zip(bad, out[3:], strict=True):
            assert isinstance(err, kind), (args[:2], err)
            if kind is RemoteError:
                assert err.status == status and not err.transient and "refused before sending" in str(err)
        assert rec.batches == [["2", "2", "2"]] and client.calls == 1

    _with_app(test, attempts=3)


def test_a_transient_batch_failure_is_retried_per_item_and_the_retries_coalesce_again() -> None:
    answers = iter([httpx.Response(503, json={"detail": "overloaded"}), httpx.Response(502, text="bad gateway")])

    def handler(items: list[dict[str, Any]]) -> httpx.Response:
        return next(answers, None) or httpx.Response(200, json={"results": _scored(items)})

    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["2", "1", "2"])
        assert [o[0] for o in out] == [1.0, 0.0, 1.0]  # type: ignore[index]
        assert rec.batches == [["2", "1", "2"]] * 3  # every item failed twice and was retried, together
        assert client.retries == 6 and client.calls == 3

    _with_handler(handler, test, attempts=4)


def test_out_of_attempts_each_item_gets_its_own_transient_error() -> None:
    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["a", "b"])
        for err in out:
            assert isinstance(err, RemoteError) and err.status == 503 and err.transient and not err.lost
        assert out[0] is not out[1] and len(rec.batches) == 2 and client.retries == 2

    _with_handler(lambda items: httpx.Response(503, json={"detail": "overloaded"}), test, attempts=2)


def test_an_item_transient_failure_is_retried_alone() -> None:
    seen: dict[str, int] = {}

    def handler(items: list[dict[str, Any]]) -> httpx.Response:
        results = []
        for it in items:
            seen[it["response"]] = seen.get(it["response"], 0) + 1
            if it["response"] == "flaky" and seen["flaky"] <= 2:
                results.append({"error": {"status": 503, "detail": "try again"}})
            elif it["response"] == "slow":
                results.append({"error": {"status": 429, "detail": "busy"}})
            else:
                results.append(_scored([it])[0])
        return httpx.Response(200, json={"results": results})

    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["2", "flaky", "slow"])
        assert out[0] == (1.0, {"r": "2"}) and out[1] == (0.0, {"r": "flaky"})
        assert isinstance(out[2], RemoteError) and out[2].status == 429 and "busy" in str(out[2])
        assert rec.batches == [["2", "flaky", "slow"], ["flaky", "slow"], ["flaky", "slow"]]
        assert client.retries == 4

    _with_handler(handler, test, attempts=3)


@pytest.mark.parametrize(("answer", "needle"), [
    (httpx.Response(200, json={"results": [{"reward": 1.0, "details": {}}]}), "with 3 results, got a list of 1"),
    (httpx.Response(200, json={"results": "nope"}), "got a str"),
    (httpx.Response(200, json={"answers": []}), "got an object with keys ['answers']"),
    (httpx.Response(200, json=[1, 2, 3]), "got a list of 3"),
    (httpx.Response(200, content=b"{not json"), "not JSON"),
    (httpx.Response(200, content=b"\xff\xfe garbage"), "not JSON"),
    (httpx.Response(200, json={"results": [1, 2, 3]}), "results[0]: expected"),
    (httpx.Response(200, json={"results": [{"reward": "1"}] * 3}), "results[0]: expected"),
    (httpx.Response(200, json={"results": [{"reward": True, "details": {}}] * 3}), "results[0]: expected"),
    (httpx.Response(200, json={"results": [{"reward": 1.0, "details": []}] * 3}), "results[0]: expected"),
    (httpx.Response(200, json={"results": [{"details": {}}] * 3}), "results[0]: expected"),
    (httpx.Response(200, content=b'{"results": [{"reward": NaN, "details": {}}, 1, 2]}'), "results[0]: expected"),
    (httpx.Response(200, json={"results": [{"error": "bad"}] * 3}), "results[0].error: expected"),
    (httpx.Response(200, json={"results": [{"error": {"status": 200, "detail": "x"}}] * 3}), "results[0].error"),
    (httpx.Response(200, json={"results": [{"error": {"status": "422"}}] * 3}), "results[0].error"),
])
def test_a_malformed_answer_fails_the_items_with_a_clear_remote_error(answer: httpx.Response, needle: str) -> None:
    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["2", "2", "2"])
        assert isinstance(out[0], RemoteError) and "malformed answer" in str(out[0]), out[0]
        assert needle in str(out[0]), str(out[0])
        assert all(isinstance(o, RemoteError) and o.status is None and not o.lost for o in out), out
        assert len(rec.batches) == 1 and client.retries == 0

    _with_handler(lambda items: answer, test)


def test_a_malformed_result_fails_only_its_item() -> None:
    def handler(items: list[dict[str, Any]]) -> httpx.Response:
        return httpx.Response(200, json={"results": [{"reward": 1.0, "details": {}}, {"rewrd": 1.0},
                                                     {"reward": 0.0}]})

    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["a", "b", "c"])
        assert out[0] == (1.0, {}) and out[2] == (0.0, {})  # details default to {} as /score's did
        assert isinstance(out[1], RemoteError) and "results[1]" in str(out[1])

    _with_handler(handler, test)


def test_a_whole_batch_refusal_is_split_until_it_lands_on_its_item() -> None:
    def handler(items: list[dict[str, Any]]) -> httpx.Response:
        if any(it["response"] == "huge" for it in items):
            return httpx.Response(413, json={"detail": "request body too large"})
        if any(it["response"] == "odd" for it in items):
            return httpx.Response(422, json={"detail": [{"loc": ["body", "items", 0], "msg": "x", "type": "y"}]})
        return httpx.Response(200, json={"results": _scored(items)})

    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["2", "1", "huge", "2", "odd"])
        assert [o[0] for o in out if isinstance(o, tuple)] == [1.0, 0.0, 1.0]
        assert isinstance(out[2], RemoteError) and out[2].status == 413 and not out[2].transient
        assert isinstance(out[4], RemoteError) and out[4].status == 422 and not out[4].transient
        assert client.retries == 0 and client.calls == len(rec.batches)
        assert rec.batches[0] == ["2", "1", "huge", "2", "odd"] and ["huge"] in rec.batches and ["odd"] in rec.batches

    _with_handler(handler, test, attempts=4)


def test_refused_credentials_fail_every_item_at_once() -> None:
    async def test(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, ["2", "2"])
        assert all(isinstance(o, RemoteError) and o.status == 401 and not o.transient for o in out), out
        assert client.calls == 1 and client.retries == 0

    async def run() -> None:
        transport = httpx.ASGITransport(app=create_app(token=TOKEN))
        async with httpx.AsyncClient(transport=transport) as http:
            client = RewardClient("http://reward", http, timeout_s=5, token="", attempts=3)
            assert auth_headers("") == {}
            await test(client, Recorder())

    asyncio.run(run())


def test_no_answer_is_transient_and_lost() -> None:
    def route(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("refused", request=request)

    async def run() -> None:
        async with httpx.AsyncClient(transport=httpx.MockTransport(route)) as http:
            client = _reward_client(http, attempts=3)
            out = await _gather(client, ["a", "b"])
            for err in out:
                assert isinstance(err, RemoteError) and err.status is None and err.lost and err.transient
            assert client.retries == 4 and client.calls == 3

    asyncio.run(run())


def test_batches_are_chunked_by_items_and_by_bytes() -> None:
    async def by_items(client: RewardClient, rec: Recorder) -> None:
        out = await _gather(client, [str(i) for i in range(7)])
        assert [o[0] for o in out] == [1.0 if i == 2 else 0.0 for i in range(7)]  # type: ignore[index]
        assert rec.batches == [["0", "1", "2"], ["3", "4", "5"], ["6"]] and client.calls == 3

    _with_app(by_items, max_batch_items=3)

    async def by_bytes(client: RewardClient, rec: Recorder) -> None:
        texts = ["2" * 600, "é" * 300, "x" * 200, "y" * 200, "z" * 2000]  # "é": 2 bytes in UTF-8
        out = await _gather(client, texts)
        assert all(isinstance(o, tuple) for o in out), out
        assert [[len(t) for t in b] for b in rec.batches] == [[600], [300], [200, 200], [2000]]

    _with_app(by_bytes, max_batch_bytes=700)


def test_a_cancelled_caller_does_not_disturb_the_others() -> None:
    release = asyncio.Event()

    async def test(client: RewardClient, rec: Recorder) -> None:
        tasks = [asyncio.create_task(client.score("arithmetic", "p", r, {"answer": "2"})) for r in ("2", "x", "3")]
        await asyncio.sleep(0.01)
        tasks[1].cancel()
        release.set()
        out = await asyncio.gather(*tasks, return_exceptions=True)
        assert out[0][0] == 1.0 and isinstance(out[1], asyncio.CancelledError) and out[2][0] == 0.0  # type: ignore
        assert rec.batches == [["2", "x", "3"]]

    async def run() -> None:
        rec = Recorder()

        async def route(request: httpx.Request) -> httpx.Response:
            rec.batches.append([it["response"] for it in json.loads(request.content)["items"]])
            await release.wait()
            return httpx.Response(200, json={"results": _scored(json.loads(request.content)["items"])})

        async with httpx.AsyncClient(transport=httpx.MockTransport(route)) as http:
            await test(_reward_client(http), rec)

    asyncio.run(run())


def test_the_constructor_refuses_impossible_settings() -> None:
    http = httpx.AsyncClient()
    with pytest.raises(ValueError, match="attempts"):
        RewardClient("http://r", http, 1.0, token=TOKEN, attempts=0)
    with pytest.raises(ValueError, match="max_batch_items"):
        RewardClient("http://r", http, 1.0, token=TOKEN, max_batch_items=5000)
