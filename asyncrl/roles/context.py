"""What every role process starts from: the run's S3 location, its resolved config, and rendezvous.

A role is started as `python -m asyncrl.roles.<role> --run-url s3://bucket/prefix/run_id --id ID`; the S3 endpoint
and credentials come from the standard environment (`AWS_ENDPOINT_URL`, `AWS_ACCESS_KEY_ID`,
`AWS_SECRET_ACCESS_KEY`), never from arguments, so no secret shows in a process list or a pipeline parameter.
The resolved `RunConfig` is read from `config.json` under the run, the model folder from `model.json` (a role never
builds or chooses a model: `asyncrl.models.folder`), a reasoning_gym or file task's rows from the run's copy under
`data/` (`load_task_data`: a role never reads the user's files or runs reasoning-gym); rendezvous documents (address, port, epoch)
live under `rendezvous/<role>/<id>.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import faulthandler
import logging
import os
import signal
import time
from collections.abc import AsyncIterator, Callable, MutableMapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import ConfigError, RunConfig, config_from_json, with_cache_dir_from_env
from asyncrl.models.folder import run_model_folder
from asyncrl.roles.liveness import Heartbeat, RunOver, exit_when_orphaned, watch_run
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.run_store import open_run
from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)


def role_arg_parser(role: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog=f"python -m asyncrl.roles.{role}", description=f"asyncrl {role} role")
    p.add_argument("--run-url", required=True, help="s3://bucket/prefix/run_id of the run")
    p.add_argument("--id", default="0", help="instance id of this role (letters, digits, _ and -)")
    p.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "INFO"))
    p.add_argument("--host", default=os.environ.get("ASYNCRL_BIND_HOST", "127.0.0.1"),
                   help="address to listen on (0.0.0.0 in a pod)")
    p.add_argument("--advertise-host", default=os.environ.get("POD_IP", ""),
                   help="address peers use to reach this role (default: --host)")
    p.add_argument("--on-done", choices=("exit", "stay"), default="exit",
                   help="exit when the run is done (cluster), or stay until stopped (the embedded launcher evaluates "
                        "through the servers after the run); a failed or vanished trainer ends the role either way")
    return p


def advertised(args: argparse.Namespace, bound_host: str) -> str:
    """The address to publish: --advertise-host, else the bound address (loopback in embedded mode)."""
    return args.advertise_host or bound_host


def setup_logging(level: str, role: str, role_id: str) -> None:
    logging.basicConfig(
        level=getattr(logging, level.upper(), logging.INFO),
        format=f"%(asctime)s %(levelname)s {role}[{role_id}] %(name)s: %(message)s",
    )
    for noisy in ("botocore", "urllib3", "httpx", "httpcore", "uvicorn.access", "s3transfer"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # `kill -USR1 <pid>`: every thread's stack to the log


def apply_network_env(cfg: RunConfig, environ: MutableMapping[str, str]) -> None:
    """Point NCCL and gloo at `network.socket_ifname` (before any process group or engine starts; vLLM's workers
    inherit it). An empty setting leaves the environment as it is. NCCL's `^` (exclude) and `=` (exact) prefixes
    have no gloo equivalent, so such a value is given to NCCL only."""
    ifname = cfg.network.socket_ifname
    if ifname:
        plain = not ifname.startswith(("^", "="))
        for var in ("NCCL_SOCKET_IFNAME", "GLOO_SOCKET_IFNAME") if plain else ("NCCL_SOCKET_IFNAME",):
            if environ.get(var, ifname) != ifname:
                log.info("%s=%s replaced by network.socket_ifname=%s", var, environ[var], ifname)
            environ[var] = ifname


@dataclass
class RoleContext:
    role: str
    role_id: str
    run_url: str
    store: S3Store
    paths: RunPaths
    cfg: RunConfig
    advertise_host: str = "127.0.0.1"  # the address peers reach this role at (its pod IP on a cluster)

    @classmethod
    def from_args(cls, role: str, args: argparse.Namespace) -> RoleContext:
        try:
            store, paths = open_run(args.run_url)
        except ValueError as err:
            raise SystemExit(f"{role}: {err}") from None
        text = store.get_bytes(paths.config())
        if text is None:
            raise SystemExit(f"{role}: {args.run_url}/config.json does not exist: start the run with `asyncrl run`")
        cfg = config_from_json(text.decode(), f"{args.run_url}/config.json")
        try:
            cfg = with_cache_dir_from_env(cfg, os.environ)  # a pod's cache volume (the pipeline sets it)
        except ConfigError as err:
            raise SystemExit(f"{role}: {err}") from None
        store.close()
        store, paths = open_run(args.run_url, retry_deadline_s=cfg.timeouts.storage_s)
        apply_network_env(cfg, os.environ)
        exit_when_orphaned()  # started by the embedded launcher: never outlive it (asyncrl.roles.liveness)
        host = advertised(args, "" if args.host in ("0.0.0.0", "::") else args.host) or "127.0.0.1"
        return cls(role, args.id, args.run_url, store, paths, cfg, advertise_host=host)

    def model_folder(self) -> Path:
        """The run's model folder, as the launcher or the pipeline's setup step recorded it in `model.json`
        (fetched into the cache when it lives in S3). A role never builds or chooses a model."""
        return run_model_folder(self.store, self.paths, self.cfg.cache_dir, self.store.endpoint_url,
                                self.cfg.storage.region)

    def load_task_data(self) -> None:
        """Fetch the run's copy of a reasoning_gym or file task's rows once, so that `load_split` in this process
        serves exactly those (`asyncrl.tasks.run_copy`); nothing for other tasks. SystemExit naming the key when the
        copy is missing or damaged."""
        from asyncrl.tasks.jsonl import DatasetError
        from asyncrl.tasks.run_copy import load_run_copy

        try:
            load_run_copy(self.store, self.paths, self.cfg)
        except DatasetError as err:
            raise SystemExit(f"{self.role}: {err}") from None

    # ---- rendezvous ----------------------------------------------------------------------------------
    def publish(self, doc: dict[str, Any]) -> None:
        """Publish this instance's address; the epoch grows on every restart so peers can tell."""
        key = self.paths.rendezvous(self.role, self.role_id)
        old = self.store.get_json(key) or {}
        doc = {**doc, "epoch": int(old.get("epoch", -1)) + 1, "pid": os.getpid(), "time": time.time()}
        self.store.put_json(key, doc)
        log.info("published %s/%s at %s:%s", self.role, self.role_id, doc.get("host"), doc.get("port"))

    def wait_for_peers(self, role: str, count: int, timeout_s: float | None = None) -> list[dict[str, Any]]:
        """Block until `count` instances of `role` have published; returns their documents ordered by id."""
        return wait_for_rendezvous(self.store, self.paths, role, count,
                                   timeout_s if timeout_s is not None else self.cfg.timeouts.rendezvous_s)

    def is_done(self) -> bool:
        return self.store.exists(self.paths.done())

    # ---- liveness (asyncrl.roles.liveness) -----------------------------------------------------------
    def heartbeat(self) -> Heartbeat:
        return Heartbeat(self.store, self.paths, self.role, self.role_id, self.cfg.timeouts.heartbeat_s)

    async def watch_run(self) -> RunOver:
        """Until the run is done, or the trainer failed or is gone (see `asyncrl.roles.liveness`)."""
        t = self.cfg.timeouts
        return await watch_run(self.store, self.paths, poll_s=t.heartbeat_s, first_s=t.rendezvous_s, peer_s=t.peer_s)


