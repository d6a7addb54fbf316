"""Environments served over HTTP: the reference server that serves any registered environment, and the adapter.

Protocol (JSON over HTTP, one session per episode):
- `POST /reset` {env, params, seed} → {session_id, observation, info}: creates the environment `env` with `params`
  and resets it;
- `POST /step` {session_id, action} → {observation, reward, terminated, truncated, info}; the session is closed
  when the episode ends;
- `POST /close` {session_id} → {}; `GET /health` → {sessions}.
Unknown environments, bad parameters, unknown sessions and steps after the end get a 4xx with a message naming the
problem: a body that is not the protocol (unknown fields, wrong types, a seed outside 64 bits) gets 422 naming the
field, parameters the environment refuses at creation or at reset get 400 naming the environment, and an
environment that raises on a step gets 500 naming the session (the session is closed; the server goes on).
Requests are bounded (`MAX_ACTION_CHARS`, bodies over `MAX_BODY_BYTES` get 413, a body not complete within
`--body-timeout-s` gets 408). `RemoteEnvironment` implements `Environment` against such a server with a deadline
on every call; users run heavy environments (browsers, containers) behind their own server
and point the adapter at it.

Authentication: `python -m asyncrl.envs.remote` requires a bearer token from `ASYNCRL_ENV_TOKEN` on every route
(401 without, 403 wrong; `--insecure-no-token` to serve without one); `RemoteEnvironment` sends
`Authorization: Bearer $ASYNCRL_ENV_TOKEN` when that variable is set. A variable of its own, not the run's
`ASYNCRL_ROLE_TOKEN`, so the role token never reaches a user-run environment server; never in the env config.
"""

from __future__ import annotations

import logging
import uuid
from typing import Any

import httpx
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from asyncrl.envs.base import EpisodeOver, StepResult, make
from asyncrl.rpc.auth import (
    DEFAULT_BODY_TIMEOUT_S,
    ENV_SERVER_TOKEN_ENV,
    MissingTokenError,
    auth_headers,
    require_token,
    secure_app,
)

MAX_ACTION_CHARS = 65_536
MAX_SESSIONS = 4096
MAX_BODY_BYTES = 1 << 20

log = logging.getLogger(__name__)


class _Body(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)


class ResetRequest(_Body):
    env: str = Field(min_length=1, max_length=128)
    params: dict[str, Any] = Field(default_factory=dict)
    seed: int = Field(ge=-(2**63), le=2**63 - 1)


class StepRequest(_Body):
    session_id: str = Field(min_length=1, max_length=64)
    action: str = Field(max_length=MAX_ACTION_CHARS)


class CloseRequest(_Body):
    session_id: str = Field(min_length=1, max_length=64)


