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
- `BodyLimitMiddleware` also bounds the wait for the body: a client that sends part of a body and stalls gets 408
  once `body_timeout_s` has passed since the request started, so a stalled upload never holds a handler.
- A request body that fails validation gets 422 with `detail` = a list of {loc, msg, type} naming each field; the
  offending input is never echoed back (an echo of NaN, a huge or a deeply nested value could itself fail to render
  and turn a client error into a 500).
- The token never appears in a log line or an error message.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import math
import os
import secrets
import time
from collections.abc import Awaitable, Callable, Mapping, MutableMapping
from typing import Any

log = logging.getLogger(__name__)

TOKEN_ENV = "ASYNCRL_ROLE_TOKEN"
ENV_SERVER_TOKEN_ENV = "ASYNCRL_ENV_TOKEN"
SANDBOX_TOKEN_ENV = "ASYNCRL_SANDBOX_TOKEN"  # the tool sandbox service's own token (asyncrl.sandbox.server)
MIN_TOKEN_CHARS = 16
DEFAULT_MAX_BODY_BYTES = 8 << 20  # 8 MiB: far above any real /generate or /score body
DEFAULT_BODY_TIMEOUT_S = 60.0  # the whole body of a request must arrive within this (timeouts.http_s by default)
MAX_ERROR_MSG_CHARS = 500
MAX_ERRORS = 20

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

    def __init__(self, app: ASGIApp, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
                 body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
        if max_body_bytes < 1:
            raise ValueError(f"max_body_bytes: expected >= 1, got {max_body_bytes}")
        if not (math.isfinite(body_timeout_s) and body_timeout_s > 0):
            raise ValueError(f"body_timeout_s: expected a finite number > 0, got {body_timeout_s}")
        self.app, self.max_body_bytes, self.body_timeout_s = app, int(max_body_bytes), float(body_timeout_s)

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
        deadline = time.monotonic() + self.body_timeout_s
        while True:
            try:
                message = await asyncio.wait_for(receive(), timeout=max(0.0, deadline - time.monotonic()))
            except TimeoutError:
                log.warning("%s %s: body not complete after %.0f s (%d bytes received)", scope.get("method"),
                            scope.get("path"), self.body_timeout_s, size)
                await _send_json(send, 408, f"request body not received in full within {self.body_timeout_s:g} s "
                                 f"({size} bytes arrived)")
                return
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


def _loc(loc: Any) -> list[str | int]:
    return [p if isinstance(p, int) else str(p)[:100] for p in (loc if isinstance(loc, (list, tuple)) else [loc])]


def validation_details(errors: Any) -> list[dict[str, Any]]:
    """Pure: pydantic/FastAPI validation errors as JSON-safe {loc, msg, type} (no input echoed, messages and the
    number of errors bounded)."""
    out: list[dict[str, Any]] = []
    for e in list(errors)[:MAX_ERRORS]:
        e = e if isinstance(e, dict) else {"msg": str(e)}
        msg = str(e.get("msg", "invalid value")).removeprefix("Value error, ")
        ctx = e.get("ctx") or {}
        if e.get("type") == "json_invalid" and "error" in ctx:
            msg = f"invalid JSON: {ctx['error']}"
        out.append({"loc": _loc(e.get("loc", ())), "msg": msg[:MAX_ERROR_MSG_CHARS], "type": str(e.get("type", ""))})
    return out


async def _validation_error(request: Any, exc: Exception) -> Any:
    from fastapi.responses import JSONResponse

    errors = exc.errors() if hasattr(exc, "errors") else [{"msg": str(exc)}]
    return JSONResponse(status_code=422, content={"detail": validation_details(errors)})


def secure_app(app: ASGIApp, token: str | None, max_body_bytes: int = DEFAULT_MAX_BODY_BYTES,
               var: str = TOKEN_ENV, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> None:
    """Wrap a FastAPI/Starlette `app` in place: the body limit and body deadline, (outermost) the bearer check when
    `token` is not None (None: no authentication, for tests and explicit `--insecure-no-token` only), and 422
    answers that name the fields without echoing the input."""
    from fastapi.exceptions import RequestValidationError

    app.add_exception_handler(RequestValidationError, _validation_error)  # type: ignore[attr-defined]
    app.add_middleware(BodyLimitMiddleware, max_body_bytes=max_body_bytes,  # type: ignore[attr-defined]
                       body_timeout_s=body_timeout_s)
    if token is not None:
        app.add_middleware(BearerAuthMiddleware, token=token, var=var)  # type: ignore[attr-defined]
