"""The generation role's HTTP client: `generate`, `abort`, `health`, `wait_version` of one server, with deadlines on
every call.

Token ids travel, never text, between the environment and generation (docs/generation_api.md).
Every call carries `Authorization: Bearer <token>`, the token defaulting to `ASYNCRL_ROLE_TOKEN`
(`asyncrl.rpc.auth`); a server that refuses it answers 401/403, which becomes `RemoteError`.

`generate` and `abort` are one call per sample for their caller, but on the wire the samples a caller submits in
the same event-loop iteration travel together (`asyncrl.rpc.coalesce`): one `POST /generate_batch` per server
and per iteration, whose NDJSON answer streams each sample back as it finishes, and one `POST /abort_batch`. So the
scheduler still decides per sample (routing, replication, first-n-of-n+k, per-sample abort), while the cost of a
call is paid per batch. Each sample keeps its own deadline: past it the caller gets `RemoteError(lost=True)`, as
for a connection that breaks or a stream that ends without the sample's line.
"""

from __future__ import annotations

import asyncio
import logging
from dataclasses import dataclass
from typing import Any

import httpx
import msgspec

from asyncrl.rpc.auth import auth_headers
from asyncrl.rpc.coalesce import Coalescer, Unanswered, settle
from asyncrl.rpc.http import RemoteError

log = logging.getLogger(__name__)

MAX_BATCH_REQUESTS = 1024  # requests per /generate_batch call (the server takes up to 4096)
MAX_BATCH_BYTES = 4 << 20  # estimated body bytes per call, well under the servers' 8 MiB limit
# msgspec, not the json module: 10x faster on a call's body and 4x on each answer line (~3% of an environment
# role's CPU on the default job). The bodies hold ints, strings and finite floats, which both write the same way.
_ENCODER, _DECODER = msgspec.json.Encoder(), msgspec.json.Decoder()


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    finish_reason: str
    start_version: int


@dataclass
class _Request:
    body: dict[str, Any]
    timeout_s: float


def _request_bytes(r: _Request) -> int:
    """A generous estimate of the request's JSON size (token ids up to 6 digits and a comma)."""
    return 256 + 7 * (len(r.body["prompt_token_ids"]) + len(r.body["stop_token_ids"]))


def parse_generated(out: Any, source: str) -> Generated:
    """A /generate answer as `Generated`; a malformed one is a `RemoteError` naming `source`."""
    try:
        return Generated([int(t) for t in out["token_ids"]], [float(x) for x in out["logprobs"]],
                         [int(v) for v in out["token_versions"]], str(out["finish_reason"]),
                         int(out["start_version"]))
    except (KeyError, TypeError, ValueError) as err:
        raise RemoteError(f"{source}: malformed answer: {err!r}") from err


