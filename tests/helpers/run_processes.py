"""The processes of one embedded run, found by its folder in their command line (SeaweedFS) or their environment (the
roles: the launcher gives them `ASYNCRL_RUN_DIR`, the run's folder), with their descendants (vLLM's engine core
and workers, retitled `VLLM::...`). A test that fails midway kills these, so that no engine is left spinning."""

from __future__ import annotations

import contextlib
import signal
from pathlib import Path

import psutil


def processes_of_run(run_dir: Path) -> list[psutil.Process]:
    """Every live process whose command line or environment names `run_dir`, and their descendants (vLLM's engine
    core and workers retitle themselves, which can blank their environment as /proc shows it)."""
    needle, found = str(run_dir), {}
    for p in psutil.process_iter(["pid", "cmdline"]):
        with contextlib.suppress(psutil.Error, OSError):
            if needle in " ".join(p.info["cmdline"] or []) or any(needle in v for v in p.environ().values()):
                found[p.pid] = p
                for child in p.children(recursive=True):
                    found[child.pid] = child
    return list(found.values())


def kill_run_processes(run_dir: Path) -> None:
    """SIGCONT then SIGKILL to every process of the run (a stopped one dies too); called while the roles still live,
    so that their engine processes are found as their descendants."""
    for p in processes_of_run(run_dir):
        with contextlib.suppress(psutil.Error):
            p.send_signal(signal.SIGCONT)
            p.send_signal(signal.SIGKILL)
