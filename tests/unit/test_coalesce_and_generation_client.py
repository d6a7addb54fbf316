"""The coalescer (many one-item calls → few batch calls) and the generation client's reading of a batch's answer
stream, against injected answers (httpx.MockTransport: malformed, truncated, refused streams on purpose)."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
import pytest

from asyncrl.generation.client import GenerationClient
from asyncrl.rpc.coalesce import Coalescer, Unanswered, settle
from asyncrl.rpc.http import RemoteError

# ---- Coalescer -------------------------------------------------------------------------------------------------


def test_items_of_one_iteration_go_in_one_call_chunked_by_count_and_bytes() -> None:
    calls: list[list[int]] = []

    async def send(items: list[int], futs: list[asyncio.Future[int]]) -> None:
        calls.append(items)
        for x, f in zip(items, futs, strict=True):
            settle(f, x * 10)

    async def main() -> list[int]:
        c: Coalescer[int, int] = Coalescer(send, max_items=4, max_bytes=25, size=lambda x: x)
        out = await asyncio.gather(*(c.submit(x) for x in [1, 2, 3, 4, 5, 20, 6, 7]))
        assert (c.calls, c.items) == (3, 8)
        later = await c.submit(9)  # a later iteration: a call of its own
        assert c.calls == 4
        return [*out, later]

    assert asyncio.run(main()) == [10, 20, 30, 40, 50, 200, 60, 70, 90]
    # count limit 4 closes [1,2,3,4]; 5 + 20 = 25 fits, + 6 would pass 25 bytes
    assert calls == [[1, 2, 3, 4], [5, 20], [6, 7], [9]]


def test_a_failed_call_fails_each_item_and_unanswered_items_are_never_left_hanging() -> None:
    async def send(items: list[str], futs: list[asyncio.Future[str]]) -> None:
        settle(futs[0], "first")
        if "boom" in items:
            raise RemoteError("down", lost=True)

    async def main() -> list[Any]:
        c: Coalescer[str, str] = Coalescer(send, max_items=10, max_bytes=10**6)
        a = await asyncio.gather(c.submit("ok"), c.submit("boom"), return_exceptions=True)
        b = await asyncio.gather(c.submit("ok"), c.submit("forgotten"), return_exceptions=True)
        return [*a, *b]

    first, boom, first2, forgotten = asyncio.run(main())
    assert first == first2 == "first"
    assert isinstance(boom, RemoteError) and boom.lost
    assert isinstance(forgotten, Unanswered)


def test_a_cancelled_item_is_not_sent() -> None:
    sent: list[list[str]] = []

    async def send(items: list[str], futs: list[asyncio.Future[str]]) -> None:
        sent.append(items)
        for f in futs:
            settle(f, "x")

    async def main() -> str:
        c: Coalescer[str, str] = Coalescer(send, max_items=10, max_bytes=10**6)
        gone = c.submit("gone")
        kept = c.submit("kept")
        gone.cancel()
        return await kept

    assert asyncio.run(main()) == "x" and sent == [["kept"]]


def test_close_right_after_a_flush_leaves_no_item_unsettled() -> None:
    """The flush has created the batch call's task, which has not run yet when `close()` cancels it."""
    sent: list[list[str]] = []

    async def send(items: list[str], futs: list[asyncio.Future[str]]) -> None:
        sent.append(items)

    async def main() -> None:
        c: Coalescer[str, str] = Coalescer(send, max_items=10, max_bytes=10**6)
        item = c.submit("x")
        await asyncio.sleep(0)  # the flush ran: a task exists for the call, not started
        await c.close()
        with pytest.raises(Unanswered):
            await asyncio.wait_for(item, 5)

    asyncio.run(main())
    assert sent == []


def test_bounds_are_checked() -> None:
    async def send(items: list[int], futs: list[asyncio.Future[int]]) -> None:
        return None

    with pytest.raises(ValueError, match="max_items"):
        Coalescer(send, max_items=0, max_bytes=1)


# ---- the generation client's answer stream --------------------------------------------------------------------


def _answer(rid: str, n: int = 2) -> dict[str, Any]:
    return {"request_id": rid, "token_ids": [5] * n, "logprobs": [-0.5] * n, "token_versions": [0] * n,
            "finish_reason": "length", "start_version": 0}


