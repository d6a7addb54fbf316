"""The generation role: one vLLM server (`asyncrl.generation.server`) configured from the run, published in S3.

Reads the run's config, resolves the model folder, starts the engine and HTTP server on a free port, and publishes
`rendezvous/generation/<id>.json` once it is ready; the trainer then drives weight sync through its HTTP API.
It beats a heartbeat carrying the engine's figures (`asyncrl.roles.liveness`) and exits by itself when the run is
done (unless `--on-done stay`) or the trainer failed or is gone, so a finished or failed run never holds its GPUs.
On SIGTERM/SIGINT it stops serving, shuts the engine down and records the stop (`asyncrl.roles.stop_signal`).
Run: `python -m asyncrl.roles.generation --run-url s3://bucket/prefix/run_id --id 0`.
"""

from __future__ import annotations

import asyncio
import json
import logging
import shutil
from pathlib import Path

from safetensors.torch import save_file

from asyncrl.config.schema import GenerationConfig, LoraConfig
from asyncrl.generation.engine import EngineSettings, GenerationEngine
from asyncrl.generation.kv_budget import kv_cache_warning
from asyncrl.generation.parallel import check_model_folder
from asyncrl.generation.server import run_server
from asyncrl.roles.context import (
    RoleContext,
    advertised,
    instance_index,
    numeric_metrics,
    role_arg_parser,
    setup_logging,
    watched,
)
from asyncrl.roles.liveness import Heartbeat, RunOver
from asyncrl.roles.stop_signal import StopSignal
from asyncrl.rpc.auth import MissingTokenError, require_token
from asyncrl.storage.checkpoints import latest_committed_version, load_checkpoint_tensors

log = logging.getLogger(__name__)
ENGINE_CHECK_S = 2.0


async def serve(ctx: RoleContext, settings: EngineSettings, host: str, advertise: str, on_done: str,
                heartbeat: Heartbeat, signals: StopSignal) -> RunOver | None:
    """Serve until SIGTERM/SIGINT (noted in `signals`) or the end of the run; returns why the run ended it (None:
    stopped by a signal)."""
    engines: list[GenerationEngine] = []

    def figures() -> dict[str, float]:
        return numeric_metrics(engines[0].health()) if engines else {}

    def ready(bound: str, port: int) -> None:
        heartbeat.metrics = figures()  # the engine's figures from the first beat after ready, not a beat later
        heartbeat.beat()
        ctx.publish({"host": advertise or bound, "port": port})

    async with watched(ctx, on_done, heartbeat, figures) as (stop, over):
        signals.on_loop(asyncio.get_running_loop(), stop)
        engine_watch = asyncio.create_task(stop_when_engine_dies(engines, stop, over))
        try:
            await run_server(settings, host, 0, ready, stop, on_engine=engines.append, handle_signals=False)
        finally:
            engine_watch.cancel()
    return over[0] if over else None


async def stop_when_engine_dies(engines: list[GenerationEngine], stop: asyncio.Event, over: list[RunOver],
                                every_s: float = ENGINE_CHECK_S) -> None:
    """Stop the role as failed once its engine is dead: the server would otherwise stay up (and healthy to a probe
    that reads only the status code) answering every request with an error, and the run would never learn of it."""
    while not stop.is_set():
        if engines and engines[0].dead:
            log.error("the vLLM engine died (its error is above); stopping the server")
            over.append(RunOver("the vLLM engine died", 1))
            stop.set()
            return
        await asyncio.sleep(every_s)


