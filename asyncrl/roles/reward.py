"""The reward role: `POST /score` {task, prompt, response, metadata} → {reward, details} with the task's verifier.

Stateless; any number of instances may run. `GET /health` answers liveness.
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
from asyncrl.roles.context import RoleContext, advertised, role_arg_parser, setup_logging
from asyncrl.transport.listen import bind_socket

log = logging.getLogger(__name__)


class ScoreRequest(BaseModel):
    model_config = ConfigDict(extra="forbid")
    task: str = Field(min_length=1)
    prompt: str
    response: str
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreResponse(BaseModel):
    reward: float
    details: dict[str, Any]


def create_app() -> FastAPI:
    app = FastAPI(title="asyncrl reward")
    stats = {"scored": 0}

    @app.post("/score", response_model=ScoreResponse)
    def post_score(req: ScoreRequest) -> ScoreResponse:
        answer = req.metadata.get("answer")
        if not isinstance(answer, str):
            raise HTTPException(422, "metadata.answer: expected the reference answer as a string")
        try:
            reward, details = score(req.task, req.response, answer)
        except ValueError as err:
            raise HTTPException(422, f"task: {err}") from None
        stats["scored"] += 1
        return ScoreResponse(reward=reward, details=details)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **stats}

    return app


async def serve_app(app: FastAPI, sock: socket.socket, on_ready: Callable[[str, int], None]) -> None:
    """Serve until SIGTERM/SIGINT (uvicorn's handlers); call `on_ready(host, port)` once listening."""
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", access_log=False))
    serving = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not serving.done():
        await asyncio.sleep(0.05)
    if server.started:
        host, port = sock.getsockname()[:2]
        on_ready(host, port)
    await serving


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("reward").parse_args(argv)
    setup_logging(args.log_level, "reward", args.id)
    ctx = RoleContext.from_args("reward", args)
    sock = bind_socket(args.host, 0)

    def ready(host: str, port: int) -> None:
        ctx.publish({"host": advertised(args, host), "port": port})

    asyncio.run(serve_app(create_app(), sock, ready))


if __name__ == "__main__":
    main()