def _run(handler: Any, ids: list[str]) -> tuple[list[Any], list[dict[str, Any]]]:
    seen: list[dict[str, Any]] = []

    def recording(request: httpx.Request) -> httpx.Response:
        seen.append({"path": request.url.path, "body": json.loads(request.content)})
        return handler(request)

    async def main() -> list[Any]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(recording)) as http:
            client = GenerationClient("http://gen", http, timeout_s=5, token="t" * 20)
            return await asyncio.gather(*(client.generate(rid, [1, 2], max_tokens=2, temperature=1.0, top_p=1.0,
                                                          seed=1, stop_token_ids=[]) for rid in ids),
                                        return_exceptions=True)

    return asyncio.run(main()), seen


def _ndjson(*docs: Any) -> bytes:
    return b"".join((d if isinstance(d, bytes) else json.dumps(d).encode()) + b"\n" for d in docs)


def test_each_sample_gets_its_own_line_in_any_order() -> None:
    outs, seen = _run(lambda r: httpx.Response(200, content=_ndjson(_answer("b", 3), _answer("a", 1))), ["a", "b"])
    assert [len(o.token_ids) for o in outs] == [1, 3]
    assert len(seen) == 1 and seen[0]["path"] == "/generate_batch"
    assert [r["request_id"] for r in seen[0]["body"]["requests"]] == ["a", "b"]


def test_an_error_line_fails_its_sample_alone_with_its_status() -> None:
    err = {"request_id": "a", "error": {"status": 503, "detail": "weight update failed"}}
    outs, _ = _run(lambda r: httpx.Response(200, content=_ndjson(err, _answer("b"))), ["a", "b"])
    assert isinstance(outs[0], RemoteError) and outs[0].status == 503 and outs[0].server_unavailable
    assert outs[1].token_ids == [5, 5]


def test_a_stream_that_ends_early_loses_the_unanswered_samples() -> None:
    outs, _ = _run(lambda r: httpx.Response(200, content=_ndjson(_answer("a"))), ["a", "b"])
    assert outs[0].token_ids == [5, 5]
    assert isinstance(outs[1], RemoteError) and outs[1].lost and "without an answer" in str(outs[1])


def test_a_malformed_line_fails_the_rest_clearly_but_not_as_lost() -> None:
    outs, _ = _run(lambda r: httpx.Response(200, content=_ndjson(_answer("a"), b"{not json")), ["a", "b"])
    assert outs[0].token_ids == [5, 5]
    assert isinstance(outs[1], RemoteError) and not outs[1].lost and "malformed" in str(outs[1])
    bad_fields = {"request_id": "a", "token_ids": "nope"}
    outs, _ = _run(lambda r: httpx.Response(200, content=_ndjson(bad_fields)), ["a"])
    assert isinstance(outs[0], RemoteError) and "malformed answer" in str(outs[0])


def test_a_refused_call_fails_every_sample_with_the_status() -> None:
    outs, _ = _run(lambda r: httpx.Response(401, json={"detail": "missing bearer token"}), ["a", "b"])
    assert all(isinstance(o, RemoteError) and o.status == 401 and not o.lost for o in outs)


def test_no_connection_is_lost() -> None:
    def refuse(request: httpx.Request) -> httpx.Response:
        raise httpx.ConnectError("connection refused", request=request)

    outs, _ = _run(refuse, ["a"])
    assert isinstance(outs[0], RemoteError) and outs[0].lost and outs[0].server_unavailable


def test_a_sample_past_its_deadline_is_lost() -> None:
    async def main() -> Any:
        async def slow(request: httpx.Request) -> httpx.Response:
            await asyncio.sleep(5)
            return httpx.Response(200, content=b"")

        async with httpx.AsyncClient(transport=httpx.MockTransport(slow)) as http:
            client = GenerationClient("http://gen", http, timeout_s=5, token="t" * 20)
            try:
                await client.generate("a", [1], max_tokens=1, temperature=1.0, top_p=1.0, seed=None,
                                      stop_token_ids=[], timeout_s=0.2)
            except RemoteError as err:
                return err
            return None

    err = asyncio.run(main())
    assert isinstance(err, RemoteError) and err.lost and "within 0.2 s" in str(err)


def test_aborts_of_one_iteration_go_in_one_call() -> None:
    seen: list[Any] = []

    def handler(request: httpx.Request) -> httpx.Response:
        ids = json.loads(request.content)["request_ids"]
        seen.append(ids)
        return httpx.Response(200, json={"aborted": [i for i in ids if i != "gone"]})

    async def main() -> list[bool]:
        async with httpx.AsyncClient(transport=httpx.MockTransport(handler)) as http:
            client = GenerationClient("http://gen", http, timeout_s=5, token="t" * 20)
            return list(await asyncio.gather(client.abort("x"), client.abort("gone"), client.abort("y")))

    assert asyncio.run(main()) == [True, False, True]
    assert seen == [["x", "gone", "y"]]
