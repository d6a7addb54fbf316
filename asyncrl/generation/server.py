"""HTTP server of the generation role: FastAPI around `GenerationEngine`, plus `serve()` / `main()`.

Routes (the contract in docs/generation_api.md):
- `POST /generate` GenerateRequest → {request_id, token_ids, logprobs, token_versions, finish_reason, start_version}
- `POST /abort` {request_id} → {request_id, aborted}
- `POST /generate_batch` {requests: [GenerateRequest, ...]} (distinct ids, at most `MAX_BATCH_REQUESTS`) → an NDJSON
  stream, one line per request as it finishes (in finishing order): the /generate answer, or {request_id, error:
  {status, detail}} with the status /generate would have given it. A client that disconnects ends its batch's
  requests still running. A body that does not validate is refused whole (422 naming e.g. requests.3.max_tokens).
- `POST /abort_batch` {request_ids: [...]} → {aborted: [ids that were in flight]}
- `GET /health` → {status, version, running, waiting, load, uptime_s, busy_s, tokens_generated,
  requests_finished, requests_aborted, updates, lora_scale} (six cumulative since the engine was ready)
- `POST /weights/init` {master_addr, master_port, rank, world_size, backend, timeout_s[, group_name, lora_scale]}
- `POST /weights/update` {version[, timeout_s]} → {version, seconds}
- `GET /weights/version?after=N&wait_s=S` → {version}: answers once the weights' version is above N (generation has
  resumed with it), or after S seconds (at most `MAX_VERSION_WAIT_S`) with the current version
- `GET /weights/checksum` → {version, checksum, source, workers: [per-worker checksums]}
Bad bodies (checked by `asyncrl.generation.bodies`) get 422 naming the field (types are strict: no "3" for 3, no
true for 1; no NaN or infinity; unknown fields refused; token ids within the model's vocabulary; max_tokens at most
max_model_len) or 400 naming the limit when the prompt is too long for the model (more than max_model_len - 1
tokens) or prompt + max_tokens exceeds max_model_len. Nothing a client sends reaches the engine unchecked: an
out-of-vocabulary token id would crash vLLM's engine (it validates ids only with a tokenizer, and this server runs
without one).
Every route needs `Authorization: Bearer $ASYNCRL_ROLE_TOKEN` (401 without, 403 wrong: `asyncrl.rpc.auth`) and
bodies are limited to `MAX_BODY_BYTES` (413); `run_server` refuses to start without the token unless told
`insecure_no_token=True` (`--insecure-no-token`, for tests on loopback only).

`python -m asyncrl.generation.server --model DIR --port 0 --ready-file PATH` (token from the environment) binds
the socket itself (port 0 picks a free one), writes {"host","port","pid"} atomically to the ready file once the
engine is ready, and shuts the engine down on SIGTERM/SIGINT.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import logging
import os
import signal
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from typing import Annotated, Any

import msgspec
import uvicorn
from fastapi import FastAPI, HTTPException, Query
from fastapi.exceptions import RequestValidationError
from fastapi.responses import StreamingResponse

from asyncrl.generation.bodies import (
    MAX_BODY_BYTES,
    MAX_VERSION_WAIT_S,
    AbortBatchRequest,
    AbortRequest,
    GenerateBatchRequest,
    GenerateRequest,
    WeightsInitRequest,
    WeightsUpdateRequest,
    check_against_model,
)
from asyncrl.generation.engine import (
    EngineSettings,
    EngineUnavailable,
    GenerateParams,
    GenerationEngine,
    RequestConflict,
)
from asyncrl.rpc.auth import MissingTokenError, require_token, secure_app, validation_details
from asyncrl.rpc.listen import bind_socket

log = logging.getLogger(__name__)

_JSON = msgspec.json.Encoder()


def _line(doc: dict[str, Any]) -> bytes:
    """`doc` as one compact JSON line. msgspec encodes a line ~15x faster than `json.dumps` (which was ~27% of the
    front end's CPU on the default job), but writes NaN and infinities as null: a line with a null in it is encoded
    again by `json.dumps(allow_nan=False)`, which gives the same bytes or raises ValueError (a 400 line) for them."""
    out = _JSON.encode(doc)
    if b"null" in out:
        out = json.dumps(doc, separators=(",", ":"), allow_nan=False).encode()
    return out + b"\n"


def _error_line(request_id: str, status: int, detail: Any) -> bytes:
    return _line({"request_id": request_id, "error": {"status": status, "detail": detail}})


def create_app(engine: GenerationEngine, token: str | None, max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The generation API over `engine`; every route requires `token` as a bearer token (None: no check, only for
    an explicitly insecure server) and bodies are limited to `max_body_bytes`."""
    app = FastAPI(title="asyncrl generation server")
    secure_app(app, token, max_body_bytes)
    vocab_size = getattr(engine, "vocab_size", None)  # None: an engine without a vLLM model config (unit tests)
    if vocab_size is None:
        log.warning("generation server: the engine does not report its vocabulary size; token ids are not checked")

    @app.post("/generate")
    async def generate(req: GenerateRequest) -> dict[str, Any]:
        check_against_model(req, engine.settings.max_model_len, vocab_size)
        try:
            return await engine.generate(GenerateParams(**req.model_dump()))
        except RequestConflict as e:
            raise HTTPException(status_code=409, detail=str(e)) from e
        except EngineUnavailable as e:
            raise HTTPException(status_code=503, detail=str(e)) from e
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from e

    @app.post("/abort")
    async def abort(req: AbortRequest) -> dict[str, Any]:
        return {"request_id": req.request_id, "aborted": await engine.abort(req.request_id)}

    async def one_of_batch(req: GenerateRequest) -> bytes:
        """One request of a batch, as its NDJSON line: the /generate answer, or {request_id, error: {status,
        detail}} with the status /generate would have answered."""
        try:
            check_against_model(req, engine.settings.max_model_len, vocab_size)
            return _line(await engine.generate(GenerateParams(**req.model_dump())))
        except RequestValidationError as e:
            return _error_line(req.request_id, 422, validation_details(e.errors()))
        except HTTPException as e:
            return _error_line(req.request_id, e.status_code, e.detail)
        except RequestConflict as e:
            return _error_line(req.request_id, 409, str(e))
        except EngineUnavailable as e:
            return _error_line(req.request_id, 503, str(e))
        except ValueError as e:
            return _error_line(req.request_id, 400, str(e))
        except Exception as e:  # one request's failure never ends the others of its batch
            log.exception("generate_batch: request %s failed", req.request_id)
            return _error_line(req.request_id, 500, f"{type(e).__name__}: {e}")

    @app.post("/generate_batch")
    async def generate_batch(req: GenerateBatchRequest) -> StreamingResponse:
        async def lines() -> AsyncIterator[bytes]:
            pending = {asyncio.create_task(one_of_batch(r)) for r in req.requests}
            try:
                while pending:
                    done, pending = await asyncio.wait(pending, return_when=asyncio.FIRST_COMPLETED)
                    yield b"".join(t.result() for t in done)
            finally:  # the client went away (or the server stops): its requests still running end now
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)

        return StreamingResponse(lines(), media_type="application/x-ndjson")

    @app.post("/abort_batch")
    async def abort_batch(req: AbortBatchRequest) -> dict[str, Any]:
        return {"aborted": await engine.abort_many(req.request_ids)}

    @app.get("/health")
    async def health() -> dict[str, Any]:
        return engine.health()

    @app.post("/weights/init")
    async def weights_init(req: WeightsInitRequest) -> dict[str, Any]:
        if req.rank >= req.world_size:
            raise HTTPException(status_code=400, detail=f"rank: expected < world_size={req.world_size}, got {req.rank}")
        try:
            await engine.init_weight_sync(req.model_dump(), timeout_s=req.timeout_s)
        except Exception as e:
            log.exception("weights/init failed")
            raise HTTPException(status_code=500, detail=f"weights/init: {type(e).__name__}: {e}") from e
        return {"ok": True, "rank": req.rank, "world_size": req.world_size}

    @app.post("/weights/update")
    async def weights_update(req: WeightsUpdateRequest) -> dict[str, Any]:
        try:
            return await engine.update_weights(req.version, timeout_s=req.timeout_s)
        except ValueError as e:
            raise HTTPException(status_code=400, detail=str(e)) from e
        except Exception as e:
            log.exception("weights/update failed")
            raise HTTPException(status_code=500, detail=f"weights/update: {type(e).__name__}: {e}") from e

    @app.get("/weights/version")
    async def weights_version(
        after: Annotated[int, Query(ge=-1)] = -1,
        wait_s: Annotated[float, Query(ge=0, le=MAX_VERSION_WAIT_S, allow_inf_nan=False)] = 0.0,
    ) -> dict[str, Any]:
        return await engine.wait_version(after, wait_s)

    @app.get("/weights/checksum")
    async def weights_checksum() -> dict[str, Any]:
        return await engine.checksum()

    return app