def poll_rendezvous(store: S3Store, paths: RunPaths, role: str, count: int,
                    every: bool = False) -> list[dict[str, Any]] | None:
    """One look: the documents of the first `count` published instances of `role` ordered by id, or None
    (`every`: all the published ones, however many). A withdrawn document (no address) is not published."""
    keys = store.list_keys(paths.rendezvous_prefix(role))
    docs = []
    for key in sorted(keys):
        doc = store.get_json(key)
        if isinstance(doc, dict) and "host" in doc and "port" in doc:
            docs.append({**doc, "id": key.rsplit("/", 1)[-1].removesuffix(".json")})
    docs.sort(key=lambda d: d["id"])
    if every:
        return docs
    return docs[:count] if len(docs) >= count else None


def _rendezvous_timeout(paths: RunPaths, role: str, count: int, timeout_s: float) -> TimeoutError:
    return TimeoutError(f"rendezvous: fewer than {count} {role} instance(s) published within {timeout_s:.0f}s "
                        f"under {paths.rendezvous_prefix(role)}")


def wait_for_rendezvous(store: S3Store, paths: RunPaths, role: str, count: int, timeout_s: float,
                        poll_s: float = 0.5) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    while True:
        docs = poll_rendezvous(store, paths, role, count)
        if docs is not None:
            return docs
        if time.monotonic() > deadline:
            raise _rendezvous_timeout(paths, role, count, timeout_s)
        time.sleep(poll_s)


