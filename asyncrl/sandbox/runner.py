"""`run_python`: run one model-written Python program in a fresh sandbox and return its capped output.

Isolation is the kernel's (namespaces, see `command.py`; the seccomp filter of `seccomp.py`, installed by the
program's own interpreter before it reads a byte of model code). Inside the interpreter an audit hook stays as
defence in depth only: it refuses what the kernel refuses anyway, with clearer errors.

The caller cannot be hung or flooded: stdout and stderr are read as they come, each up to `max_output_bytes`
(past that the sandbox is killed and `overflow` set); one deadline bounds the whole call, the waits after a kill
included (`KILL_GRACE_S`); killing bwrap ends its PID namespace, so nothing the program started survives; what
the program printed before a timeout is kept.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
import signal
import time
from dataclasses import dataclass

from asyncrl.sandbox.command import bwrap_argv, drop_privileges, set_limits
from asyncrl.sandbox.host import sandbox_host
from asyncrl.sandbox.seccomp import build_filter

MAX_CODE_CHARS = 100_000
KILL_GRACE_S = 1.0  # after a kill, how long the pipes may take to close before we stop reading them

SECCOMP_INSTALL = r'''
def _seccomp(hexprog):
    import ctypes
    prog = bytes.fromhex(hexprog)
    libc = ctypes.CDLL(None, use_errno=True)
    class Fprog(ctypes.Structure):
        _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]
    buf = ctypes.create_string_buffer(prog, len(prog))
    fprog = Fprog(len(prog) // 8, ctypes.addressof(buf))
    if libc.prctl(38, 1, 0, 0, 0) != 0:  # PR_SET_NO_NEW_PRIVS (bwrap set it already)
        raise OSError(ctypes.get_errno(), "PR_SET_NO_NEW_PRIVS failed")
    if libc.prctl(22, 2, ctypes.byref(fprog), 0, 0) != 0:  # PR_SET_SECCOMP, SECCOMP_MODE_FILTER
        raise OSError(ctypes.get_errno(), "PR_SET_SECCOMP failed")
'''

_BOOTSTRAP = "import sys\n" + SECCOMP_INSTALL + r'''
def _hook():
    import os
    root = os.path.realpath(os.getcwd())
    stdlib = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    deny = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.system",
            "os.kill", "os.killpg", "ctypes.", "pty.", "os.chroot", "os.setuid", "gc.", "sys.settrace",
            "sys.setprofile", "sys._current_frames", "sys.addaudithook", "code.__new__")
    paths = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
             "os.truncate", "os.utime", "os.chdir", "os.listdir", "os.scandir")
    def inside(p, allow_stdlib):
        if isinstance(p, int):
            return True
        try:
            real = os.path.realpath(os.fsdecode(p))
        except Exception:
            return False
        return real == root or real.startswith(root + os.sep) or (allow_stdlib and real.startswith(stdlib))
    def hook(event, args):
        if event.startswith(deny):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args[0], args[1] or "r", args[2]
            writing = any(c in str(mode) for c in "wax+") or (
                isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC)))
            if not inside(path, allow_stdlib=not writing):
                raise PermissionError(f"sandbox: open {path!r} outside the sandbox folder")
        elif event in paths:
            for p in args[:2]:
                if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, event in ("os.listdir", "os.scandir")):
                    raise PermissionError(f"sandbox: {event} {p!r} outside the sandbox folder")
    sys.addaudithook(hook)
code = compile(sys.stdin.read(), "<sandbox>", "exec")
try:
    _seccomp(sys.argv[1])
except Exception as e:
    sys.stderr.write(f"sandbox: seccomp filter not installed: {e}\n")
    sys.exit(70)
_hook()
del _hook, _seccomp
exec(code, {"__name__": "__main__"})
'''


@functools.cache
def _filter_hex() -> str:
    """The seccomp program as the bootstrap's argument: built once per process, not once per tool call."""
    return build_filter().hex()


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed (deadline or output overflow)
    timed_out: bool
    overflow: bool = False  # killed for printing more than the cap
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out and not self.overflow


async def _read_capped(stream: asyncio.StreamReader, cap: int, buf: bytearray, over: asyncio.Event) -> None:
    while True:
        chunk = await stream.read(65536)
        if not chunk:
            return
        room = cap - len(buf)
        buf += chunk[:max(0, room)]
        if len(chunk) > room:
            over.set()
            return


def _kill(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)  # bwrap's session: its death ends the PID namespace and all inside


async def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 1,
                     max_output: int = 4096, max_output_bytes: int = 65536, tmpfs_mb: int = 16) -> SandboxResult:
    """Run `code` in a new sandbox (module docstring). stdout keeps its first `max_output` characters, stderr its
    last; SandboxUnavailable (from `sandbox_host`) when this host cannot isolate it."""
    if len(code) > MAX_CODE_CHARS:
        raise ValueError(f"code: expected at most {MAX_CODE_CHARS} characters, got {len(code)}")
    if timeout_s <= 0:
        raise ValueError(f"timeout_s: expected > 0, got {timeout_s}")
    host = sandbox_host()
    argv = [*bwrap_argv(host.bwrap, host.python_prefix, tmpfs_mb),
            host.python, "-I", "-S", "-c", _BOOTSTRAP, _filter_hex()]

    def preexec() -> None:
        set_limits(max(1, int(timeout_s) + 1), memory_mb, file_mb)
        drop_privileges(host.drop_to)

    t0 = time.monotonic()
    deadline = t0 + timeout_s
    proc = await asyncio.create_subprocess_exec(
        *argv, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
        env={}, preexec_fn=preexec)
    assert proc.stdin is not None and proc.stdout is not None and proc.stderr is not None
    out, err, over = bytearray(), bytearray(), asyncio.Event()
    readers = {asyncio.create_task(_read_capped(proc.stdout, max_output_bytes, out, over)),
               asyncio.create_task(_read_capped(proc.stderr, max_output_bytes, err, over)),
               asyncio.create_task(proc.wait())}
    overflow_wait = asyncio.create_task(over.wait())
    timed_out = False
    try:
        with contextlib.suppress(BrokenPipeError, ConnectionResetError):
            proc.stdin.write(code.encode())
            await asyncio.wait_for(proc.stdin.drain(), timeout=max(0.0, deadline - time.monotonic()))
            proc.stdin.close()
        pending = set(readers)
        while pending and not over.is_set():
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                timed_out = True
                break
            finished, _ = await asyncio.wait(pending | {overflow_wait}, timeout=remaining,
                                             return_when=asyncio.FIRST_COMPLETED)
            pending -= finished
    except TimeoutError:
        timed_out = True
    finally:
        overflow = over.is_set()
        if proc.returncode is None:  # still running (deadline, overflow, or an error here); once reaped, its pid
            _kill(proc.pid)  # may belong to someone else, and its PID namespace is gone with it anyway
        await asyncio.wait(readers, timeout=KILL_GRACE_S)  # the pipes close once the PID namespace is gone
        if proc.returncode is None:  # bwrap did not die within the grace: stop waiting, never block the caller
            _kill(proc.pid)
        for t in [*readers, overflow_wait]:
            t.cancel()
        await asyncio.gather(*readers, overflow_wait, return_exceptions=True)
        with contextlib.suppress(Exception):
            proc._transport.close()  # type: ignore[attr-defined]  # our pipe ends, whatever holds the others
    exit_code = None if (timed_out or overflow) else proc.returncode
    return SandboxResult(out.decode(errors="replace")[:max_output], err.decode(errors="replace")[-max_output:],
                         exit_code, timed_out, overflow, time.monotonic() - t0)