def model_at_latest_checkpoint(ctx: RoleContext, model: Path) -> tuple[Path, int, str | None]:
    """The model folder to start from, its policy version and, with `training.lora`, the adapter file to merge:
    `model` at version 0 while the run has no committed checkpoint; else a copy of `model`'s config and tokenizer
    files with the newest committed checkpoint's weights (`checkpoints/<v>/model.safetensors`, verified against
    COMMITTED), at version v; with LoRA, `model` itself (the base) and that checkpoint's adapter (its model file) as a
    local file. A server that restarts mid-run thus serves the trainer's weights of at most `checkpoint_every` steps
    ago until the trainer's next push."""
    version = latest_committed_version(ctx.store, ctx.paths)
    if not version:
        return model, 0, None
    tensors = load_checkpoint_tensors(ctx.store, ctx.paths, version, "model")
    folder = Path(ctx.cfg.cache_dir) / "generation-checkpoints" / ctx.cfg.run_id / f"{ctx.role_id}-v{version}"
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    if ctx.cfg.training.lora is not None:
        adapter = folder / "adapter.safetensors"
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(adapter))
        log.info("starting from committed checkpoint %d's adapter (%d tensors)", version, len(tensors))
        return model, version, str(adapter)
    for f in model.iterdir():
        if f.is_file() and not f.name.endswith((".safetensors", ".safetensors.index.json", ".bin", ".pt")):
            shutil.copy2(f, folder / f.name)
    save_file({k: v.contiguous() for k, v in tensors.items()}, str(folder / "model.safetensors"))
    log.info("starting from committed checkpoint %d (%d tensors)", version, len(tensors))
    return folder, version, None


def engine_settings(g: GenerationConfig, model: str, index: int, version: int, lora: LoraConfig | None = None,
                    adapter_file: str | None = None) -> EngineSettings:
    """The engine of generation replica number `index` of a run whose generation section is `g` (and LoRA section
    `lora`; `adapter_file`: a checkpoint's adapter to merge before serving)."""
    return EngineSettings(
        model=model, max_model_len=g.max_model_len, kv_cache_gib=g.kv_cache_gib, max_num_seqs=g.max_num_seqs,
        seed=g.seed + index, dtype=g.dtype, cpu_threads=g.cpu_threads, ring_poll_s=g.ring_poll_s,
        initial_version=version, tensor_parallel_size=g.tensor_parallel_size, kv_after_update=g.kv_after_update,
        lora_scale=lora.scale if lora is not None else 0.0, lora_adapter_file=adapter_file,
    )


def warn_small_kv_cache(g: GenerationConfig, model: Path) -> str | None:
    """Log (and return) `asyncrl.generation.kv_budget`'s warning when the KV cache cannot hold `max_num_seqs` whole
    sequences of this model; None when it can, or when the model's config.json does not say."""
    try:
        model_config = json.loads((model / "config.json").read_text())
        warning = kv_cache_warning(model_config, g.dtype, g.kv_cache_gib, g.max_num_seqs, g.max_model_len)
    except (OSError, ValueError) as err:
        log.info("KV cache size not checked: %s", err)
        return None
    if warning:
        log.warning("%s", warning)
    return warning


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("generation").parse_args(argv)
    setup_logging(args.log_level, "generation", args.id)
    try:
        require_token()  # before the engine starts: the server refuses to run without the run's bearer token
    except MissingTokenError as err:
        raise SystemExit(f"generation[{args.id}]: {err}") from None
    ctx = RoleContext.from_args("generation", args)
    g = ctx.cfg.generation
    model, version, adapter = model_at_latest_checkpoint(ctx, ctx.model_folder())
    try:
        check_model_folder(g.tensor_parallel_size, model)  # before vLLM starts: a clear error, not vLLM's
    except ValueError as err:
        raise SystemExit(f"generation[{args.id}]: {err}") from None
    settings = engine_settings(g, str(model), instance_index(args.id), version, ctx.cfg.training.lora, adapter)
    warn_small_kv_cache(g, model)
    signals = StopSignal()
    code = 0
    with ctx.heartbeat() as heartbeat:
        over = asyncio.run(serve(ctx, settings, args.host, advertised(args, ""), args.on_done, heartbeat, signals))
        if signals.signum is not None:
            code = signals.finish(ctx.store, ctx.paths, "generation", args.id, heartbeat.stop)
    if code:
        raise SystemExit(code)
    if over is not None and over.exit_code:
        raise SystemExit(f"generation[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
