"""The role-server bearer token and body limit (asyncrl.rpc.auth) on small FastAPI apps, in process over
httpx's ASGI transport; and the same wiring on the real reward and environment-server apps."""

from __future__ import annotations

import asyncio
import logging
from collections.abc import AsyncIterator

import httpx
import pytest
from fastapi import FastAPI, Request

from asyncrl.envs.remote import create_env_app
from asyncrl.roles.reward import create_app as reward_app
from asyncrl.rpc.auth import (
    TOKEN_ENV,
    MissingTokenError,
    auth_headers,
    check_authorization,
    require_token,
    secure_app,
)

TOKEN = "t" * 20 + "-good"
LIMIT = 1000


def _app() -> FastAPI:
    app = FastAPI()
    secure_app(app, TOKEN, max_body_bytes=LIMIT)

    @app.get("/health")
    async def health() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/echo")
    async def echo(request: Request) -> dict[str, int]:
        return {"bytes": len(await request.body())}

    return app


def _call(app: FastAPI, method: str, path: str, **kw: object) -> httpx.Response:
    async def run() -> httpx.Response:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return await c.request(method, path, **kw)  # type: ignore[arg-type]

    return asyncio.run(run())


def test_check_authorization_is_pure() -> None:
    assert check_authorization(None, TOKEN) == 401
    assert check_authorization("  ", TOKEN) == 401
    assert check_authorization(f"Bearer {TOKEN}", TOKEN) is None
    assert check_authorization(f"bearer {TOKEN}", TOKEN) is None  # the scheme is case-insensitive
    assert check_authorization(f"Basic {TOKEN}", TOKEN) == 403
    assert check_authorization(f"Bearer {TOKEN}x", TOKEN) == 403
    assert check_authorization("Bearer é", TOKEN) == 403  # non-ASCII does not raise


def test_missing_token_is_401_wrong_is_403_right_is_200() -> None:
    app = _app()
    r = _call(app, "GET", "/health")
    assert r.status_code == 401 and TOKEN_ENV in r.json()["detail"] and r.headers["www-authenticate"] == "Bearer"
    assert _call(app, "GET", "/health", headers={"Authorization": "Bearer wrong"}).status_code == 403
    assert _call(app, "GET", "/health", headers={"Authorization": TOKEN}).status_code == 403  # no scheme
    ok = _call(app, "GET", "/health", headers=auth_headers(TOKEN))
    assert ok.status_code == 200 and ok.json() == {"status": "ok"}
    # every route, the generated ones and unknown paths too: nothing is reachable without the token
    for path in ("/docs", "/openapi.json", "/nope"):
        assert _call(app, "GET", path).status_code == 401, path
    assert _call(app, "POST", "/echo", content=b"x").status_code == 401