def create_env_app(token: str | None = None, max_body_bytes: int = MAX_BODY_BYTES,
                   body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    """The reference environment server (in-process environments, one per session); every route requires `token`
    as a bearer token when it is given (None: open, for in-process tests); bodies are limited to `max_body_bytes`
    and must arrive within `body_timeout_s`."""
    app = FastAPI(title="asyncrl environment server")
    secure_app(app, token, max_body_bytes, var=ENV_SERVER_TOKEN_ENV, body_timeout_s=body_timeout_s)
    sessions: dict[str, Any] = {}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {"sessions": len(sessions)}

    @app.post("/reset")
    async def reset(req: ResetRequest) -> dict[str, Any]:
        if len(sessions) >= MAX_SESSIONS:
            raise HTTPException(503, f"too many open sessions ({MAX_SESSIONS}); close finished ones")
        try:
            env = make(req.env, **req.params)
        except ValueError as e:
            raise HTTPException(400, str(e)) from e
        try:
            observation, info = await env.reset(req.seed)
        except Exception as e:  # parameters the constructor let through but the episode cannot use
            log.warning("reset of %r failed: %s: %s", req.env, type(e).__name__, e)
            raise HTTPException(400, f"environment {req.env!r}: reset with params {sorted(req.params)} and seed "
                                     f"{req.seed} failed: {type(e).__name__}: {str(e)[:300]}") from e
        sid = uuid.uuid4().hex
        sessions[sid] = env
        return {"session_id": sid, "observation": observation, "info": info}

    @app.post("/step")
    async def step(req: StepRequest) -> dict[str, Any]:
        env = sessions.get(req.session_id)
        if env is None:
            raise HTTPException(404, f"session_id: unknown or finished session {req.session_id!r}")
        try:
            r = await env.step(req.action)
        except EpisodeOver as e:
            sessions.pop(req.session_id, None)
            raise HTTPException(409, str(e)) from e
        except Exception as e:  # the environment's own failure, not the request's: the session is closed
            sessions.pop(req.session_id, None)
            log.warning("step of session %s failed: %s: %s", req.session_id, type(e).__name__, e)
            raise HTTPException(500, f"session_id {req.session_id!r}: the environment failed on this step "
                                     f"({type(e).__name__}: {str(e)[:300]}); the session is closed") from e
        if r.done:
            sessions.pop(req.session_id, None)
        return {"observation": r.observation, "reward": r.reward, "terminated": r.terminated,
                "truncated": r.truncated, "info": r.info}

    @app.post("/close")
    async def close(req: CloseRequest) -> dict[str, Any]:
        sessions.pop(req.session_id, None)
        return {}

    return app


class RemoteError(RuntimeError):
    """The environment server answered with an error or something that is not the protocol."""


class RemoteEnvironment:
    """`Environment` backed by a server speaking the protocol above; every call has a deadline (`timeout_s`).
    Calls carry `Authorization: Bearer <token>`, the token defaulting to `ASYNCRL_ENV_TOKEN` (none when unset)."""

    def __init__(self, url: str, env: str, params: dict[str, Any] | None = None, timeout_s: float = 30.0,
                 client: httpx.AsyncClient | None = None, token: str | None = None) -> None:
        self.url, self.env, self.params, self.timeout_s = url.rstrip("/"), env, dict(params or {}), timeout_s
        self._headers = auth_headers(token, var=ENV_SERVER_TOKEN_ENV)
        self._client = client or httpx.AsyncClient(timeout=timeout_s)
        self._own_client = client is None
        self.session_id: str | None = None

    async def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        try:
            r = await self._client.post(f"{self.url}{path}", json=body, headers=self._headers,
                                        timeout=self.timeout_s)
        except httpx.HTTPError as e:
            raise RemoteError(f"{self.url}{path}: {type(e).__name__}: {e}") from e
        if r.status_code == 409:
            raise EpisodeOver(f"{self.url}{path}: {r.text[:500]}")
        if r.status_code != 200:
            raise RemoteError(f"{self.url}{path}: HTTP {r.status_code}: {r.text[:500]}")
        try:
            doc = r.json()
        except ValueError as e:
            raise RemoteError(f"{self.url}{path}: the answer is not JSON") from e
        if not isinstance(doc, dict):
            raise RemoteError(f"{self.url}{path}: expected a JSON object, got {type(doc).__name__}")
        return doc

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        doc = await self._post("/reset", {"env": self.env, "params": self.params, "seed": seed})
        try:
            self.session_id = str(doc["session_id"])
            return str(doc["observation"]), dict(doc.get("info") or {})
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteError(f"{self.url}/reset: malformed answer: {e}") from e

    async def step(self, action_text: str) -> StepResult:
        if self.session_id is None:
            raise EpisodeOver("remote environment: step before reset")
        doc = await self._post("/step", {"session_id": self.session_id, "action": action_text})
        try:
            result = StepResult(str(doc["observation"]), float(doc["reward"]), bool(doc["terminated"]),
                                bool(doc["truncated"]), dict(doc.get("info") or {}))
        except (KeyError, TypeError, ValueError) as e:
            raise RemoteError(f"{self.url}/step: malformed answer: {e}") from e
        if result.done:
            self.session_id = None
        return result

    async def aclose(self) -> None:
        if self.session_id is not None:
            try:
                await self._post("/close", {"session_id": self.session_id})
            finally:
                self.session_id = None
        if self._own_client:
            await self._client.aclose()


def main(argv: list[str] | None = None) -> None:
    """Serve every registered environment: `ASYNCRL_ENV_TOKEN=... python -m asyncrl.envs.remote --host 0.0.0.0
    --port 8000`."""
    import argparse

    import uvicorn

    parser = argparse.ArgumentParser(description="The reference environment server (asyncrl.envs.remote).")
    parser.add_argument("--host", default="127.0.0.1", help="Bind address (default loopback only).")
    parser.add_argument("--port", type=int, default=8000)
    parser.add_argument("--insecure-no-token", action="store_true",
                        help=f"serve without a bearer token (otherwise {ENV_SERVER_TOKEN_ENV} must be set)")
    parser.add_argument("--body-timeout-s", type=float, default=DEFAULT_BODY_TIMEOUT_S,
                        help="a request body must arrive in full within this many seconds (else 408)")
    args = parser.parse_args(argv)
    token: str | None = None
    if not args.insecure_no_token:
        try:
            token = require_token(var=ENV_SERVER_TOKEN_ENV)
        except MissingTokenError as e:
            raise SystemExit(f"asyncrl.envs.remote: {e} (or pass --insecure-no-token)") from None
    uvicorn.run(create_env_app(token, body_timeout_s=args.body_timeout_s), host=args.host, port=args.port, log_level="warning")


if __name__ == "__main__":
    main()
