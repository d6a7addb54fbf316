"""Async HTTP clients for the generation and reward roles, with deadlines on every call.

Token ids travel, never text, between the environment and generation (DESIGN.md "Generation API").
Every call carries `Authorization: Bearer <token>`, the token defaulting to `ASYNCRL_ROLE_TOKEN`
(`asyncrl.transport.auth`); a server that refuses it answers 401/403, which becomes `RemoteError`.
"""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from asyncrl.transport.auth import auth_headers
from asyncrl.transport.retry import RetryPolicy


class RemoteError(RuntimeError):
    """A role answered with an error (`status`) or not within its deadline (`status` None: no answer).

    `lost`: the call got no answer at all (connection refused or reset, or its deadline passed): the server may be
    gone. Only `post_json` sets it; an error raised for any other reason never does."""

    def __init__(self, message: str, status: int | None = None, lost: bool = False) -> None:
        super().__init__(message)
        self.status = status
        self.lost = lost

    @property
    def server_unavailable(self) -> bool:
        """The server did not answer, or answered that it cannot serve now (503): re-send the work elsewhere."""
        return self.lost or self.status == 503

    @property
    def transient(self) -> bool:
        """Worth retrying: no answer (connection, deadline), 429, or a 5xx; never a refusal of the request."""
        return self.status is None or self.status == 429 or self.status >= 500


@dataclass
class Generated:
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    finish_reason: str
    start_version: int


async def post_json(client: httpx.AsyncClient, url: str, body: dict[str, Any], timeout_s: float,
                    headers: dict[str, str] | None = None) -> dict[str, Any]:
    """POST `body` as JSON; a transport error, a deadline or a non-200 answer becomes `RemoteError`."""
    try:
        r = await client.post(url, json=body, headers=headers, timeout=timeout_s)
    except httpx.HTTPError as err:
        raise RemoteError(f"POST {url}: {type(err).__name__}: {err}", lost=True) from err
    if r.status_code != 200:
        raise RemoteError(f"POST {url}: HTTP {r.status_code}: {r.text[:300]}", r.status_code)
    return r.json()


class GenerationClient:
    """One generation server: `generate`, `abort`, `health`. `token`: the bearer token (default: the
    environment's `ASYNCRL_ROLE_TOKEN`)."""

    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout_s: float, token: str | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._timeout = timeout_s
        self._headers = auth_headers(token)

    async def _post(self, path: str, body: dict[str, Any], timeout_s: float | None = None) -> dict[str, Any]:
        return await post_json(self._client, f"{self.base_url}{path}", body, timeout_s or self._timeout,
                               self._headers)

    async def generate(self, request_id: str, prompt_token_ids: list[int], *, max_tokens: int, temperature: float,
                       top_p: float, seed: int | None, stop_token_ids: list[int],
                       timeout_s: float | None = None, min_tokens: int = 0, ignore_eos: bool = False) -> Generated:
        """One sample. `min_tokens`: EOS/stop ids cannot end it earlier; `ignore_eos`: the model's EOS does not
        end it (ids in `stop_token_ids` still do, so leave EOS out of them to get lengths up to `max_tokens`)."""
        out = await self._post("/generate", {
            "request_id": request_id, "prompt_token_ids": prompt_token_ids, "max_tokens": max_tokens,
            "temperature": temperature, "top_p": top_p, "seed": seed, "stop_token_ids": stop_token_ids,
            "min_tokens": min_tokens, "ignore_eos": ignore_eos,
        }, timeout_s)
        try:
            return Generated([int(t) for t in out["token_ids"]], [float(x) for x in out["logprobs"]],
                             [int(v) for v in out["token_versions"]], str(out["finish_reason"]),
                             int(out["start_version"]))
        except (KeyError, TypeError, ValueError) as err:
            raise RemoteError(f"{self.base_url}/generate: malformed answer: {err}") from err

    async def abort(self, request_id: str) -> None:
        await self._post("/abort", {"request_id": request_id})

    async def health(self, timeout_s: float | None = None) -> dict[str, Any]:
        try:
            r = await self._client.get(f"{self.base_url}/health", headers=self._headers,
                                       timeout=timeout_s or self._timeout)
            r.raise_for_status()
            return dict(r.json())
        except (httpx.HTTPError, ValueError, TypeError) as err:
            raise RemoteError(f"GET {self.base_url}/health: {err}") from err


class RewardClient:
    """The reward role's `/score`. `token`: the bearer token (default: the environment's `ASYNCRL_ROLE_TOKEN`)."""

    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout_s: float, token: str | None = None,
                 attempts: int = 1, backoff: RetryPolicy | None = None,
                 rand: Callable[[], float] = random.random) -> None:
        self.base_url = base_url.rstrip("/")
        self._client = client
        self._timeout = timeout_s
        self._headers = auth_headers(token)
        self.attempts = attempts
        self._backoff = backoff or RetryPolicy(base_s=0.5, cap_s=8.0)
        self._rand = rand
        self.retries = 0  # transient failures retried, over the client's life

    async def score(self, task: str, prompt: str, response: str, metadata: dict[str, Any]) -> tuple[float, dict]:
        """The reward of one response. A transient failure (no answer, 429, 5xx) is retried up to `attempts` calls in
        all, with exponential backoff and full jitter; then, or at once for a refusal, `RemoteError` (the caller
        drops the sample and counts it: a sample never gets a default reward)."""
        body = {"task": task, "prompt": prompt, "response": response, "metadata": metadata}
        for attempt in range(1, self.attempts + 1):
            try:
                out = await post_json(self._client, f"{self.base_url}/score", body, self._timeout, self._headers)
                return float(out["reward"]), dict(out.get("details", {}))
            except RemoteError as err:
                if not err.transient or attempt == self.attempts:
                    raise
                self.retries += 1
                await asyncio.sleep(self._backoff.backoff(attempt, self._rand))
        raise AssertionError("unreachable: the last attempt returns or raises")
