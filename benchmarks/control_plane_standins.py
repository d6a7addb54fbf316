"""Stand-ins for the control-plane benchmark (`benchmarks/control_plane.py`): the roles it does not measure.

`python -m control_plane_standins generation --run-url ... --id 0` (with `benchmarks/` on PYTHONPATH): the real
generation front end (`asyncrl.generation.server.create_app`: bearer token, body limit, strict validation, NDJSON
streaming of `/generate_batch`, `/abort_batch`, `/abort`, `/health`, `/weights/update`) over `InstantEngine`, which
answers every request at once with `max_tokens` token ids (taken from the prompt, so the tokenizer decodes them),
log-probs -1.0, the current policy version per token and finish_reason "length". It publishes its rendezvous
document and beats a heartbeat like the generation role, and exits when the run is over.

`python -m control_plane_standins trainer --run-url ... --id 0`: reads groups like the real trainer
(`GroupPrefetcher.for_run`, take B groups per step, stale groups dropped by `split_stale` when taken, the mid-step
publish after drops), then, with no model: POSTs `/weights/update` {version} to every generation server (its only
"sync"), reads the writers' rollout stats and the roles' heartbeats as the real step does, and publishes
`versions/latest.json` with the fields of `asyncrl.roles.training_report.TrainingReport.publish`. Each step also prints
`STEP {"version", "samples_trained", "t"}` on stdout for the benchmark's step clock.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import sys
import time
from typing import Any

import httpx
import uvicorn

from asyncrl.generation.engine import ActivityCounters, EngineSettings, GenerateParams
from asyncrl.generation.server import create_app
from asyncrl.roles.context import (
    RoleContext,
    base_url,
    numeric_metrics,
    role_arg_parser,
    setup_logging,
    wait_for_rendezvous,
    watched,
)
from asyncrl.roles.role_metrics import read_role_metrics
from asyncrl.rpc.auth import auth_headers, require_token
from asyncrl.rpc.listen import bind_socket
from asyncrl.storage.group_prefetch import GroupPrefetcher
from asyncrl.training.staleness import split_stale, staleness_stats
from asyncrl.types import Group

log = logging.getLogger("control_plane_standins")


class InstantEngine:
    """The part of `GenerationEngine` that `create_app` calls, answering every request at once (no await)."""

    def __init__(self, max_model_len: int, vocab_size: int | None) -> None:
        self.settings = EngineSettings(model="stand-in", max_model_len=max_model_len)
        self.vocab_size = vocab_size
        self.version = 0
        self.counters = ActivityCounters()

    async def generate(self, p: GenerateParams) -> dict[str, Any]:
        self.counters.begin()
        prompt, n = p.prompt_token_ids, p.max_tokens
        ids = [prompt[i % len(prompt)] for i in range(n)]
        self.counters.tokens_generated += n
        self.counters.end(finished=True)
        return {"request_id": p.request_id, "token_ids": ids, "logprobs": [-1.0] * n,
                "token_versions": [self.version] * n, "finish_reason": "length", "start_version": self.version}

    async def abort(self, request_id: str) -> bool:
        return False  # nothing is ever in flight

    async def abort_many(self, request_ids: list[str]) -> list[str]:
        return []

    def health(self) -> dict[str, Any]:
        return {"status": "ok", "version": self.version, "running": 0, "waiting": 0, "load": 0,
                **self.counters.snapshot()}

    async def init_weight_sync(self, info: dict[str, Any], timeout_s: float) -> None:
        return None

    async def update_weights(self, version: int, timeout_s: float) -> dict[str, Any]:
        self.version = version
        self.counters.updates += 1
        return {"version": version, "seconds": 0.0}

    async def checksum(self) -> dict[str, Any]:
        return {"version": self.version, "checksum": None, "source": "stand-in", "workers": []}


async def serve_generation(ctx: RoleContext, token: str, on_done: str) -> None:
    model = ctx.model_folder()
    vocab = json.loads((model / "config.json").read_text()).get("vocab_size")
    engine = InstantEngine(ctx.cfg.generation.max_model_len, vocab)
    sock = bind_socket("127.0.0.1", 0)
    config = uvicorn.Config(create_app(engine, token), log_level="warning", access_log=False)
    server = uvicorn.Server(config)
    with ctx.heartbeat() as heartbeat:
        async with watched(ctx, on_done, heartbeat, lambda: numeric_metrics(engine.health())) as (stop, _):
            serving = asyncio.create_task(server.serve(sockets=[sock]))
            while not server.started and not serving.done():
                await asyncio.sleep(0.05)
            ctx.publish({"host": "127.0.0.1", "port": int(sock.getsockname()[1])})
            stopping = asyncio.create_task(stop.wait())
            await asyncio.wait({serving, stopping}, return_when=asyncio.FIRST_COMPLETED)
            server.should_exit = True
            await serving
            stopping.cancel()


class StandInTrainer:
    """The real trainer's data path and `versions/latest.json`, without a model."""

    def __init__(self, ctx: RoleContext) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        ro, t = self.cfg.rollout, self.cfg.timeouts
        self.groups = GroupPrefetcher.for_run(ctx.store, ctx.paths, ro.num_writers, ro.prompts_per_step,
                                              t.group_gap_wait_s)
        self.version = 0
        self.c: dict[str, Any] = {"groups_trained": 0, "samples_trained": 0, "groups_dropped_stale": 0,
                                  "samples_dropped_stale": 0, "staleness_sum": 0.0, "staleness_max": 0,
                                  "train_wall_s": 0.0, "trained_by_writer": {}}
        self.last_metrics: dict[str, float] = {}
        self.http = httpx.Client(headers=auth_headers(), timeout=t.http_s)
        docs = wait_for_rendezvous(ctx.store, ctx.paths, "generation", self.cfg.generation.num_servers,
                                   t.rendezvous_s)
        self.servers = [base_url(d) for d in docs]

    def collect(self, step: int) -> tuple[list[Group], list[Group], dict[str, int]]:
        """As `TrainingRunner.collect`: B fresh groups, stale ones dropped when taken."""
        need = self.cfg.rollout.prompts_per_step
        kept: list[Group] = []
        dropped: list[Group] = []
        by_writer: dict[str, int] = {}
        deadline = time.monotonic() + self.cfg.timeouts.batch_wait_s
        announced = 0
        while len(kept) < need:
            got = self.groups.take(need - len(kept))
            if not got:
                if len(dropped) > announced:
                    announced = len(dropped)
                    self.publish(self.last_metrics, kept_by_writer=by_writer)
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise TimeoutError(f"step {step}: {len(kept)} of {need} groups in time")
                got = self.groups.take(need - len(kept), timeout_s=remaining)
            for writer, _, group in got:
                fresh, stale = split_stale([group], step, self.cfg.rollout.async_ratio)
                kept += fresh
                dropped += stale
                if fresh:
                    by_writer[writer] = by_writer.get(writer, 0) + 1
        return kept, dropped, by_writer

    def step(self, step: int) -> dict[str, float]:
        t0 = time.monotonic()
        kept, dropped, by_writer = self.collect(step)
        t1 = time.monotonic()
        self.version = step + 1
        for url in self.servers:  # the weight push, without weights
            self.http.post(f"{url}/weights/update", json={"version": self.version}).raise_for_status()
        t2 = time.monotonic()
        c, n = self.c, sum(len(g.samples) for g in kept)
        stale = staleness_stats(kept, step)
        c["groups_trained"] += len(kept)
        c["samples_trained"] += n
        c["groups_dropped_stale"] += len(dropped)
        c["samples_dropped_stale"] += sum(len(g.samples) for g in dropped)
        c["staleness_sum"] += stale["staleness_mean"] * n
        c["staleness_max"] = max(c["staleness_max"], int(stale["staleness_max"]))
        c["train_wall_s"] += t2 - t0
        for w, k in by_writer.items():
            c["trained_by_writer"][w] = c["trained_by_writer"].get(w, 0) + k
        rewards = [s.reward for g in kept for s in g.samples]
        metrics = {"reward/mean": sum(rewards) / len(rewards), "staleness/mean": stale["staleness_mean"],
                   "staleness/max": stale["staleness_max"], "throughput/samples_per_s": n / max(1e-9, t2 - t0),
                   "time/wait_s": t1 - t0, "time/sync_s": t2 - t1, "time/step_s": t2 - t0, "version": self.version}
        for writer in sorted(self.groups.cursors):  # as `TrainingReport.rollout_metrics`
            doc = self.ctx.store.get_json(self.ctx.paths.rollout_stats(writer)) or {}
            for k, v in doc.get("metrics", {}).items():
                if isinstance(v, int | float) and "/server" not in k and k != "rollout/version":
                    metrics[k] = metrics.get(k, 0.0) + float(v)
        metrics.update(read_role_metrics(self.ctx.store, self.ctx.paths))
        return metrics

    def publish(self, metrics: dict[str, float], kept_by_writer: dict[str, int] | None = None) -> None:
        """The document of `TrainingReport.publish` (no checksum, no weight group: there are no weights)."""
        kept = kept_by_writer or {}
        self.last_metrics = metrics
        counters = {k: v for k, v in self.c.items() if k != "trained_by_writer"}
        doc = {"version": self.version, "consumed": {w: n - kept.get(w, 0) for w, n in self.groups.cursors.items()},
               "trained": dict(self.c["trained_by_writer"]), "counters": counters, "checksum": {},
               "weight_group": {}, "metrics": metrics, "time": time.time()}
        self.ctx.store.put_json(self.ctx.paths.versions_latest(), doc)

    def run(self) -> None:
        self.groups.start()
        self.publish({})
        for step in range(self.cfg.training.steps):
            metrics = self.step(step)
            self.publish(metrics)
            print("STEP " + json.dumps({"version": self.version, "samples_trained": self.c["samples_trained"],
                                        "t": time.time()}), flush=True)
        self.ctx.store.put_json(self.ctx.paths.done(), {"version": self.version, "time": time.time()})

    def close(self) -> None:
        self.groups.close()
        self.http.close()


def main(argv: list[str] | None = None) -> None:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in ("generation", "trainer"):
        raise SystemExit("usage: python -m control_plane_standins {generation,trainer} --run-url URL --id ID")
    which = argv.pop(0)
    role = "generation" if which == "generation" else "training"
    args = role_arg_parser(role).parse_args(argv)
    setup_logging(args.log_level, f"{which}-stand-in", args.id)
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    ctx = RoleContext.from_args(role, args)
    if which == "generation":
        asyncio.run(serve_generation(ctx, require_token(), args.on_done))
        return
    with ctx.heartbeat():  # the other roles exit when the trainer's heartbeat stops
        trainer = StandInTrainer(ctx)
        try:
            trainer.run()
        finally:
            trainer.close()


if __name__ == "__main__":
    main()
