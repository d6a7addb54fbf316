"""The episode endpoint: one HTTP server per environment role that speaks enough of the OpenAI API for the official
`openai` client, with one base URL per live episode.

An episode gets `http://<host>:<port>/episodes/<key>/v1` (`open_episode`), where `<key>` is a fresh random token:
knowing the URL is what lets a caller talk to that episode, so the URL is never logged. Routes under it:
`POST chat/completions`, `POST completions`, `GET models`. A request is checked (`asyncrl.agents.chat_request`) and
handed to the episode's `EpisodeSession`, which records it, waits for the scheduler and generates the turn. Errors
are OpenAI error bodies: 400 for a malformed or refused request, 404 for an unknown or ended episode, 409 for a
second request of an episode while its first is answered, 504 when the turn is not answered within its deadline,
502 when generation failed (the episode then ends as failed).

Invariant: at most one request of an episode is in flight; `close_episode` makes its URL answer 404 at once.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import secrets
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any, Protocol

import uvicorn
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from asyncrl.agents.chat_request import RequestError, error_body
from asyncrl.rpc.listen import bind_socket

log = logging.getLogger(__name__)
MAX_BODY_BYTES = 8 << 20


@dataclass(frozen=True)
class TurnReply:
    text: str
    finish_reason: str  # "stop" or "length"
    prompt_tokens: int
    completion_tokens: int


class EpisodeSession(Protocol):
    """What the endpoint hands a checked request to (the agent sample kind implements it)."""

    async def chat(self, body: Any) -> dict[str, Any]: ...

    async def completion(self, body: Any) -> dict[str, Any]: ...


class _Server(uvicorn.Server):
    """uvicorn without its own signal capture: the role owns SIGTERM/SIGINT."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


class EpisodeEndpoint:
    """The server and its live episodes (see the module docstring)."""

    def __init__(self, host: str = "127.0.0.1", request_timeout_s: float = 900.0) -> None:
        self.host = host
        self.request_timeout_s = request_timeout_s
        self.port = 0
        self.sessions: dict[str, EpisodeSession] = {}
        self.busy: set[str] = set()
        self.requests = self.errors = 0
        self._server: _Server | None = None
        self._task: asyncio.Task | None = None

    def app(self) -> Starlette:
        prefix = "/episodes/{key}/v1"
        return Starlette(routes=[
            Route(f"{prefix}/chat/completions", self._chat, methods=["POST"]),
            Route(f"{prefix}/completions", self._completion, methods=["POST"]),
            Route(f"{prefix}/models", self._models, methods=["GET"]),
        ])

    async def start(self) -> None:
        sock = bind_socket(self.host, 0)
        self.port = int(sock.getsockname()[1])
        config = uvicorn.Config(self.app(), log_level="warning", access_log=False, timeout_graceful_shutdown=2)
        self._server = _Server(config)
        self._task = asyncio.create_task(self._server.serve(sockets=[sock]))
        while not self._server.started:
            if self._task.done():
                self._task.result()  # raises what stopped it
                raise RuntimeError("episode endpoint: the server stopped before it started")
            await asyncio.sleep(0.02)
        log.info("episode endpoint listening on %s:%d", self.host, self.port)

    async def stop(self) -> None:
        if self._server is not None and self._task is not None:
            self._server.should_exit = True
            try:
                await asyncio.wait_for(self._task, 10)
            except TimeoutError:
                self._task.cancel()
        self._server = self._task = None

    def open_episode(self, session: EpisodeSession) -> str:
        """Register `session`; its base URL (holds the episode's key: never log it)."""
        key = secrets.token_urlsafe(18)
        self.sessions[key] = session
        return f"http://{self.host}:{self.port}/episodes/{key}/v1"

    def close_episode(self, base_url: str) -> None:
        key = base_url.rstrip("/").split("/")[-2]
        self.sessions.pop(key, None)

    # ---- routes --------------------------------------------------------------------------------------
    async def _chat(self, request: Request) -> JSONResponse:
        return await self._serve(request, "chat")

    async def _completion(self, request: Request) -> JSONResponse:
        return await self._serve(request, "completion")

    async def _models(self, request: Request) -> JSONResponse:
        if request.path_params["key"] not in self.sessions:
            return self._error(RequestError("episode: unknown or ended", status=404, kind="not_found_error"))
        return JSONResponse({"object": "list", "data": [{"id": "policy", "object": "model", "created": 0,
                                                         "owned_by": "asyncrl"}]})

    async def _serve(self, request: Request, route: str) -> JSONResponse:
        self.requests += 1
        key = request.path_params["key"]
        session = self.sessions.get(key)
        try:
            if session is None:
                raise RequestError("episode: unknown or ended (its agent returned, failed or ran out of time)",
                                   status=404, kind="not_found_error")
            raw = await request.body()
            if len(raw) > MAX_BODY_BYTES:
                raise RequestError(f"request body: larger than {MAX_BODY_BYTES} bytes", status=413)
            try:
                body = json.loads(raw)
            except (json.JSONDecodeError, UnicodeDecodeError) as err:
                raise RequestError(f"request body: not valid JSON ({err})") from err
            if key in self.busy:
                raise RequestError("episode: another request of this episode is being answered; send one at a "
                                   "time", status=409, kind="conflict_error")
            self.busy.add(key)
            try:
                call = session.chat if route == "chat" else session.completion
                answer = await asyncio.wait_for(call(body), self.request_timeout_s)
            except TimeoutError as err:
                raise RequestError(f"the turn was not answered within {self.request_timeout_s:.0f} s", status=504,
                                   kind="timeout_error") from err
            finally:
                self.busy.discard(key)
            return JSONResponse(answer)
        except RequestError as err:
            return self._error(err)

    def _error(self, err: RequestError) -> JSONResponse:
        self.errors += 1
        return JSONResponse(error_body(err), status_code=err.status)
