"""Container health probe for asyncrl role images: `GET /health` on the role's HTTP port (stdlib only).

The roles bind port 0 (a free port) and publish the real one in S3, so the probe finds the port itself:
- `ASYNCRL_PORT` set and non-zero: probe `http://127.0.0.1:$ASYNCRL_PORT/health` only;
- otherwise: the TCP sockets in LISTEN state owned by the role process (`ASYNCRL_HEALTH_PID`, default 1, the
  container's entrypoint), read from /proc; each is probed until one answers 200.
`ASYNCRL_HEALTH` picks what "healthy" means: `http` (default) needs a listening port that answers 200; `auto`
also passes when the process listens on no port (roles without a server, e.g. environment or training).
Exit status: 0 healthy, 1 unhealthy (Docker's HEALTHCHECK contract). Every request has a deadline
(`ASYNCRL_HEALTH_TIMEOUT_S`, default 3 s).
"""

from __future__ import annotations

import ipaddress
import os
import sys
import urllib.error
import urllib.request
from collections.abc import Iterable

LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp{,6}


def parse_proc_net_tcp(text: str) -> list[tuple[str, int, int]]:
    """(local address, port, socket inode) of every LISTEN socket in a /proc/net/tcp or tcp6 table.

    Addresses in the table are hex in host byte order per 32-bit word (little-endian on x86/arm64).
    """
    out: list[tuple[str, int, int]] = []
    for line in text.splitlines()[1:]:
        fields = line.split()
        if len(fields) < 10 or fields[3] != LISTEN:
            continue
        addr_hex, port_hex = fields[1].split(":")
        raw = bytes.fromhex(addr_hex)
        packed = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
        out.append((str(ipaddress.ip_address(packed)), int(port_hex, 16), int(fields[9])))
    return out


def socket_inodes(pid: int, proc: str = "/proc") -> set[int] | None:
    """Inodes of the sockets process `pid` holds open; None when its fd table cannot be read."""
    fd_dir = f"{proc}/{pid}/fd"
    try:
        names = os.listdir(fd_dir)
    except OSError:
        return None
    inodes: set[int] = set()
    for name in names:
        try:
            target = os.readlink(f"{fd_dir}/{name}")
        except OSError:
            continue
        if target.startswith("socket:[") and target.endswith("]"):
            inodes.add(int(target[len("socket:["):-1]))
    return inodes


def probe_targets(listeners: Iterable[tuple[str, int, int]], owned: set[int] | None) -> list[tuple[str, int]]:
    """(host, port) to probe: listeners owned by the process (all when `owned` is None); wildcard → loopback."""
    targets: list[tuple[str, int]] = []
    for addr, port, inode in listeners:
        if owned is not None and inode not in owned:
            continue
        ip = ipaddress.ip_address(addr)
        host = ("::1" if ip.version == 6 else "127.0.0.1") if ip.is_unspecified else addr
        if (host, port) not in targets:
            targets.append((host, port))
    return targets


def healthy(host: str, port: int, timeout_s: float, token: str = "") -> bool:
    """True when `GET http://host:port/health` answers 200 within `timeout_s`; the role servers require the run's
    bearer token (`ASYNCRL_ROLE_TOKEN`, sent when set)."""
    netloc = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    headers = {"Authorization": f"Bearer {token}"} if token else {}
    request = urllib.request.Request(f"http://{netloc}/health", headers=headers)
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as resp:  # noqa: S310
            return resp.status == 200
    except (OSError, urllib.error.URLError, ValueError):
        return False


def discover(pid: int, proc: str = "/proc") -> list[tuple[str, int]]:
    listeners: list[tuple[str, int, int]] = []
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc}/net/{table}") as f:
                listeners += parse_proc_net_tcp(f.read())
        except OSError:
            continue
    return probe_targets(listeners, socket_inodes(pid, proc))


def main(env: dict[str, str] | None = None) -> int:
    env = dict(os.environ) if env is None else env
    mode = env.get("ASYNCRL_HEALTH", "http")
    if mode not in ("http", "auto"):
        print(f"ASYNCRL_HEALTH={mode!r}: expected 'http' or 'auto'", file=sys.stderr)
        return 1
    timeout_s = float(env.get("ASYNCRL_HEALTH_TIMEOUT_S", "3"))
    port = int(env.get("ASYNCRL_PORT", "0") or "0")
    if port:
        targets = [("127.0.0.1", port)]
    else:
        targets = discover(int(env.get("ASYNCRL_HEALTH_PID", "1")))
        if not targets:
            if mode == "auto":
                return 0
            print("no listening port found for the role process", file=sys.stderr)
            return 1
    token = env.get("ASYNCRL_ROLE_TOKEN", "").strip()
    for host, p in targets:
        if healthy(host, p, timeout_s, token):
            return 0
    print(f"GET /health failed on {targets}", file=sys.stderr)
    return 1


if __name__ == "__main__":
    sys.exit(main())