class GenerationClient:
    """One generation server: `generate`, `abort`, `health`. `token`: the bearer token (default: the
    environment's `ASYNCRL_ROLE_TOKEN`). Counters: `batch_calls` (generate batches sent), `requests` (samples)."""

    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout_s: float, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._timeout = timeout_s
        self._headers = auth_headers(token)
        self._generate: Coalescer[_Request, dict[str, Any]] = Coalescer(
            self._send_generate, max_items=MAX_BATCH_REQUESTS, max_bytes=MAX_BATCH_BYTES, size=_request_bytes,
            name=f"{self.base_url}/generate_batch")
        self._abort: Coalescer[str, bool] = Coalescer(
            self._send_abort, max_items=MAX_BATCH_REQUESTS, max_bytes=MAX_BATCH_BYTES, size=lambda rid: len(rid) + 4,
            name=f"{self.base_url}/abort_batch")

    @property
    def batch_calls(self) -> int:
        return self._generate.calls

    @property
    def requests(self) -> int:
        return self._generate.items

    async def generate(self, request_id: str, prompt_token_ids: list[int], *, max_tokens: int, temperature: float,
                       top_p: float, seed: int | None, stop_token_ids: list[int],
                       timeout_s: float | None = None, min_tokens: int = 0, ignore_eos: bool = False,
                       min_version: int = 0) -> Generated:
        """One sample. `min_tokens`: EOS/stop ids cannot end it earlier; `ignore_eos`: the model's EOS does not
        end it (ids in `stop_token_ids` still do, so leave EOS out of them to get lengths up to `max_tokens`);
        `min_version`: the server holds it until its weights are at least that version."""
        deadline = timeout_s or self._timeout
        body = {
            "request_id": request_id, "prompt_token_ids": prompt_token_ids, "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "seed": seed, "stop_token_ids": stop_token_ids,
            "min_tokens": min_tokens, "ignore_eos": ignore_eos,
        }
        if min_version > 0:
            body["min_version"] = min_version
        fut = self._generate.submit(_Request(body, deadline))
        try:
            out = await asyncio.wait_for(fut, deadline)
        except TimeoutError as err:
            raise RemoteError(f"{self.base_url}/generate_batch: no answer for {request_id} within {deadline:g} s",
                              lost=True) from err
        except Unanswered as err:
            raise RemoteError(f"{self.base_url}/generate_batch: {err}", lost=True) from err
        return parse_generated(out, f"{self.base_url}/generate_batch {request_id}")

    async def _send_generate(self, items: list[_Request], futs: list[asyncio.Future[dict[str, Any]]]) -> None:
        """One /generate_batch call: resolve each sample's future from its line of the streamed answer."""
        url = f"{self.base_url}/generate_batch"
        waiting = {r.body["request_id"]: f for r, f in zip(items, futs, strict=True)}
        read_s = max(r.timeout_s for r in items)
        timeout = httpx.Timeout(self._timeout, read=read_s)
        content = _ENCODER.encode({"requests": [r.body for r in items]})
        headers = {**self._headers, "content-type": "application/json"}
        try:
            async with self._client.stream("POST", url, content=content, headers=headers, timeout=timeout) as r:
                if r.status_code != 200:
                    text = (await r.aread()).decode(errors="replace")[:300]
                    raise RemoteError(f"POST {url}: HTTP {r.status_code}: {text}", r.status_code)
                async for line in r.aiter_lines():
                    if line:
                        self._answer_line(url, line, waiting)
        except httpx.HTTPError as err:
            raise RemoteError(f"POST {url}: {type(err).__name__}: {err}", lost=True) from err
        for rid, fut in waiting.items():
            settle(fut, error=RemoteError(f"POST {url}: the stream ended without an answer for {rid}", lost=True))

    @staticmethod
    def _answer_line(url: str, line: str, waiting: dict[str, asyncio.Future[dict[str, Any]]]) -> None:
        try:
            doc = _DECODER.decode(line)
            rid = doc["request_id"]
            error = doc.get("error")
            if error is not None:
                status, detail = int(error["status"]), error.get("detail")
        except (msgspec.DecodeError, ValueError, KeyError, TypeError, AttributeError) as err:
            raise RemoteError(f"POST {url}: malformed line in the answer stream: {err!r}") from err
        fut = waiting.pop(rid, None) if isinstance(rid, str) else None
        if fut is None:
            log.warning("POST %s: an answer for %r, which this call did not send (or answered twice)", url, rid)
            return
        if error is not None:
            settle(fut, error=RemoteError(f"POST {url} ({rid}): HTTP {status}: {str(detail)[:300]}", status))
        else:
            settle(fut, doc)

    async def abort(self, request_id: str) -> bool:
        """Abort one request; True when the server had it in flight."""
        try:
            return await asyncio.wait_for(self._abort.submit(request_id), self._timeout)
        except TimeoutError as err:
            raise RemoteError(f"{self.base_url}/abort_batch: no answer within {self._timeout:g} s", lost=True) from err
        except Unanswered as err:
            raise RemoteError(f"{self.base_url}/abort_batch: {err}", lost=True) from err

    async def _send_abort(self, ids: list[str], futs: list[asyncio.Future[bool]]) -> None:
        url = f"{self.base_url}/abort_batch"
        try:
            r = await self._client.post(url, json={"request_ids": ids}, headers=self._headers, timeout=self._timeout)
        except httpx.HTTPError as err:
            raise RemoteError(f"POST {url}: {type(err).__name__}: {err}", lost=True) from err
        if r.status_code != 200:
            raise RemoteError(f"POST {url}: HTTP {r.status_code}: {r.text[:300]}", r.status_code)
        try:
            aborted = {str(x) for x in r.json()["aborted"]}
        except (ValueError, KeyError, TypeError) as err:
            raise RemoteError(f"POST {url}: malformed answer: {err!r}") from err
        for rid, fut in zip(ids, futs, strict=True):
            settle(fut, rid in aborted)

    async def wait_version(self, after: int, wait_s: float) -> int:
        """The newest version the server serves or is being updated to, once it is above `after`, or the current one
        after `wait_s` seconds (a long poll: `GET /weights/version`, its `updating_to`); `RemoteError` when the server
        does not answer within `wait_s` + the client's deadline."""
        url = f"{self.base_url}/weights/version"
        try:
            r = await self._client.get(url, params={"after": after, "wait_s": wait_s}, headers=self._headers,
                                       timeout=wait_s + self._timeout)
        except httpx.HTTPError as err:
            raise RemoteError(f"GET {url}: {type(err).__name__}: {err}", lost=True) from err
        if r.status_code != 200:
            raise RemoteError(f"GET {url}: HTTP {r.status_code}: {r.text[:300]}", r.status_code)
        try:
            doc = r.json()
            return max(int(doc["version"]), int(doc.get("updating_to", doc["version"])))
        except (ValueError, KeyError, TypeError) as err:
            raise RemoteError(f"GET {url}: malformed answer: {err!r}") from err

    async def health(self, timeout_s: float | None = None) -> dict[str, Any]:
        try:
            r = await self._client.get(f"{self.base_url}/health", headers=self._headers,
                                       timeout=timeout_s or self._timeout)
            r.raise_for_status()
            return dict(r.json())
        except (httpx.HTTPError, ValueError, TypeError) as err:
            raise RemoteError(f"GET {self.base_url}/health: {err}") from err
