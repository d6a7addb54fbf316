"""The judge role: the run's own judge model (`task.judge.model_path`) on a vLLM server of its own, published in S3.

The same server as a generation role (`asyncrl.generation.server`), with the judge's model folder and engine
settings (`task.judge.max_model_len`, `kv_cache_gib`; one slot per concurrent judgment), and never sent weights: it
serves the frozen judge for the whole run. It publishes `rendezvous/judge/<id>.json` once ready; the reward role
reads it on its first judgment (asyncrl.roles.judge_scorer). Heartbeat, signals and the end of the run as for the
generation role.
Run: `python -m asyncrl.roles.judge --run-url s3://bucket/prefix/run_id --id 0`.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from asyncrl.config.schema import RunConfig
from asyncrl.generation.engine import EngineSettings
from asyncrl.generation.parallel import check_model_folder
from asyncrl.roles.context import RoleContext, advertised, role_arg_parser, setup_logging
from asyncrl.roles.generation import serve
from asyncrl.roles.stop_signal import StopSignal
from asyncrl.rpc.auth import MissingTokenError, require_token


def judge_engine_settings(cfg: RunConfig) -> EngineSettings:
    """The judge engine of a run whose `task.judge.model_path` is set."""
    judge, g = cfg.task.judge, cfg.generation
    assert judge is not None and judge.model_path is not None
    return EngineSettings(
        model=str(Path(judge.model_path)), max_model_len=judge.max_model_len, kv_cache_gib=judge.kv_cache_gib,
        max_num_seqs=max(judge.max_concurrency, 1), seed=0, dtype="float32", cpu_threads=g.cpu_threads,
        ring_poll_s=g.ring_poll_s, initial_version=0, tensor_parallel_size=1, kv_after_update="recompute",
        lora_scale=0.0, lora_adapter_file=None,
    )


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("judge").parse_args(argv)
    setup_logging(args.log_level, "judge", args.id)
    try:
        require_token()
    except MissingTokenError as err:
        raise SystemExit(f"judge[{args.id}]: {err}") from None
    ctx = RoleContext.from_args("judge", args)
    if ctx.cfg.task.judge is None or ctx.cfg.task.judge.model_path is None:
        raise SystemExit(f"judge[{args.id}]: the run's config has no task.judge.model_path to serve")
    settings = judge_engine_settings(ctx.cfg)
    try:
        check_model_folder(1, Path(settings.model))
    except ValueError as err:
        raise SystemExit(f"judge[{args.id}]: task.judge.model_path: {err}") from None
    signals = StopSignal()
    code = 0
    with ctx.heartbeat() as heartbeat:
        over = asyncio.run(serve(ctx, settings, args.host, advertised(args, ""), args.on_done, heartbeat, signals))
        if signals.signum is not None:
            code = signals.finish(ctx.store, ctx.paths, "judge", args.id, heartbeat.stop)
    if code:
        raise SystemExit(code)
    if over is not None and over.exit_code:
        raise SystemExit(f"judge[{args.id}]: stopping: {over.reason}")


if __name__ == "__main__":
    main()
