"""The reward role: `POST /score` {task, prompt, response, metadata} → {reward, details} with the task's verifier.

Stateless; any number of instances may run. `GET /health` answers liveness. Every route needs
`Authorization: Bearer $ASYNCRL_ROLE_TOKEN` (401 without, 403 wrong) and bodies over `MAX_BODY_BYTES` get 413
(`asyncrl.transport.auth`); the role exits at once, naming the variable, when the token is not set. It beats a heartbeat carrying its
counters and exits by itself when the run is done or the trainer failed or is gone (`asyncrl.roles.liveness`).
Run: `python -m asyncrl.roles.reward --run-url s3://bucket/prefix/run_id --id 0`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
from collections.abc import Callable
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from asyncrl.rewards.verifier import score
from asyncrl.roles.context import (
    RoleContext,
    advertised,
    numeric_metrics,
    role_arg_parser,
    setup_logging,
    watched,
)
from asyncrl.roles.liveness import Heartbeat, RunOver
from asyncrl.transport.auth import DEFAULT_BODY_TIMEOUT_S, MissingTokenError, require_token, secure_app
from asyncrl.transport.listen import bind_socket

log = logging.getLogger(__name__)

MAX_BODY_BYTES = 8 << 20
MAX_TEXT_CHARS = 1 << 20  # prompt or response; the body limit bounds the metadata


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    task: str = Field(min_length=1, max_length=128)
    prompt: str = Field(max_length=MAX_TEXT_CHARS)
    response: str = Field(max_length=MAX_TEXT_CHARS)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreResponse(BaseModel):
    reward: float
    details: dict[str, Any]


def create_app(stats: dict[str, int] | None = None, *, token: str | None,
               max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S) -> FastAPI:
    """The reward API; `stats` (updated in place: `scored`, `rejected`) is the role's heartbeat figures. Every
    route requires `token` as a bearer token (None: no check, tests only); bodies are limited to `max_body_bytes`
    and must arrive within `body_timeout_s` (408). A body that is not a score request gets 422 naming the field."""
    app = FastAPI(title="asyncrl reward")
    secure_app(app, token, max_body_bytes, body_timeout_s=body_timeout_s)
    stats = stats if stats is not None else {}
    stats.setdefault("scored", 0)
    stats.setdefault("rejected", 0)

    @app.post("/score", response_model=ScoreResponse)
    def post_score(req: ScoreRequest) -> ScoreResponse:
        answer = req.metadata.get("answer")
        if not isinstance(answer, str):
            stats["rejected"] += 1
            raise HTTPException(422, "metadata.answer: expected the reference answer as a string")
        try:
            reward, details = score(req.task, req.response, answer)
        except ValueError as err:
            stats["rejected"] += 1
            raise HTTPException(422, f"task: {err}") from None
        stats["scored"] += 1
        return ScoreResponse(reward=reward, details=details)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **stats}

    return app


async def serve_app(app: FastAPI, sock: socket.socket, on_ready: Callable[[str, int], None],
                    stop: asyncio.Event | None = None) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's handlers) or `stop` is set; call `on_ready(host, port)` once
    listening."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started:
        host, port = sock.getsockname()[:2]
        on_ready(host, port)
    stopping = asyncio.create_task((stop or asyncio.Event()).wait())
    await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
    server.should_exit = True
    stopping.cancel()
    await serving


async def serve(ctx: RoleContext, sock: socket.socket, advertise: str, on_done: str,
                heartbeat: Heartbeat, token: str) -> RunOver | None:
    """Serve until SIGTERM/SIGINT or the end of the run; returns why the run ended it (None: stopped)."""
    stats: dict[str, int] = {}

    def ready(host: str, port: int) -> None:
        ctx.publish({"host": advertise or host, "port": port})

    async with watched(ctx, on_done, heartbeat, lambda: numeric_metrics(stats)) as (stop, over):
        app = create_app(stats, token=token, body_timeout_s=ctx.cfg.timeouts.http_s)
        await serve_app(app, sock, ready, stop)
    return over[0] if over else None


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("reward").parse_args(argv)
    setup_logging(args.log_level, "reward", args.id)
    try:
        token = require_token()
    except MissingTokenError as e:
        raise SystemExit(f"reward[{args.id}]: {e}") from None
    ctx = RoleContext.from_args("reward", args)
    sock = bind_socket(args.host, 0)
    with ctx.heartbeat() as heartbeat:
        over = asyncio.run(serve(ctx, sock, advertised(args, ""), args.on_done, heartbeat, token))
    if over is not None and over.exit_code:
        raise SystemExit(f"reward[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