async def wait_for_rendezvous_async(store: S3Store, paths: RunPaths, role: str, count: int, timeout_s: float,
                                    poll_s: float = 0.5) -> list[dict[str, Any]]:
    """`wait_for_rendezvous` for an event loop: cancellable between looks (no thread left blocked)."""
    deadline = time.monotonic() + timeout_s
    while True:
        docs = await asyncio.to_thread(poll_rendezvous, store, paths, role, count)
        if docs is not None:
            return docs
        if time.monotonic() > deadline:
            raise _rendezvous_timeout(paths, role, count, timeout_s)
        await asyncio.sleep(poll_s)


def instance_index(role_id: str) -> int:
    """The number in an instance id (`env3` → 3, `0` → 0, `a` → 0): offsets seeds and prompt streams."""
    digits = "".join(c for c in role_id if c.isdigit())
    return int(digits) if digits else 0


def base_url(doc: dict[str, Any]) -> str:
    return f"http://{doc['host']}:{doc['port']}"


def numeric_metrics(doc: dict[str, Any]) -> dict[str, float]:
    """The numeric fields of a status document (bools and text left out), for a heartbeat's metrics."""
    return {k: float(v) for k, v in doc.items() if isinstance(v, int | float) and not isinstance(v, bool)}


@contextlib.asynccontextmanager
async def watched(ctx: RoleContext, on_done: str, heartbeat: Heartbeat,
                  figures: Callable[[], dict[str, float]]) -> AsyncIterator[tuple[asyncio.Event, list[RunOver]]]:
    """Around a serving role: refresh its heartbeat's metrics from `figures()` every beat, and set the yielded
    `stop` event when the run is over for it (`stop_when_over`), appending why to the yielded list."""
    stop = asyncio.Event()
    over: list[RunOver] = []

    async def report() -> None:
        while True:
            heartbeat.metrics = figures()
            await asyncio.sleep(ctx.cfg.timeouts.heartbeat_s)

    async def watch() -> None:
        over.append(await stop_when_over(ctx, on_done, stop))

    tasks = [asyncio.create_task(report()), asyncio.create_task(watch())]
    try:
        yield stop, over
    finally:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)


async def stop_when_over(ctx: RoleContext, on_done: str, stop: asyncio.Event) -> RunOver:
    """Set `stop` when the run is over for this role and return why. With `on_done == "stay"` a done run does not
    stop the role (the embedded launcher still evaluates through it and stops it itself); a failed or vanished
    trainer always does."""
    while True:
        over = await ctx.watch_run()
        if over.exit_code != 0 or on_done == "exit":
            log.log(logging.INFO if over.exit_code == 0 else logging.ERROR, "%s[%s]: stopping: %s", ctx.role,
                    ctx.role_id, over.reason)
            stop.set()
            return over
        await asyncio.Event().wait()  # stay: until the launcher stops this process
