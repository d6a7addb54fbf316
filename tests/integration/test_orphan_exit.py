"""A role whose launcher died ends itself even when its graceful stop hangs (asyncrl.roles.liveness.exit_when_orphaned):
real processes, a launcher stand-in killed with SIGKILL and a role that ignores SIGTERM."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from asyncrl.roles.liveness import ORPHAN_ENV

pytestmark = pytest.mark.integration

ROLE = """
import signal, subprocess, sys, time
from asyncrl.roles.liveness import exit_when_orphaned
signal.signal(signal.SIGTERM, signal.SIG_IGN)  # a stop that never finishes
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])  # what the role started
print(child.pid, flush=True)
assert exit_when_orphaned(grace_s=float(sys.argv[1]), poll_s=0.1) is not None
time.sleep(600)
"""
LAUNCHER = """
import subprocess, sys, time
role = subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]], start_new_session=True)
print(role.pid, flush=True)
time.sleep(600)
"""


def test_an_orphaned_role_kills_its_group_after_the_grace(tmp_path: Path) -> None:
    env = {**os.environ, ORPHAN_ENV: "1", "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launcher = subprocess.Popen([sys.executable, "-c", LAUNCHER, ROLE, "1.0"], stdout=subprocess.PIPE, env=env,
                                text=True)
    role = psutil.Process(int(launcher.stdout.readline()))  # type: ignore[union-attr]
    deadline = time.monotonic() + 30
    while not role.children() and time.monotonic() < deadline:
        time.sleep(0.1)
    child = role.children()[0]
    time.sleep(1.5)  # longer than the grace: a live parent keeps the role alive
    assert role.is_running() and child.is_running()
    launcher.kill()
    launcher.wait(10)
    t0 = time.monotonic()
    gone, alive = psutil.wait_procs([role, child], timeout=15)
    for p in alive:
        p.kill()
    assert not alive and time.monotonic() - t0 >= 1.0


def test_without_the_variable_there_is_no_watch() -> None:
    out = subprocess.run([sys.executable, "-c", "from asyncrl.roles.liveness import exit_when_orphaned as e; "
                          "print(e() is None)"], capture_output=True, text=True, timeout=60,
                         env={k: v for k, v in os.environ.items() if k != ORPHAN_ENV}, check=True)
    assert out.stdout.strip() == "True"
