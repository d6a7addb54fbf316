"""The reward role: `POST /score` (one response) and `POST /score_batch` (many) scored with the task's verifier
(`task.verifier`: exact match or the math verifier) or the run's own reward function (`task.reward`), as
`asyncrl.rewards.custom.scorer_for` picks.

`/score` {task, prompt, response, metadata} → {reward, details}, or 422 for a refusal. `/score_batch`
{items: [score request, ...]} → {results: [...]}, one result per item in order, each {reward, details} or
{error: {status, detail}}: an item's refusal (no string `metadata.answer`, a task other than the run's `task.name`)
is that item's result and never fails the others; a body that does not validate as a whole is 422 naming the field
(`items.3.task`). The contract and its limits are in `asyncrl.rewards.api` (docs/reward_api.md).

Stateless; any number of instances may run. `GET /health` answers liveness and the counters. Every route needs
`Authorization: Bearer $ASYNCRL_ROLE_TOKEN` (401 without, 403 wrong) and bodies over `MAX_BODY_BYTES` get 413
(`asyncrl.rpc.auth`); the role exits at once, naming the variable, when the token is not set. It beats a heartbeat
carrying its counters and exits by itself when the run is done or the trainer failed or is gone
(`asyncrl.roles.liveness`).

Invariants:
- `scored` and `rejected` count items, whichever route they came by: each scored item adds one to `scored`, each
  refused one to `rejected` (an item whose scoring raised unexpectedly adds to neither: /score answers 500, a batch
  gives that item the per-item status 500);
- a batch's answer has exactly as many results as it has items, in the same order.

On SIGTERM/SIGINT it stops serving and records the stop (`asyncrl.roles.stop_signal`).

Run: `python -m asyncrl.roles.reward --run-url s3://bucket/prefix/run_id --id 0`.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import uvicorn
from fastapi import FastAPI, HTTPException

from asyncrl.rewards.api import (
    ITEM_STATUS_FAILED,
    ITEM_STATUS_JUDGE_FAILED,
    ITEM_STATUS_REFUSED,
    MAX_BATCH_ITEMS,
    MAX_BODY_BYTES,
    MAX_TEXT_CHARS,
    ItemError,
    ScoreBatchRequest,
    ScoreBatchResponse,
    ScoreItemFailure,
    ScoreRequest,
    ScoreResponse,
)
from asyncrl.rewards.custom import Scorer, builtin_scorer, scorer_for
from asyncrl.rewards.judge import JudgeError
from asyncrl.roles.context import (
    RoleContext,
    advertised,
    numeric_metrics,
    role_arg_parser,
    setup_logging,
    watched,
)
from asyncrl.roles.judge_scorer import run_scorer
from asyncrl.roles.liveness import Heartbeat, RunOver
from asyncrl.roles.stop_signal import StopSignal
from asyncrl.rpc.auth import DEFAULT_BODY_TIMEOUT_S, MissingTokenError, require_token, secure_app
from asyncrl.rpc.listen import bind_socket

log = logging.getLogger(__name__)

__all__ = ["MAX_BATCH_ITEMS", "MAX_BODY_BYTES", "MAX_TEXT_CHARS", "ScoreRequest", "ScoreResponse", "create_app",
           "main", "serve", "serve_app"]


class Refused(Exception):
    """The item is well-formed but cannot be scored; `detail` names the field (never echoes the input)."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def score_item(req: ScoreRequest, scorer: Scorer = builtin_scorer) -> tuple[float, dict[str, Any]]:
    """The reward and details of one request by `scorer` (`scorer_for` the run's task); `Refused` when it has no
    string `metadata.answer` or the scorer refuses its task (ValueError). Any other exception is a verifier (or
    reward function) bug and propagates."""
    answer = req.metadata.get("answer")
    if not isinstance(answer, str):
        raise Refused("metadata.answer: expected the reference answer as a string")
    try:
        return scorer(req.task, req.prompt, req.response, answer)
    except ValueError as err:
        raise Refused(f"task: {err}") from None


