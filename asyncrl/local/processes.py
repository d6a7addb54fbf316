"""Child processes of the embedded launcher: started in their own session, logged to files, always reaped.

Each role runs as `python -m asyncrl.roles.<role>` exactly as a cluster would start it. A child is started in a
new process session so that its own children (vLLM's EngineCore and workers, DeepSpeed helpers) can be stopped
as a group: SIGTERM to the group, then SIGKILL after a grace period. Each child also asks Linux for SIGTERM when
the launcher dies (`die_with_parent`), so a launcher killed outright leaves no role behind.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from asyncrl.roles.liveness import ORPHAN_ENV

log = logging.getLogger(__name__)

_PR_SET_PDEATHSIG = 1


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()  # loaded in the parent: the child must not dlopen between fork and exec


def die_with_parent() -> None:  # pragma: no cover - runs in the child between fork and exec
    """Ask Linux to SIGTERM the child when the thread that started it dies (no orphan servers or roles)."""
    if _LIBC is not None:
        _LIBC.prctl(_PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Child:
    name: str
    proc: subprocess.Popen
    log_path: Path
    module: str = ""
    args: tuple[str, ...] = ()
    restarts: int = 0

    def alive(self) -> bool:
        return self.proc.poll() is None

    def tail(self, lines: int = 30) -> str:
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return ""
        return "\n".join(text.splitlines()[-lines:])


class ProcessGroup:
    """The set of role processes of one run. Each starts in a session of its own, is sent SIGTERM by the kernel when
    the thread that started it ends (`die_with_parent`), and ends itself if that stop hangs (`ORPHAN_ENV`)."""

    def __init__(self, log_dir: Path, env: dict[str, str]) -> None:
        self.log_dir = log_dir
        self.env = {**env, ORPHAN_ENV: "1"}
        self.children: list[Child] = []
        log_dir.mkdir(parents=True, exist_ok=True)

    def start(self, name: str, module: str, args: list[str]) -> Child:
        log_path = self.log_dir / f"{name}.log"
        out = open(log_path, "ab")  # noqa: SIM115 - owned by the child for its lifetime
        proc = subprocess.Popen(
            [sys.executable, "-m", module, *args], stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            env=self.env, start_new_session=True, preexec_fn=die_with_parent,  # noqa: PLW1509
        )
        out.close()
        child = Child(name, proc, log_path, module, tuple(args))
        self.children.append(child)
        log.info("started %s (pid %d), log %s", name, proc.pid, log_path)
        return child

    def failed(self) -> Child | None:
        """The first child that exited with an error, if any."""
        for c in self.children:
            rc = c.proc.poll()
            if rc not in (None, 0):
                return c
        return None

    def restart(self, child: Child) -> Child:
        """Start an exited child again with the same module and arguments (its log continues); what is left of its
        session (an engine core whose parent died) is killed first."""
        if child.alive():
            raise ValueError(f"restart: {child.name} is still running")
        _signal_group(child.proc.pid, signal.SIGKILL)
        self.children.remove(child)
        fresh = self.start(child.name, child.module, list(child.args))
        fresh.restarts = child.restarts + 1
        return fresh

    def stop(self, child: Child, grace_s: float = 25.0) -> None:
        if child.alive():
            _signal_group(child.proc.pid, signal.SIGTERM)
            try:
                child.proc.wait(grace_s)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs: killing", child.name, grace_s)
        # whatever is left of its session (engine cores, workers) goes too
        _signal_group(child.proc.pid, signal.SIGKILL)
        try:
            child.proc.wait(5)
        except subprocess.TimeoutExpired:
            log.error("%s (pid %d) survived SIGKILL", child.name, child.proc.pid)

    def stop_all(self, grace_s: float = 25.0) -> None:
        for c in reversed(self.children):
            if c.alive():
                _signal_group(c.proc.pid, signal.SIGTERM)
        deadline = time.monotonic() + grace_s
        for c in reversed(self.children):
            remaining = max(0.1, deadline - time.monotonic())
            try:
                c.proc.wait(remaining)
            except subprocess.TimeoutExpired:
                log.warning("%s did not stop within %.0fs: killing", c.name, grace_s)
        for c in self.children:
            _signal_group(c.proc.pid, signal.SIGKILL)
            try:
                c.proc.wait(5)
            except subprocess.TimeoutExpired:
                log.error("%s (pid %d) survived SIGKILL", c.name, c.proc.pid)


def _signal_group(pid: int, sig: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, sig)
