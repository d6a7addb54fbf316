"""The command line that starts one sandbox, and what its first process does before `exec` (rlimits, uid drop).

Namespaces (bwrap `--unshare-all`): user, mount, PID, network (loopback only), IPC, UTS, cgroup. Inside:
uid/gid 65534, no capabilities, an empty environment, a read-only view of the system library folders and the
interpreter's installation, a fresh /proc of its own PID namespace, a minimal /dev, a size-limited tmpfs as its
working folder `/work` and another as `/tmp`, and a read-only root. `--die-with-parent` ends it with its
caller; `--new-session` detaches it from any terminal. bwrap sets `no_new_privs` before it starts the program.
"""

from __future__ import annotations

import os
import resource

WORKDIR = "/work"
NOBODY = 65534  # the uid and gid inside, and outside when the caller is root (it drops to them before bwrap)
SYSTEM_DIRS = ("/usr", "/lib", "/lib64", "/lib32", "/bin")  # read-only in the sandbox (libc, libffi, the interpreter)


def bwrap_argv(bwrap: str, python_prefix: str, tmpfs_mb: int) -> list[str]:
    """`bwrap` and its options, up to and including `--`; the program and its arguments follow. `python_prefix`:
    the interpreter's installation, bound read-only unless a system folder holds it already."""
    size = str(tmpfs_mb << 20)
    argv = [bwrap, "--unshare-all", "--die-with-parent", "--new-session", "--clearenv",
            "--setenv", "PYTHONIOENCODING", "utf-8", "--setenv", "PYTHONDONTWRITEBYTECODE", "1",
            "--cap-drop", "ALL", "--uid", str(NOBODY), "--gid", str(NOBODY), "--hostname", "sandbox"]
    for d in SYSTEM_DIRS:
        argv += ["--ro-bind-try", d, d]
    if not any(python_prefix == d or python_prefix.startswith(d + "/") for d in SYSTEM_DIRS):
        argv += ["--ro-bind", python_prefix, python_prefix]
    argv += ["--proc", "/proc", "--dev", "/dev", "--size", size, "--tmpfs", "/tmp", "--size", size,
             "--tmpfs", WORKDIR, "--chdir", WORKDIR, "--remount-ro", "/", "--"]
    return argv


def drop_privileges(uid: int | None) -> None:
    """In the child before exec: a new session, and when the caller is root, uid and gid `uid` with no groups."""
    os.setsid()
    if uid is not None:
        os.setgroups([])
        os.setgid(uid)
        os.setuid(uid)


def set_limits(cpu_s: int, memory_mb: int, file_mb: int) -> None:
    """rlimits inherited by everything the sandbox runs (bwrap's own processes are small)."""
    resource.setrlimit(resource.RLIMIT_CPU, (cpu_s, cpu_s))
    resource.setrlimit(resource.RLIMIT_AS, (memory_mb << 20, memory_mb << 20))
    resource.setrlimit(resource.RLIMIT_FSIZE, (file_mb << 20, file_mb << 20))
    resource.setrlimit(resource.RLIMIT_NOFILE, (64, 64))
    resource.setrlimit(resource.RLIMIT_CORE, (0, 0))
