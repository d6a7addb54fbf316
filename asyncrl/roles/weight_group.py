"""The trainer's weight-sync group over the generation servers that are alive: which servers it holds, and forming
it again when one is lost or one comes back.

Each formed group is an *epoch* (`WeightSender.epoch`). The group is formed again, before a push, when:
- the push before failed or missed its deadline (a server died, hung, or broke the collective): every published
  server is probed and the group re-forms with those that answer, then the push is sent again (once: a second
  failure fails the step);
- a published server outside the group answers again: a restarted server (its rendezvous document carries a new
  address and a higher epoch) or one that was only unreachable. Servers outside the group are probed at most
  every `probe_s`.
A server answers when `GET /health` returns 200 within `probe_timeout_s` with a status other than "dead". The same
version may be pushed again after a re-form (a server that already holds it reloads the same weights).
With no server answering, the trainer waits up to `timeouts.rendezvous_s` for one, then fails naming the servers.
The current epoch and members are published in `versions/latest.json` (`weight_group`) and as metrics.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

import httpx
import torch

from asyncrl.roles.context import RoleContext, base_url, poll_rendezvous
from asyncrl.rpc.auth import auth_headers
from asyncrl.weights.buckets import DTYPES, wire_tensors
from asyncrl.weights.sync import WeightSender, WeightSyncError, weights_checksum

log = logging.getLogger(__name__)


class WeightGroup:
    def __init__(self, ctx: RoleContext, device: torch.device, probe_s: float = 5.0,
                 probe_timeout_s: float = 3.0) -> None:
        self.ctx, self.cfg = ctx, ctx.cfg
        self.device = device
        self.probe_s, self.probe_timeout_s = probe_s, probe_timeout_s
        self.members: list[dict[str, Any]] = []  # rendezvous documents of the servers in the group
        self.sender: WeightSender | None = None
        self.reforms = 0  # groups formed after the first
        self.failed_pushes = 0
        self._last_probe = 0.0
        self._http = httpx.Client()  # one client: building one costs 30-60 ms of CPU (see WeightSender)
        # the engines' dtype: the trainer's (float32 master) weights travel cast to it (`wire`)
        self.wire_dtype = DTYPES[self.cfg.generation.dtype]

    # ---- membership ----------------------------------------------------------------------------------
    def _published(self) -> list[dict[str, Any]]:
        return poll_rendezvous(self.ctx.store, self.ctx.paths, "generation", 0, every=True) or []

    def _answers(self, doc: dict[str, Any]) -> bool:
        try:
            r = self._http.get(f"{base_url(doc)}/health", headers=auth_headers(), timeout=self.probe_timeout_s)
            return r.status_code == 200 and r.json().get("status") != "dead"
        except (httpx.HTTPError, ValueError, AttributeError):
            return False

    def _key(self, doc: dict[str, Any]) -> tuple[str, str]:
        return str(doc["id"]), base_url(doc)

    def _candidates(self, probe_all: bool) -> list[dict[str, Any]]:
        """The published servers to form the group with: members kept as they are (unless `probe_all`), the others
        only if they answer."""
        held = {self._key(d) for d in self.members}
        out = []
        for doc in self._published():
            if (not probe_all and self._key(doc) in held) or self._answers(doc):
                out.append(doc)
        return out

    def _form(self, docs: list[dict[str, Any]]) -> None:
        assert self.sender is not None
        self.sender.connect([base_url(d) for d in docs])
        if self.members:
            self.reforms += 1
        self.members = docs
        log.info("weight group epoch %d: generation servers %s", self.sender.epoch,
                 [f"{d['id']}@{base_url(d)} (epoch {d.get('epoch', 0)})" for d in docs])

    def _reform_with_live_servers(self) -> None:
        deadline = time.monotonic() + self.cfg.timeouts.rendezvous_s
        while True:
            docs = self._candidates(probe_all=True)
            if docs:
                self._form(docs)
                return
            if time.monotonic() > deadline:
                raise TimeoutError(f"weight group: no generation server answered within "
                                   f"{self.cfg.timeouts.rendezvous_s:.0f}s (published: "
                                   f"{[base_url(d) for d in self._published()]})")
            time.sleep(1.0)

    # ---- the trainer's calls -------------------------------------------------------------------------
    def connect(self) -> None:
        """Wait for `generation.num_servers` servers to publish, then form the first group with all of them."""
        docs = self.ctx.wait_for_peers("generation", self.cfg.generation.num_servers)
        self.sender = WeightSender([base_url(d) for d in docs], backend="nccl" if self.device.type == "cuda" else "gloo",
                                   timeout_s=self.cfg.timeouts.collective_s,
                                   bucket_bytes=int(self.cfg.training.weight_bucket_mb * 2**20), device=self.device,
                                   master_addr=self.ctx.advertise_host,
                                   workers_per_server=self.cfg.generation.tensor_parallel_size,
                                   lora_scale=self.cfg.training.lora.scale if self.cfg.training.lora else 0.0)
        self._form(docs)

    def wire(self, weights: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """`weights` as the engines hold them: floating-point tensors cast to `generation.dtype`."""
        return wire_tensors(weights, self.wire_dtype)

    def checksum(self, weights: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
        """The checksum of `weights` as the engines hold them (comparable with their `/weights/checksum`)."""
        return weights_checksum(self.wire(weights))

    def push(self, version: int, weights: list[tuple[str, torch.Tensor]], checksum: bool = True) -> dict[str, float]:
        """Send `weights` as `version` to the servers that are alive (re-forming the group first when a server came
        back or the last push failed); returns the checksum of what was sent (the weights cast to
        `generation.dtype`), or {} without `checksum` (on a GPU it copies every weight to the host: compute it only
        where it is compared)."""
        assert self.sender is not None, "connect() first"
        weights = self.wire(weights)
        if not self.sender.connected:
            self._reform_with_live_servers()
        elif time.monotonic() - self._last_probe > self.probe_s:
            self._last_probe = time.monotonic()
            docs = self._candidates(probe_all=False)
            if docs and {self._key(d) for d in docs} != {self._key(d) for d in self.members}:
                self._form(docs)
        # the checksum is computed while the servers receive (the weights do not change during a push)
        summed: dict[str, float] = {}
        summing = threading.Thread(target=lambda: summed.update(weights_checksum(weights)),
                                   name="weights-checksum") if checksum else None
        if summing is not None:
            summing.start()
        try:
            self.sender.push(version, weights)
        except WeightSyncError as err:
            self.failed_pushes += 1
            log.warning("weight push of version %d to epoch %d failed: %s; re-forming the group with the servers that "
                        "answer", version, self.sender.epoch, err)
            self._reform_with_live_servers()
            self.sender.push(version, weights)
        finally:
            if summing is not None:
                summing.join()
        return summed

    def metrics(self) -> dict[str, float]:
        epoch = self.sender.epoch if self.sender else 0
        return {"weights/group_epoch": float(epoch), "weights/group_servers": float(len(self.members)),
                "weights/group_reforms": float(self.reforms), "weights/failed_pushes": float(self.failed_pushes)}

    def document(self) -> dict[str, Any]:
        """`weight_group` of `versions/latest.json`: the epoch and its servers (id, address, rendezvous epoch)."""
        return {"epoch": self.sender.epoch if self.sender else 0,
                "servers": [{"id": d["id"], "url": base_url(d), "epoch": int(d.get("epoch", 0))}
                            for d in self.members]}

    def close(self) -> None:
        if self.sender is not None:
            self.sender.shutdown()
        self._http.close()
