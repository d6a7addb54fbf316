"""JSON over HTTP between the roles: `RemoteError` (what every failed call becomes) and `post_json`.

Every call has a deadline; a transport error, a deadline or a non-200 answer becomes `RemoteError`, whose `lost`
flag says the server gave no answer at all (it may be gone) and whose `status` carries the HTTP status otherwise.
"""

from __future__ import annotations

from typing import Any

import httpx


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
