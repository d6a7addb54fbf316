"""Role-server security: the shared bearer token and the request-size limit, as pure ASGI middleware.

The token of a run comes only from the environment variable `ASYNCRL_ROLE_TOKEN` (set by the embedded launcher,
which generates one per run, or on a cluster from the Kubernetes secret `asyncrl-role-token`); never from a
command-line argument, a config field or an S3 object, so it shows in no process list, MLflow param or pipeline
YAML. The reference environment server (`asyncrl.envs.remote`) uses its own variable `ASYNCRL_ENV_TOKEN`, so the
role token is never sent to a user-run environment server.

Invariants:
- `BearerAuthMiddleware` guards every HTTP route of the app it wraps (health and OpenAPI pages too): no
  `Authorization` header → 401, a header that is not `Bearer <the token>` → 403, both answered before the body is
  read; the comparison is constant-time (`hmac.compare_digest`); websocket connections are refused.
- `BodyLimitMiddleware` answers 413 to a request whose body is over `max_body_bytes`: at once when its
  `Content-Length` says so, else as soon as the streamed (chunked) bytes counted so far pass the limit; the app
  never sees such a request. A body within the limit is handed to the app unchanged.
- The token never appears in a log line or an error message.
"""

from __future__ import annotations

import hmac
import json
import logging
import os
import secrets
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

TOKEN_ENV = "ASYNCRL_ROLE_TOKEN"
ENV_SERVER_TOKEN_ENV = "ASYNCRL_ENV_TOKEN"
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 8 << 20  # 8 MiB: far above any real /generate or /score body

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class MissingTokenError(RuntimeError):
    """The role token is not set (or too short to be a generated one); the message names the variable."""


def new_token() -> str:
    """A fresh per-run token (32 random bytes, URL-safe base64: 43 characters)."""
    return secrets.token_urlsafe(32)


def role_token(environ: Mapping[str, str] | None = None, var: str = TOKEN_ENV) -> str | None:
    """The token in `var` (surrounding whitespace removed), or None when unset or empty."""
    value = (os.environ if environ is None else environ).get(var, "").strip()
    return value or None


def require_token(environ: Mapping[str, str] | None = None, var: str = TOKEN_ENV) -> str:
    """The token in `var`; `MissingTokenError` naming the variable when it is unset, empty or shorter than
    `MIN_TOKEN_CHARS` characters (the value itself is never put in the message)."""
    token = role_token(environ, var)
    if token is None:
        raise MissingTokenError(
            f"{var} is not set: role servers require the run's shared bearer token in the environment variable "
            f"{var} (the embedded launcher sets it; on a cluster it comes from the secret asyncrl-role-token)")
    if len(token) < MIN_TOKEN_CHARS:
        raise MissingTokenError(f"{var}: expected at least {MIN_TOKEN_CHARS} characters, got {len(token)}")
    return token


def auth_headers(token: str | None = None, var: str = TOKEN_ENV) -> dict[str, str]:
    """`{"Authorization": "Bearer <token>"}` for a client; `token` defaults to the one in `var`; {} when there
    is none (the server then answers 401, naming the variable)."""
    token = token if token is not None else role_token(var=var)
    return {"Authorization": f"Bearer {token}"} if token else {}


def check_authorization(header: str | None, token: str) -> int | None:
    """Pure: None when `header` is `Bearer <token>`; 401 when there is no header; 403 otherwise."""
    if header is None or not header.strip():
        return 401
    scheme, _, given = header.strip().partition(" ")
    if scheme.lower() != "bearer":
        return 403
    # compare bytes: compare_digest on str refuses non-ASCII, and a client may send anything
    return None if hmac.compare_digest(given.strip().encode(), token.encode()) else 403


async def _send_json(send: Send, status: int, detail: str, headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps({"detail": detail}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                            *(headers or [])]})
    await send({"type": "http.response.body", "body": body})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


class BearerAuthMiddleware:
    """ASGI middleware: every HTTP request must carry `Authorization: Bearer <token>` (see the module docstring).

    `var` only names the variable in the 401 message, so an operator knows where the token comes from.
    """

    def __init__(self, app: ASGIApp, token: str, var: str = TOKEN_ENV) -> None:
        if len(token) < MIN_TOKEN_CHARS:
            raise ValueError(f"token: expected at least {MIN_TOKEN_CHARS} characters, got {len(token)}")
        self.app, self._token, self._var = app, token, var

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "lifespan":
            await self.app(scope, receive, send)
            return
        if scope["type"] != "http":
            await send({"type": "websocket.close", "code": 1008})
            return
        status = check_authorization(_header(scope, b"authorization"), self._token)
        if status is None:
            await self.app(scope, receive, send)
            return
        log.warning("rejected %s %s: %s", scope.get("method"), scope.get("path"),
                    "no bearer token" if status == 401 else "wrong bearer token")
        if status == 401:
            await _send_json(send, 401, f"missing bearer token (Authorization: Bearer <value of {self._var}>)",
                             [(b"www-authenticate", b"Bearer")])
        else:
            await _send_json(send, 403, "wrong bearer token")


class BodyLimitMiddleware:
    """ASGI middleware: 413 for a body over `max_body_bytes` (Content-Length or counted chunks); the body within
    the limit is read here first and replayed to the app as one message (then `receive` passes through, so the
    app still sees a disconnect)."""

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes: expected >= 1, got {max_body_bytes}")
        self.app, self.max_body_bytes = app, int(max_body_bytes)

    async def _too_large(self, send: Send, what: str) -> None:
        await _send_json(send, 413, f"request body too large: {what}, the limit is {self.max_body_bytes} bytes")

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        length = _header(scope, b"content-length")
        if length is not None:
            try:
                declared = int(length)
            except ValueError:
                await _send_json(send, 400, f"content-length: expected an integer, got {length[:40]!r}")
                return
            if declared > self.max_body_bytes:
                await self._too_large(send, f"Content-Length {declared}")
                return
        chunks: list[bytes] = []
        size = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":  # disconnected: nothing to answer
                return
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.max_body_bytes:
                await self._too_large(send, f"more than {self.max_body_bytes} bytes streamed")
                return
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        replayed = False

        async def replay() -> Message:
            nonlocal replayed
            if not replayed:
                replayed = True
                return {"type": "http.request", "body": b"".join(chunks), "more_body": False}
            return await receive()

        await self.app(scope, replay, send)


def secure_app(app: ASGIApp, token: str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               var: str = TOKEN_ENV) -> None:
    """Wrap a FastAPI/Starlette `app` in place: the body limit, and (outermost) the bearer check when `token` is
    not None (None: no authentication, for tests and explicit `--insecure-no-token` only)."""
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes)  # type: ignore[attr-defined]
    if token is not None:
        app.add_middleware(BearerAuthMiddleware, token=token, var=var)  # type: ignore[attr-defined]
