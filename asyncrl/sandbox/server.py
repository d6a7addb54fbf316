"""The tool sandbox as a service: `POST /run` runs one program in a fresh sandbox (`run_python`) and answers its
capped output. On a cluster the environment roles call a pool of these (`manifests/sandbox/`): the pods that run
model-written code hold no credential of the run, may not open any connection out (a deny-egress NetworkPolicy),
and are the only pods that need user namespaces; the environment pods need neither.

Protocol (JSON over HTTP):
- `POST /run` {code, timeout_s} → {stdout, stderr, exit_code, timed_out, overflow, seconds, queued_s}; `code` at
  most `MAX_CODE_CHARS` characters, `timeout_s` in (0, `MAX_TIMEOUT_S`]. At most `max_concurrent` programs run at
  once; a call waits for a slot at most `max_queue_s` (then 503, to be retried elsewhere or later);
- `GET /health` → {running, queued, runs, refused, isolation}.
Every route requires `Authorization: Bearer $ASYNCRL_SANDBOX_TOKEN` (a token of its own: neither the run's role
token nor the environment-server token); bodies are limited to `MAX_BODY_BYTES`. The server drops every variable
whose name holds a secret from its own environment at start (`asyncrl.secret_names`), and each program starts with
an empty one anyway. It refuses to start where this host cannot isolate programs (`SandboxUnavailable`).
"""

from __future__ import annotations

import asyncio
import logging
import os
import time
from typing import Any

from fastapi import FastAPI, HTTPException
from pydantic import BaseModel, ConfigDict, Field

from asyncrl.rpc.auth import SANDBOX_TOKEN_ENV, MissingTokenError, require_token, secure_app
from asyncrl.sandbox.host import sandbox_host
from asyncrl.sandbox.runner import MAX_CODE_CHARS, run_python
from asyncrl.secret_names import is_secret_key

MAX_TIMEOUT_S = 60.0
MAX_BODY_BYTES = 1 << 20
DEFAULT_MAX_QUEUE_S = 30.0

log = logging.getLogger(__name__)


class RunRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    code: str = Field(max_length=MAX_CODE_CHARS)
    timeout_s: float = Field(default=5.0, gt=0, le=MAX_TIMEOUT_S)


def default_concurrency() -> int:
    """Two programs per CPU this process may use: a tool call mostly waits for its interpreter to start."""
    return 2 * len(os.sched_getaffinity(0))


def drop_secret_variables(environ: Any = os.environ) -> list[str]:
    """Remove every variable whose name holds a secret from `environ` (this service's own token included: read
    it first); returns their names, never the values."""
    names = sorted(k for k in environ if is_secret_key(k))
    for k in names:
        del environ[k]
    return names


def create_sandbox_app(token: str | None, max_concurrent: int | None = None,
                       max_queue_s: float = DEFAULT_MAX_QUEUE_S) -> FastAPI:
    """The sandbox service (module docstring); `token` None serves without authentication (in-process tests)."""
    host = sandbox_host()  # SandboxUnavailable, saying what is missing, before anything is served
    limit = max_concurrent or default_concurrency()
    if limit < 1 or max_queue_s <= 0:
        raise ValueError(f"max_concurrent and max_queue_s: expected >= 1 and > 0, got {limit} and {max_queue_s}")
    app = FastAPI(title="asyncrl tool sandbox")
    secure_app(app, token, MAX_BODY_BYTES, var=SANDBOX_TOKEN_ENV)
    slots = asyncio.Semaphore(limit)
    state = {"running": 0, "queued": 0, "runs": 0, "refused": 0}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return {**state, "max_concurrent": limit,
                "isolation": {"bwrap": host.bwrap, "uid": host.drop_to, "python": host.python}}

    @app.post("/run")
    async def run(req: RunRequest) -> dict[str, Any]:
        t0 = time.monotonic()
        state["queued"] += 1
        try:
            await asyncio.wait_for(slots.acquire(), timeout=max_queue_s)
        except TimeoutError:
            state["refused"] += 1
            raise HTTPException(503, f"all {limit} sandbox slots stayed busy for {max_queue_s:.0f} s") from None
        finally:
            state["queued"] -= 1
        queued_s = time.monotonic() - t0
        state["running"] += 1
        try:
            r = await run_python(req.code, timeout_s=req.timeout_s)
        finally:
            state["running"] -= 1
            slots.release()
        state["runs"] += 1
        return {"stdout": r.stdout, "stderr": r.stderr, "exit_code": r.exit_code, "timed_out": r.timed_out,
                "overflow": r.overflow, "seconds": r.seconds, "queued_s": queued_s}

    return app


def main(argv: list[str] | None = None) -> None:
    """`ASYNCRL_SANDBOX_TOKEN=... python -m asyncrl.sandbox.server --host 0.0.0.0 --port 8080`."""
    import argparse

    import uvicorn

    from asyncrl.rpc.listen import bind_socket

    parser = argparse.ArgumentParser(description="The tool sandbox service (asyncrl.sandbox.server).")
    parser.add_argument("--host", default="127.0.0.1", help="Bind address (default loopback only).")
    parser.add_argument("--port", type=int, default=8080, help="0 picks a free port (printed at start).")
    parser.add_argument("--max-concurrent", type=int, default=None,
                        help="programs run at once (default: two per CPU this process may use)")
    parser.add_argument("--max-queue-s", type=float, default=DEFAULT_MAX_QUEUE_S,
                        help="how long a call may wait for a free slot before 503")
    parser.add_argument("--insecure-no-token", action="store_true",
                        help=f"serve without a bearer token (otherwise {SANDBOX_TOKEN_ENV} must be set)")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    token: str | None = None
    if not args.insecure_no_token:
        try:
            token = require_token(var=SANDBOX_TOKEN_ENV)
        except MissingTokenError as e:
            raise SystemExit(f"asyncrl.sandbox.server: {e} (or pass --insecure-no-token)") from None
    dropped = [k for k in drop_secret_variables() if k != SANDBOX_TOKEN_ENV]
    if dropped:  # a cluster should not map them into this pod at all (manifests/sandbox/)
        log.warning("dropped %d secret variables from this process's environment: %s", len(dropped), ", ".join(dropped))
    app = create_sandbox_app(token, args.max_concurrent, args.max_queue_s)
    sock = bind_socket(args.host, args.port)
    print(f"asyncrl sandbox listening on {args.host}:{sock.getsockname()[1]}", flush=True)
    config = uvicorn.Config(app, log_level="warning")
    asyncio.run(uvicorn.Server(config).serve(sockets=[sock]))


if __name__ == "__main__":
    main()
