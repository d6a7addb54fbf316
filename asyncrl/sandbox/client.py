"""`RemoteSandbox`: run a program through the sandbox service (`asyncrl.sandbox.server`) instead of in this process's
own sandbox; same `SandboxResult`. Used by the tool-use environment when `sandbox_url` is set (on a cluster: the
sandbox pool's Service), so the environment role itself needs no user namespaces and runs no model code.

Every call has one deadline: the program's `timeout_s`, plus the server's wait for a free slot (`queue_s`), plus
`SLACK_S` for the transfer. The bearer token comes from `ASYNCRL_SANDBOX_TOKEN` unless given.
"""

from __future__ import annotations

from typing import Any

import httpx

from asyncrl.rpc.auth import SANDBOX_TOKEN_ENV, auth_headers
from asyncrl.sandbox.runner import SandboxResult

SLACK_S = 5.0


def check_sandbox_url(url: str) -> str:
    """`url` if it is an http(s) URL, else ValueError naming the `sandbox_url` field."""
    if not url.startswith(("http://", "https://")):
        raise ValueError(f"sandbox_url: expected an http:// or https:// URL, got {url!r}")
    return url


class SandboxServiceError(RuntimeError):
    """The sandbox service did not answer, or answered with an error or something that is not the protocol."""


class RemoteSandbox:
    def __init__(self, url: str, token: str | None = None, queue_s: float = 30.0,
                 client: httpx.AsyncClient | None = None) -> None:
        self.url, self.queue_s = check_sandbox_url(url).rstrip("/"), queue_s
        self._headers = auth_headers(token, var=SANDBOX_TOKEN_ENV)
        self._client = client or httpx.AsyncClient()

    async def run(self, code: str, timeout_s: float = 5.0) -> SandboxResult:
        try:
            r = await self._client.post(f"{self.url}/run", json={"code": code, "timeout_s": timeout_s},
                                        headers=self._headers, timeout=timeout_s + self.queue_s + SLACK_S)
        except httpx.HTTPError as e:
            raise SandboxServiceError(f"{self.url}/run: {type(e).__name__}: {e}") from e
        if r.status_code != 200:
            raise SandboxServiceError(f"{self.url}/run: HTTP {r.status_code}: {r.text[:500]}")
        try:
            doc: Any = r.json()
            exit_code = doc["exit_code"]
            return SandboxResult(str(doc["stdout"]), str(doc["stderr"]), None if exit_code is None else int(exit_code),
                                 bool(doc["timed_out"]), bool(doc["overflow"]), float(doc["seconds"]))
        except (ValueError, KeyError, TypeError) as e:
            raise SandboxServiceError(f"{self.url}/run: malformed answer: {type(e).__name__}: {e}") from e

    async def health(self) -> dict[str, Any]:
        try:
            r = await self._client.get(f"{self.url}/health", headers=self._headers, timeout=SLACK_S)
            r.raise_for_status()
            return dict(r.json())
        except (httpx.HTTPError, ValueError, TypeError) as e:
            raise SandboxServiceError(f"{self.url}/health: {type(e).__name__}: {e}") from e

    async def aclose(self) -> None:
        await self._client.aclose()