def create_app(stats: dict[str, int] | None = None, *, token: str | None,
               max_body_bytes: int = MAX_BODY_BYTES, body_timeout_s: float = DEFAULT_BODY_TIMEOUT_S,
               scorer: Scorer = builtin_scorer, concurrency: int = 1) -> FastAPI:
    """The reward API; `stats` (updated in place: `scored`, `rejected`, counted per item) is the role's heartbeat
    figures. Every route requires `token` as a bearer token (None: no check, tests only); bodies are limited to
    `max_body_bytes` and must arrive within `body_timeout_s` (408). A body that is not a score request (or, for
    `/score_batch`, a list of 1..MAX_BATCH_ITEMS of them) gets 422 naming the field, without echoing the input.
    With `concurrency` > 1 (a judge), a batch's items are scored that many at once; a `JudgeError` is the item's
    failure with status 502."""
    app = FastAPI(title="asyncrl reward")
    secure_app(app, token, max_body_bytes, body_timeout_s=body_timeout_s)
    stats = stats if stats is not None else {}
    stats.setdefault("scored", 0)
    stats.setdefault("rejected", 0)

    lock = threading.Lock()  # the handlers run on the server's thread pool
    pool = ThreadPoolExecutor(max_workers=concurrency, thread_name_prefix="score") if concurrency > 1 else None

    def count(scored: int, rejected: int) -> None:
        with lock:
            stats["scored"] += scored
            stats["rejected"] += rejected

    @app.post("/score", response_model=ScoreResponse)
    def post_score(req: ScoreRequest) -> ScoreResponse:
        try:
            reward, details = score_item(req, scorer)
        except Refused as refused:
            count(0, 1)
            raise HTTPException(ITEM_STATUS_REFUSED, refused.detail) from None
        except JudgeError as err:
            raise HTTPException(ITEM_STATUS_JUDGE_FAILED, str(err)) from None
        count(1, 0)
        return ScoreResponse(reward=reward, details=details)

    def one(indexed: tuple[int, ScoreRequest]) -> ScoreResponse | ScoreItemFailure:
        index, item = indexed
        try:
            reward, details = score_item(item, scorer)
        except Refused as refused:
            return ScoreItemFailure(error=ItemError(status=ITEM_STATUS_REFUSED, detail=refused.detail))
        except JudgeError as err:
            return ScoreItemFailure(error=ItemError(status=ITEM_STATUS_JUDGE_FAILED, detail=str(err)[:500]))
        except Exception as err:  # a verifier bug: this item fails, the others still get their scores
            log.exception("score_batch: item %d (task %.128r) raised", index, item.task)
            return ScoreItemFailure(error=ItemError(
                status=ITEM_STATUS_FAILED, detail=f"internal error while scoring: {type(err).__name__}"))
        return ScoreResponse(reward=reward, details=details)

    @app.post("/score_batch", response_model=ScoreBatchResponse)
    def post_score_batch(req: ScoreBatchRequest) -> ScoreBatchResponse:
        items = list(enumerate(req.items))
        results = list(pool.map(one, items) if pool is not None and len(items) > 1 else map(one, items))
        scored = sum(isinstance(r, ScoreResponse) for r in results)
        rejected = sum(isinstance(r, ScoreItemFailure) and r.error.status == ITEM_STATUS_REFUSED for r in results)
        count(scored, rejected)
        return ScoreBatchResponse(results=results)

    @app.get("/health")
    def health() -> dict[str, Any]:
        return {"status": "ok", **stats}

    return app


class _ServerWithoutSignals(uvicorn.Server):
    """uvicorn server that leaves SIGTERM/SIGINT to the role (uvicorn's own capture re-raises the signal once
    `serve()` returns, which would kill the process before it records its stop)."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def serve_app(app: FastAPI, sock: socket.socket, on_ready: Callable[[str, int], None],
                    stop: asyncio.Event | None = None, signals: StopSignal | None = None) -> None:
    """Serve until SIGTERM/SIGINT or `stop` is set; call `on_ready(host, port)` once listening. The signals are
    uvicorn's, or with `signals` the role's (they set `stop`, see `asyncrl.roles.stop_signal`)."""
    config = uvicorn.Config(app, log_level="warning", access_log=False)
    if signals is not None:
        stop = stop or asyncio.Event()
        signals.on_loop(asyncio.get_running_loop(), stop)
    server = uvicorn.Server(config) if signals is None else _ServerWithoutSignals(config)
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
                heartbeat: Heartbeat, token: str, signals: StopSignal) -> RunOver | None:
    """Serve until SIGTERM/SIGINT (noted in `signals`) or the end of the run; returns why the run ended it (None:
    stopped by a signal)."""
    stats: dict[str, int] = {}

    def ready(host: str, port: int) -> None:
        ctx.publish({"host": advertise or host, "port": port})

    scorer, concurrency, extra = run_scorer(ctx) if ctx.cfg.task.judge is not None else \
        (scorer_for(ctx.cfg.task), 1, dict)
    async with watched(ctx, on_done, heartbeat, lambda: {**numeric_metrics(stats), **extra()}) as (stop, over):
        app = create_app(stats, token=token, body_timeout_s=ctx.cfg.timeouts.http_s, scorer=scorer,
                         concurrency=concurrency)
        await serve_app(app, sock, ready, stop, signals)
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
    signals = StopSignal()
    code = 0
    with ctx.heartbeat() as heartbeat:
        over = asyncio.run(serve(ctx, sock, advertised(args, ""), args.on_done, heartbeat, token, signals))
        if signals.signum is not None:
            code = signals.finish(ctx.store, ctx.paths, "reward", args.id, heartbeat.stop)
    if code:
        raise SystemExit(code)
    if over is not None and over.exit_code:
        raise SystemExit(f"reward[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