def test_the_token_is_never_logged(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = "Bearer " + "w" * 30
    r = _call(_app(), "GET", "/health", headers={"Authorization": wrong})
    assert r.status_code == 403 and "w" * 30 not in r.text
    assert "wrong bearer token" in caplog.text
    assert TOKEN not in caplog.text and "w" * 30 not in caplog.text


def test_body_limit_413_by_content_length_and_by_counted_chunks() -> None:
    app, h = _app(), auth_headers(TOKEN)
    assert _call(app, "POST", "/echo", headers=h, content=b"x" * LIMIT).json() == {"bytes": LIMIT}
    r = _call(app, "POST", "/echo", headers=h, content=b"x" * (LIMIT + 1))
    assert r.status_code == 413 and "Content-Length 1001" in r.json()["detail"]

    async def chunks(n: int) -> AsyncIterator[bytes]:
        for _ in range(n):
            yield b"y" * 300

    # an async iterator is sent chunked: no Content-Length, so the middleware counts the streamed bytes
    r = _call(app, "POST", "/echo", headers=h, content=chunks(4))
    assert r.request.headers.get("transfer-encoding") == "chunked" and "content-length" not in r.request.headers
    assert r.status_code == 413 and "streamed" in r.json()["detail"]
    assert _call(app, "POST", "/echo", headers=h, content=chunks(3)).json() == {"bytes": 900}
    bad = _call(app, "POST", "/echo", headers={**h, "Content-Length": "many"}, content=b"")
    assert bad.status_code == 400 and "content-length" in bad.json()["detail"]


def test_require_token_names_the_variable() -> None:
    with pytest.raises(MissingTokenError, match=TOKEN_ENV):
        require_token({})
    with pytest.raises(MissingTokenError, match=TOKEN_ENV):
        require_token({TOKEN_ENV: "   "})
    with pytest.raises(MissingTokenError, match="at least 16 characters, got 5"):
        require_token({TOKEN_ENV: "short"})
    assert require_token({TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    assert auth_headers(TOKEN) == {"Authorization": f"Bearer {TOKEN}"}


def test_auth_headers_default_to_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(TOKEN_ENV, raising=False)
    assert auth_headers() == {}
    monkeypatch.setenv(TOKEN_ENV, TOKEN)
    assert auth_headers() == {"Authorization": f"Bearer {TOKEN}"}


def test_reward_app_requires_the_token_on_score_and_health() -> None:
    app = reward_app(token=TOKEN)
    body = {"task": "arithmetic", "prompt": "1+1=", "response": "2", "metadata": {"answer": "2"}}
    assert _call(app, "POST", "/score", json=body).status_code == 401
    assert _call(app, "GET", "/health", headers={"Authorization": "Bearer nope"}).status_code == 403
    r = _call(app, "POST", "/score", json=body, headers=auth_headers(TOKEN))
    assert r.status_code == 200 and r.json()["reward"] == 1.0
    big = {**body, "response": "9" * (9 << 20)}
    assert _call(app, "POST", "/score", json=big, headers=auth_headers(TOKEN)).status_code == 413


def test_environment_server_token_is_optional_and_its_own() -> None:
    open_app = create_env_app()
    assert _call(open_app, "GET", "/health").json() == {"sessions": 0}
    app = create_env_app(TOKEN)
    r = _call(app, "GET", "/health")
    assert r.status_code == 401 and "ASYNCRL_ENV_TOKEN" in r.json()["detail"]
    assert _call(app, "GET", "/health", headers=auth_headers(TOKEN)).status_code == 200
    assert _call(app, "POST", "/step", headers=auth_headers(TOKEN), content=b"x" * (2 << 20)).status_code == 413


class _IdleEngine:
    """Only what the guarded routes below reach: the HTTP layer is under test, not vLLM."""

    def health(self) -> dict[str, str]:
        return {"status": "ok"}


def test_generation_app_guards_every_route_and_limits_prompts() -> None:
    from asyncrl.generation.bodies import MAX_PROMPT_TOKENS
    from asyncrl.generation.server import create_app

    app = create_app(_IdleEngine(), TOKEN)  # type: ignore[arg-type]
    for method, path in (("GET", "/health"), ("POST", "/generate"), ("POST", "/abort"), ("POST", "/weights/init"),
                         ("POST", "/weights/update"), ("GET", "/weights/checksum")):
        assert _call(app, method, path, json={}).status_code == 401, path
        assert _call(app, method, path, json={}, headers={"Authorization": "Bearer x"}).status_code == 403, path
    assert _call(app, "GET", "/health", headers=auth_headers(TOKEN)).json() == {"status": "ok"}
    too_many = {"request_id": "r", "prompt_token_ids": [1] * (MAX_PROMPT_TOKENS + 1), "max_tokens": 1}
    r = _call(app, "POST", "/generate", json=too_many, headers=auth_headers(TOKEN))
    assert r.status_code == 422 and r.json()["detail"][0]["loc"] == ["body", "prompt_token_ids"]
    # within the list limit, over the 8 MiB body limit: 1 Mi ids of 8 digits and a comma each
    huge = {"request_id": "r", "prompt_token_ids": [12345678] * MAX_PROMPT_TOKENS, "max_tokens": 1}
    assert _call(app, "POST", "/generate", json=huge, headers=auth_headers(TOKEN)).status_code == 413
