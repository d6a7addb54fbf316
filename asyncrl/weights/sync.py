"""Weight sync over a standalone torch.distributed group: joining the group, the broadcast protocol, and
the trainer-side `WeightSender`.

Topology: the trainer is rank 0 and hosts the rendezvous `TCPStore`; each generation worker is one more
rank: a server of tensor-parallel size TP has TP workers, ranks first..first+TP-1 (`group_ranks`), so
world_size = 1 + servers x TP. The group is NOT the default
process group (vLLM's worker already owns that one, and so may the trainer's DeepSpeed): it is a
`ProcessGroupGloo` / `ProcessGroupNCCL` built directly over a `PrefixStore` of the trainer's store.

Both sides of every step block together: the trainer joins (or broadcasts) while, concurrently, it asks
each server over HTTP to join (or receive). Every join, broadcast and HTTP call has a deadline; a
failure raises, and the sender then refuses to push until `connect()` is called again. Each `connect()`
forms a new group, an *epoch*, possibly with other servers (`asyncrl.roles.weight_group` decides which):
its keys live under a fresh name, so nothing of an earlier epoch's group is read.

The wire format (manifest header, then buckets) is in `asyncrl.weights.buckets`.
"""

from __future__ import annotations

import datetime
import logging
import socket
import threading
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

import httpx
import torch
import torch.distributed as dist

from asyncrl.rpc.auth import auth_headers
from asyncrl.weights.buckets import (
    MAX_MANIFEST_BYTES,
    Manifest,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
    weights_checksum,
)

log = logging.getLogger(__name__)

BACKENDS = ("gloo", "nccl")
DEFAULT_BUCKET_BYTES = 16 * 1024 * 1024

__all__ = [
    "WeightSender",
    "WeightSyncError",
    "join_group",
    "receive_weights",
    "send_weights",
    "weights_checksum",
]


class WeightSyncError(RuntimeError):
    """A weight-sync step failed or missed its deadline."""


def local_ip_towards(host: str) -> str:
    """The local address this machine uses to reach `host` (no packet is sent: UDP connect only)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        try:
            s.connect((host, 9))
            return str(s.getsockname()[0])
        except OSError:
            return "127.0.0.1"


def listen_socket(addr: str) -> socket.socket:
    """A TCP socket bound to `addr` on a free port and listening: the rendezvous store serves on it alone."""
    family = socket.AF_INET6 if ":" in addr else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        sock.bind((addr, 0))
        sock.listen(128)
    except OSError as e:
        sock.close()
        raise WeightSyncError(f"master_addr: cannot listen on {addr!r} ({e}); expected an address of this host "
                              "(the trainer's pod IP on a cluster)") from e
    return sock


def join_group(
    *,
    store: dist.Store,
    rank: int,
    world_size: int,
    backend: str,
    timeout_s: float,
    group_name: str,
    local_addr: str,
) -> dist.ProcessGroup:
    """Build a standalone process group over `store` (blocks until every rank has joined, or raises).

    `store` is the trainer's TCPStore (rank 0 hosts it, the others are its clients); keys are kept under
    `group_name` so a reconnect never reads a previous group's keys.
    """
    if backend not in BACKENDS:
        raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
    if not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size={world_size}, got {rank}")
    timeout = datetime.timedelta(seconds=timeout_s)
    prefixed = dist.PrefixStore(f"asyncrl/{group_name}/", store)
    if backend == "gloo":
        opts = dist.ProcessGroupGloo._Options()
        opts._timeout = timeout
        opts._devices = [dist.ProcessGroupGloo.create_device(hostname=local_addr)]
        opts._threads = 2
        return dist.ProcessGroupGloo(prefixed, rank, world_size, opts)
    nccl_opts = dist.ProcessGroupNCCL.Options()  # only present in CUDA builds of torch
    nccl_opts._timeout = timeout
    pg = dist.ProcessGroupNCCL(prefixed, rank, world_size, nccl_opts)
    barrier_device = torch.device("cuda", torch.cuda.current_device())
    _broadcast(pg, torch.zeros(1, device=barrier_device), timeout_s)  # eager connect, under the deadline
    return pg


def shutdown_group(pg: dist.ProcessGroup | None) -> None:
    """Shut a weight-sync group down, best effort (the peer may already be gone)."""
    if pg is None:
        return
    try:
        pg.shutdown()
    except Exception as e:  # noqa: BLE001 - best effort
        log.debug("weight sync: process group shutdown: %s", e)


def _broadcast(pg: dist.ProcessGroup, tensor: torch.Tensor, timeout_s: float) -> None:
    opts = dist.BroadcastOptions()
    opts.rootRank = 0
    opts.rootTensor = 0
    opts.timeout = datetime.timedelta(seconds=timeout_s)
    work = pg.broadcast([tensor], opts)
    work.wait(datetime.timedelta(seconds=timeout_s))


def send_weights(
    pg: dist.ProcessGroup, manifest: Manifest, tensors: dict[str, torch.Tensor], device: torch.device, timeout_s: float
) -> None:
    """Rank 0: broadcast the manifest header, then every bucket (each collective under `timeout_s`)."""
    header = torch.frombuffer(bytearray(manifest.to_json_bytes()), dtype=torch.uint8).to(device)
    _broadcast(pg, torch.tensor([header.numel()], dtype=torch.int64, device=device), timeout_s)
    _broadcast(pg, header, timeout_s)
    for i in range(len(manifest.bucket_sizes)):
        _broadcast(pg, pack_bucket(manifest, i, tensors, device), timeout_s)


def receive_weights(
    pg: dist.ProcessGroup,
    device: torch.device,
    timeout_s: float,
    on_bucket: Callable[[list[tuple[str, torch.Tensor]]], None],
) -> Manifest:
    """Rank > 0: receive the header and every bucket; hand each bucket's tensors (views) to `on_bucket`."""
    length = torch.zeros(1, dtype=torch.int64, device=device)
    _broadcast(pg, length, timeout_s)
    n = int(length.item())
    if not 0 < n <= MAX_MANIFEST_BYTES:
        raise WeightSyncError(f"weight manifest length: expected 1..{MAX_MANIFEST_BYTES} bytes, got {n}")
    header = torch.empty(n, dtype=torch.uint8, device=device)
    _broadcast(pg, header, timeout_s)
    manifest = Manifest.from_json_bytes(header.cpu().numpy().tobytes())
    for i, size in enumerate(manifest.bucket_sizes):
        buf = torch.empty(size, dtype=torch.uint8, device=device)
        _broadcast(pg, buf, timeout_s)
        on_bucket(unpack_bucket(manifest, i, buf))
    return manifest


