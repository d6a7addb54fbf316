"""An environment writer's generation servers: one client per server, and finding lost servers again.

The scheduler marks a server down when a request to it got no answer (`RolloutScheduler.request_lost`). Every
`probe_s` the writer looks each down server up again in the rendezvous: a restarted server has published a new
address (its epoch grew), one that was only unreachable (stopped, partitioned) keeps its old one. A server counts as
back once its `/health` answers with status "ok" or "updating" (a server whose weight update failed answers "failed"
until the trainer's next push succeeds) AND a policy version the next training step accepts (a restarted server
starts from the last committed checkpoint, possibly older than that: its samples would all be dropped as stale, so
it gets requests only once the trainer's weight group has brought it up to date); the writer then reports it back
(`server_returned`).

Invariant: `self[i]` is the client of the server the scheduler calls `i` (the i-th generation id in id order).
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Iterator
from typing import Any

import httpx

from asyncrl.generation.client import GenerationClient
from asyncrl.roles.context import RoleContext, base_url
from asyncrl.rpc.http import RemoteError

log = logging.getLogger(__name__)

SERVING = ("ok", "updating")


class GenerationServers:
    def __init__(self, ctx: RoleContext, http: httpx.AsyncClient, docs: list[dict[str, Any]], timeout_s: float,
                 probe_s: float = 1.0, probe_timeout_s: float = 2.0) -> None:
        self.ctx, self.http, self.timeout_s = ctx, http, timeout_s
        self.ids = [str(d["id"]) for d in docs]
        self.epochs = [int(d.get("epoch", 0)) for d in docs]
        self.clients = [GenerationClient(base_url(d), http, timeout_s) for d in docs]
        self.probe_s, self.probe_timeout_s = probe_s, probe_timeout_s
        self._last_probe = 0.0

    def __getitem__(self, i: int) -> GenerationClient:
        return self.clients[i]

    def __len__(self) -> int:
        return len(self.clients)

    def __iter__(self) -> Iterator[GenerationClient]:
        return iter(self.clients)

    async def _probe(self, i: int, min_version: int) -> bool:
        doc = await asyncio.to_thread(self.ctx.store.get_json, self.ctx.paths.rendezvous("generation", self.ids[i]))
        if not isinstance(doc, dict) or "host" not in doc or "port" not in doc:
            return False  # withdrawn, or not published again yet
        url = base_url(doc)
        client = self.clients[i] if url == self.clients[i].base_url else GenerationClient(url, self.http,
                                                                                            self.timeout_s)
        try:
            health = await client.health(self.probe_timeout_s)
            status, version = health.get("status"), int(health.get("version", -1))
        except (RemoteError, TypeError, ValueError):
            return False
        if status not in SERVING or version < min_version:
            return False
        if client is not self.clients[i]:
            log.info("generation server %s is back at %s (epoch %s)", self.ids[i], url, doc.get("epoch"))
        self.clients[i], self.epochs[i] = client, int(doc.get("epoch", 0))
        return True

    async def returned(self, down: list[int], min_version: int) -> list[int]:
        """Of the `down` servers, those serving again at a policy version >= `min_version` (at most one look every
        `probe_s`)."""
        if not down or time.monotonic() - self._last_probe < self.probe_s:
            return []
        self._last_probe = time.monotonic()
        back = await asyncio.gather(*(self._probe(i, min_version) for i in down))
        return [i for i, ok in zip(down, back, strict=True) if ok]


def log_lost(d: Any, err: RemoteError) -> None:
    log.warning("request %s: generation server %d did not answer (%s): re-sent elsewhere", d.request_id, d.server, err)