def write_ready_file(path: str, host: str, port: int) -> None:
    """Write {"host","port","pid"} atomically (temp file + rename)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump({"host": host, "port": port, "pid": os.getpid()}, f)
    os.replace(tmp, path)


class _Server(uvicorn.Server):
    """uvicorn server without its own signal capture: uvicorn re-raises SIGTERM/SIGINT once `serve()`
    returns, which would kill this process before the vLLM engine processes are shut down."""

    @contextlib.contextmanager
    def capture_signals(self) -> Iterator[None]:
        yield


async def run_server(
    settings: EngineSettings,
    host: str = "127.0.0.1",
    port: int = 0,
    on_ready: Callable[[str, int], Awaitable[None] | None] | None = None,
    stop: asyncio.Event | None = None,
    on_engine: Callable[[GenerationEngine], None] | None = None,
    *,
    token: str | None = None,
    insecure_no_token: bool = False,
    handle_signals: bool = True,
) -> None:
    """Start the engine, serve HTTP until SIGTERM/SIGINT (or `stop` is set), then shut the engine down.

    `on_engine(engine)` runs once the engine has started (the role reads its `health()` for its heartbeat);
    `on_ready(host, port)` runs once the engine is ready and the socket is listening (sync or async).
    Signal handlers are installed only when running in the main thread, and with `handle_signals` (the generation
    role installs its own, which set `stop` too: `asyncrl.roles.stop_signal`).
    The bearer token is `token`, else `ASYNCRL_ROLE_TOKEN` (a `MissingTokenError` naming the variable, before
    anything starts, when neither is set); `insecure_no_token=True` serves without any token check.
    """
    if insecure_no_token:
        log.warning("generation server: --insecure-no-token: every route is open to anyone who can connect")
        token = None
    else:
        token = token or require_token()
    stop = stop or asyncio.Event()
    loop = asyncio.get_running_loop()
    installed: list[int] = []
    if handle_signals and threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
            installed.append(sig)
    sock = bind_socket(host, port)
    real_port = int(sock.getsockname()[1])
    engine: GenerationEngine | None = None
    try:
        engine = await GenerationEngine.start(settings)
        if on_engine is not None:
            on_engine(engine)
        gc.freeze()  # the start-up's objects out of the cyclic collector's reach (requests allocate per sample)
        config = uvicorn.Config(create_app(engine, token), log_level="warning", access_log=False, timeout_graceful_shutdown=5)
        server = _Server(config)
        serving = asyncio.create_task(server.serve(sockets=[sock]))
        while not server.started and not serving.done():
            await asyncio.sleep(0.05)
        if server.started and on_ready is not None:
            result = on_ready(host, real_port)
            if asyncio.iscoroutine(result):
                await result
        log.info("generation server ready on %s:%d", host, real_port)
        stopping = asyncio.create_task(stop.wait())
        await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
        await engine.release_waiters()  # the long polls answer now, not after uvicorn's graceful-shutdown timeout
        server.should_exit = True
        await serving
        stopping.cancel()
    finally:
        log.info("generation server: shutting down")
        if engine is not None:
            engine.shutdown(timeout=20)
        sock.close()
        for sig in installed:
            loop.remove_signal_handler(sig)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.generation.server", description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True, help="Hugging Face model folder")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=0, help="0: pick a free port")
    p.add_argument("--max-model-len", type=int, default=256)
    p.add_argument("--kv-cache-gib", type=float, default=0.25)
    p.add_argument("--max-num-seqs", type=int, default=64)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--cpu-threads", type=int, default=1,
                   help="CPU build: unpinned OpenMP threads of the engine's worker (0: vLLM's core binding)")
    p.add_argument("--kv-after-update", default="recompute", choices=("recompute", "keep"),
                   help="the running requests' KV at a weight update (generation.kv_after_update)")
    p.add_argument("--lora-scale", type=float, default=0.0,
                   help="serve LoRA adapters of this scale (training.lora alpha / rank) merged into the model; every "
                        "push must then be an adapter (0: full weights)")
    p.add_argument("--lora-adapter", default=None, help="a safetensors file of LoRA A and B merged before serving")
    p.add_argument("--work-dir", default=None, help="folder for vLLM's RPC sockets and cache")
    p.add_argument("--ready-file", default=None, help='write {"host","port","pid"} here once ready')
    p.add_argument("--log-level", default="INFO")
    p.add_argument("--insecure-no-token", action="store_true",
                   help="serve without the bearer token (tests on loopback only); otherwise ASYNCRL_ROLE_TOKEN "
                        "must be set")
    return p.parse_args(argv)


def serve(args: argparse.Namespace) -> None:
    settings = EngineSettings(
        model=args.model, max_model_len=args.max_model_len, kv_cache_gib=args.kv_cache_gib,
        max_num_seqs=args.max_num_seqs, seed=args.seed, dtype=args.dtype, work_dir=args.work_dir,
        cpu_threads=args.cpu_threads, kv_after_update=args.kv_after_update, lora_scale=args.lora_scale,
        lora_adapter_file=args.lora_adapter,
    )

    def on_ready(host: str, port: int) -> None:
        if args.ready_file:
            write_ready_file(args.ready_file, host, port)

    asyncio.run(run_server(settings, args.host, args.port, on_ready, insecure_no_token=args.insecure_no_token))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    logging.basicConfig(level=args.log_level, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not args.insecure_no_token:
        try:
            require_token()
        except MissingTokenError as e:
            raise SystemExit(f"asyncrl.generation.server: {e} (or pass --insecure-no-token)") from None
    serve(args)


if __name__ == "__main__":
    main()