class _Concurrent:
    """Run one local blocking step and several HTTP calls at the same time, with one deadline."""

    def __init__(self, deadline_s: float) -> None:
        self.deadline = time.monotonic() + deadline_s
        self.errors: list[str] = []
        self.results: dict[str, Any] = {}
        self._threads: list[threading.Thread] = []
        self._lock = threading.Lock()

    def start(self, key: str, fn: Callable[[], Any]) -> None:
        def run() -> None:
            try:
                value = fn()
                with self._lock:
                    self.results[key] = value
            except BaseException as e:  # noqa: BLE001 - reported to the caller below
                with self._lock:
                    self.errors.append(f"{key}: {type(e).__name__}: {e}")

        t = threading.Thread(target=run, name=f"weight-sync-{key}", daemon=True)
        t.start()
        self._threads.append(t)

    def wait(self, what: str) -> dict[str, Any]:
        """Wait for all; raise WeightSyncError at the first error or at the deadline."""
        while True:
            with self._lock:
                if self.errors:
                    raise WeightSyncError(f"{what} failed: {'; '.join(self.errors)}")
            alive = [t for t in self._threads if t.is_alive()]
            if not alive:
                return self.results
            if time.monotonic() > self.deadline:
                raise WeightSyncError(f"{what}: deadline passed, still waiting for {[t.name for t in alive]}")
            alive[0].join(timeout=0.05)


