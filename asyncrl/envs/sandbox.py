"""A small Python sandbox for tool use: run untrusted code in a child process with limits, no network, no files
outside its folder, and a hard time limit.

Layers (each on its own would not be enough; together they bound what a model's code can do):
- a fresh interpreter (`python -I -S`: no environment variables, no user or site packages) with an empty
  environment, its own process group and its folder as working directory;
- resource limits set before the code starts: CPU seconds, address space, file size, open files;
- an audit hook (PEP 578; it cannot be removed from Python code) installed before the code runs, that refuses
  sockets, subprocesses, exec/fork/spawn, ctypes, `os.system`, `gc` introspection, tracing, compiling new code
  objects by hand, and opening, creating, renaming or removing a path outside the folder (reads of the
  interpreter's own standard library are allowed, so imports work); its settings live in a closure, not in
  globals the code could reach;
- a wall-clock deadline after which the whole process group is killed.
Output is truncated to `max_output` characters. The code is sent on stdin, never through a shell.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import resource
import signal
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

_BOOTSTRAP = r'''
import sys
def _install():
    import os  # a local: the hook must not depend on globals the code can change
    root = os.path.realpath(os.getcwd())
    stdlib = tuple(os.path.realpath(p) for p in {sys.prefix, sys.base_prefix, sys.exec_prefix, sys.base_exec_prefix})
    deny = ("socket.", "subprocess.", "os.exec", "os.posix_spawn", "os.spawn", "os.fork", "os.forkpty", "os.system",
            "os.kill", "os.killpg", "ctypes.", "pty.", "os.chroot", "os.setuid", "shutil.", "gc.",
            "sys.settrace", "sys.setprofile", "sys._current_frames", "sys.addaudithook", "code.__new__")
    paths = ("os.remove", "os.rename", "os.rmdir", "os.mkdir", "os.chmod", "os.chown", "os.symlink", "os.link",
             "os.truncate", "os.utime", "os.chdir", "os.listdir", "os.scandir")
    def inside(p, allow_stdlib):
        if isinstance(p, int):
            return True
        try:
            real = os.path.realpath(os.fsdecode(p))
        except Exception:
            return False
        if real == root or real.startswith(root + os.sep):
            return True
        return allow_stdlib and real.startswith(stdlib)
    def hook(event, args):
        if event.startswith(deny):
            raise PermissionError(f"sandbox: {event} is not allowed")
        if event == "open":
            path, mode, flags = args[0], args[1] or "r", args[2]
            writing = any(c in str(mode) for c in "wax+") or (
                isinstance(flags, int) and bool(flags & (os.O_WRONLY | os.O_RDWR | os.O_CREAT)))
            if not inside(path, allow_stdlib=not writing):
                raise PermissionError(f"sandbox: open {path!r} outside the sandbox folder")
        elif event in paths:
            for p in args[:2]:
                if isinstance(p, (str, bytes, os.PathLike)) and not inside(p, event in ("os.listdir", "os.scandir")):
                    raise PermissionError(f"sandbox: {event} {p!r} outside the sandbox folder")
    sys.addaudithook(hook)
code = compile(sys.stdin.read(), "<sandbox>", "exec")
_install()
del _install
exec(code, {"__name__": "__main__"})
'''


@dataclass
class SandboxResult:
    stdout: str
    stderr: str
    exit_code: int | None  # None when killed at the deadline
    timed_out: bool

    @property
    def ok(self) -> bool:
        return self.exit_code == 0 and not self.timed_out


def _limits(cpu_s: int, memory_mb: int, file_mb: int) -> None:  # runs in the child before exec
    os.setsid()
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb * 2**20, memory_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb * 2**20, file_mb * 2**20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))


async def run_python(code: str, timeout_s: float = 5.0, memory_mb: int = 512, file_mb: int = 1,
                     max_output: int = 4096, folder: Path | None = None) -> SandboxResult:
    """Run `code` in the sandbox (see the module docstring); a temporary folder unless `folder` is given."""
    if len(code) > 100_000:
        raise ValueError(f"code: expected at most 100000 characters, got {len(code)}")
    with tempfile.TemporaryDirectory(prefix="asyncrl-sandbox-") as tmp:
        cwd = Path(folder) if folder is not None else Path(tmp)
        proc = await asyncio.create_subprocess_exec(
            sys.executable, "-I", "-S", "-c", _BOOTSTRAP,
            stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE,
            cwd=str(cwd), env={"PYTHONIOENCODING": "utf-8"},
            preexec_fn=lambda: _limits(max(1, int(timeout_s) + 1), memory_mb, file_mb),
        )
        try:
            out, err = await asyncio.wait_for(proc.communicate(code.encode()), timeout=timeout_s)
            timed_out = False
        except TimeoutError:
            timed_out = True
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            out, err = await proc.communicate()
        code_ = None if timed_out else proc.returncode
        return SandboxResult(out.decode(errors="replace")[:max_output], err.decode(errors="replace")[-max_output:],
                             code_, timed_out)
