"""The generation role: one vLLM server (`asyncrl.generation.server`) configured from the run, published in S3.

Reads the run's config, resolves the model folder, starts the engine and HTTP server on a free port, and publishes
`rendezvous/generation/<id>.json` once it is ready; the trainer then drives weight sync through its HTTP API.
Run: `python -m asyncrl.roles.generation --run-url s3://bucket/prefix/run_id --id 0`.
"""

from __future__ import annotations

import asyncio

from asyncrl.generation.engine import EngineSettings
from asyncrl.generation.server import run_server
from asyncrl.models.tiny import resolve_model_path
from asyncrl.roles.context import RoleContext, advertised, instance_index, role_arg_parser, setup_logging


def main(argv: list[str] | None = None) -> None:
    args = role_arg_parser("generation").parse_args(argv)
    setup_logging(args.log_level, "generation", args.id)
    ctx = RoleContext.from_args("generation", args)
    g = ctx.cfg.generation
    settings = EngineSettings(
        model=str(resolve_model_path(ctx.cfg)), max_model_len=g.max_model_len, kv_cache_gib=g.kv_cache_gib,
        max_num_seqs=g.max_num_seqs, seed=g.seed + instance_index(args.id),
        dtype="float32", cpu_threads=g.cpu_threads,
    )

    def ready(host: str, port: int) -> None:
        ctx.publish({"host": advertised(args, host), "port": port})

    asyncio.run(run_server(settings, args.host, 0, ready))


if __name__ == "__main__":
    main()