def _post(client: httpx.Client, url: str, body: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """POST to a generation server with the run's bearer token (`ASYNCRL_ROLE_TOKEN`, when set)."""
    r = client.post(url, json=body, headers=auth_headers(), timeout=timeout_s)
    if r.status_code != 200:
        raise WeightSyncError(f"POST {url} -> HTTP {r.status_code}: {r.text[:500]}")
    return dict(r.json())


def group_ranks(servers: int, workers_per_server: int) -> tuple[int, list[int]]:
    """Pure: the weight group's world size and each server's first rank. The trainer is rank 0; server i's
    workers (one per GPU of its tensor-parallel engine) are ranks 1 + i*TP .. i*TP + TP."""
    if servers < 1 or workers_per_server < 1:
        raise ValueError(f"expected at least one server and one worker per server, got {servers} x "
                         f"{workers_per_server}")
    return 1 + servers * workers_per_server, [1 + i * workers_per_server for i in range(servers)]


class WeightSender:
    """Trainer side of weight sync: rank 0 of a group whose other ranks are the generation workers.

    Usage: `connect()` once, then `push(version, named_tensors)` after each training step, `close()` at the
    end. Not thread-safe; one push at a time. After any failure the group is unusable: call `connect()`.
    """

    def __init__(
        self,
        server_urls: Sequence[str],
        backend: str = "gloo",
        timeout_s: float = 300.0,
        bucket_bytes: int = DEFAULT_BUCKET_BYTES,
        master_addr: str = "127.0.0.1",
        device: str | torch.device = "cpu",
        workers_per_server: int = 1,
        lora_scale: float = 0.0,
    ) -> None:
        """`lora_scale` > 0: every push is a LoRA adapter of that scale (`asyncrl.adapters.lora`), and a server
        joins only if it serves adapters of that scale (it refuses the join otherwise, naming why)."""
        if workers_per_server < 1:
            raise ValueError(f"workers_per_server: expected >= 1 (a server's tensor-parallel size), got "
                             f"{workers_per_server}")
        if not server_urls:
            raise ValueError("server_urls: expected at least one generation server URL")
        if backend not in BACKENDS:
            raise ValueError(f"backend: expected one of {BACKENDS}, got {backend!r}")
        self.server_urls = [u.rstrip("/") for u in server_urls]
        self.backend = backend
        self.timeout_s = float(timeout_s)
        self.bucket_bytes = int(bucket_bytes)
        self.master_addr = master_addr
        self.device = torch.device(device)
        self.workers_per_server = int(workers_per_server)
        self.lora_scale = float(lora_scale)
        self._store: dist.TCPStore | None = None
        self._pg: dist.ProcessGroup | None = None
        # One HTTP client for every call (thread-safe; its connections kept alive): building an httpx client loads
        # the CA bundle, 30-60 ms of CPU, which a client per call added to every weight push.
        self._http = httpx.Client()
        self.epoch = 0  # groups formed so far (`connect()` calls that succeeded)

    @property
    def world_size(self) -> int:
        return group_ranks(len(self.server_urls), self.workers_per_server)[0]

    @property
    def connected(self) -> bool:
        return self._pg is not None

    def connect(self, server_urls: Sequence[str] | None = None) -> None:
        """Host the TCPStore (free port), ask every server to join, join as rank 0; all under the deadline.
        `server_urls`: the members of the new group (default: the current ones)."""
        self.close()
        if server_urls is not None:
            if not server_urls:
                raise ValueError("server_urls: expected at least one generation server URL")
            self.server_urls = [u.rstrip("/") for u in server_urls]
        # A server still inside a broken collective of the previous epoch answers only once that collective's own
        # deadline passed (it holds its update lock until then), so joining waits up to twice the deadline.
        join_s = 2 * self.timeout_s
        timeout = datetime.timedelta(seconds=join_s)
        # The store listens on `master_addr` only (the pod's IP on a cluster, loopback here), never on every
        # interface: torch's TCPStore has no authentication and lists its keys to any client that connects.
        listener = listen_socket(self.master_addr)
        port = listener.getsockname()[1]
        # the store owns the socket from here on (it closes it when it is destroyed)
        store = dist.TCPStore(self.master_addr, port, self.world_size, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=listener.detach())
        self._store = store
        group_name = f"epoch{self.epoch + 1}-{uuid.uuid4().hex}"
        log.info("weight sync: hosting rendezvous on %s:%d for %d ranks", self.master_addr, store.port, self.world_size)
        step = _Concurrent(join_s + 30.0)
        first_ranks = group_ranks(len(self.server_urls), self.workers_per_server)[1]
        for url, first_rank in zip(self.server_urls, first_ranks, strict=True):
            body = {
                "master_addr": self.master_addr,
                "master_port": store.port,
                "rank": first_rank,  # of the server's first worker; its worker of TP rank r joins as first_rank + r
                "world_size": self.world_size,
                "backend": self.backend,
                "timeout_s": self.timeout_s,
                "group_name": group_name,
                "lora_scale": self.lora_scale,
            }
            step.start(url, lambda url=url, body=body: _post(self._http, f"{url}/weights/init", body, join_s + 30.0))
        step.start(
            "trainer-join",
            lambda: join_group(
                store=store, rank=0, world_size=self.world_size, backend=self.backend, timeout_s=join_s,
                group_name=group_name, local_addr=local_ip_towards(self.master_addr),
            ),
        )
        results = step.wait("weight sync connect")
        self._pg = results["trainer-join"]
        self.epoch += 1

    def push(self, version: int, named_tensors: Sequence[tuple[str, torch.Tensor]]) -> dict[str, Any]:
        """Broadcast `named_tensors` as policy `version` to every server; return the servers' responses."""
        if self._pg is None:
            raise WeightSyncError("push: not connected (call connect() first, or again after a failure)")
        tensors = {name: t.detach() for name, t in named_tensors}
        if len(tensors) != len(named_tensors):
            raise ValueError("named_tensors: duplicate names")
        manifest = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()], self.bucket_bytes, version)
        pg = self._pg
        step = _Concurrent(self.timeout_s + 30.0)
        for url in self.server_urls:
            body = {"version": version, "timeout_s": self.timeout_s}
            step.start(url, lambda url=url, body=body: _post(self._http, f"{url}/weights/update", body,
                                                             self.timeout_s + 30.0))
        step.start("trainer-send", lambda: send_weights(pg, manifest, tensors, self.device, self.timeout_s))
        try:
            results = step.wait(f"weight push of version {version}")
        except WeightSyncError:
            self._pg = None  # a half-done broadcast leaves the group out of step: reconnect
            shutdown_group(pg)  # best effort: closes the connections, so the peers' collective fails sooner
            raise
        return {url: results[url] for url in self.server_urls}

    def close(self) -> None:
        """Leave the group (a later `connect()` forms a new one); the HTTP client stays for it."""
        pg, self._pg = self._pg, None
        shutdown_group(pg)
        self._store = None

    def shutdown(self) -> None:
        """`close()`, and close the HTTP client: the sender is not used again."""
        self.close()
        self._http.close()
