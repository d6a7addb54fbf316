"""Ctrl-C on `asyncrl run` stops every role process (and vLLM's engine processes) and exits 130."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from tests.helpers.run_processes import kill_run_processes, processes_of_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def _run_processes(run_dir: Path) -> list[int]:
    found = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            cmd = " ".join(p.info["cmdline"] or [])
            env = p.environ()
        except (psutil.Error, OSError):
            continue
        if str(run_dir) in cmd or any(str(run_dir) in v for v in env.values()):
            found.append(p.info["pid"])
    return found


def _engine_cores(run_dir: Path) -> list[int]:
    """The run's vLLM engine core processes (found as descendants of its roles: their retitling can blank their
    environment)."""
    cores = []
    for p in processes_of_run(run_dir):
        with contextlib.suppress(psutil.Error):
            if "EngineCore" in " ".join(p.cmdline()):
                cores.append(p.pid)
    return cores


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def _stuck_report(run_dir: Path, output: bytes | str | None) -> str:
    """What a launcher that did not exit after Ctrl-C was doing: its output's end, the run's processes still alive
    and the end of every role's log."""
    text = output.decode(errors="replace") if isinstance(output, bytes) else (output or "")
    alive = []
    for pid in _run_processes(run_dir):
        with contextlib.suppress(psutil.Error):
            alive.append(f"{pid} {' '.join(psutil.Process(pid).cmdline())[:160]}")
    logs = [f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace").splitlines()[-15:])
            for f in sorted((run_dir / "logs").glob("*.log"))]
    return ("the launcher had not exited 120 s after Ctrl-C\n--- launcher output (end)\n" + text[-3000:]
            + "\n--- processes of the run still alive\n" + "\n".join(alive) + "\n" + "\n".join(logs))


def test_ctrl_c_stops_everything(tmp_path):
    runs = tmp_path / "runs"
    run_dir = runs / "interrupt-test"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "run", str(ROOT / "configs/smoke.yaml"), "--set", f"runs_dir={runs}",
         "--set", "run_id=interrupt-test", "--set", f"cache_dir={ROOT / '.cache/asyncrl'}",
         "--set", "generation.num_servers=1",
         # far more steps than can finish before the signal: a smoke run of a few steps can end within seconds of
         # its engine's start, and the Ctrl-C must find the run going
         "--set", "training.steps=100000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ},
        # started as a shell without job control starts a background job: SIGINT ignored, which the launcher
        # inherits (CI runs the suite that way); its Ctrl-C must stop the run all the same
        preexec_fn=_ignore_sigint,
    )
    try:
        deadline = time.monotonic() + 300
        started = False
        while time.monotonic() < deadline and proc.poll() is None:
            logs = run_dir / "logs"
            if logs.is_dir() and any(logs.glob("generation-*.log")):
                started = True
                break
            time.sleep(0.5)
        assert started, "the launcher never started a generation server"
        # the engine is starting: the Ctrl-C must find its EngineCore process (vLLM titles it VLLM::EngineCore)
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None and not _engine_cores(run_dir):
            time.sleep(0.5)
        assert _engine_cores(run_dir), "no vLLM EngineCore process of the run appeared"
        assert len(_run_processes(run_dir)) >= 3
        proc.send_signal(signal.SIGINT)
        try:
            out, _ = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired as err:
            raise AssertionError(_stuck_report(run_dir, err.output)) from None
    except BaseException:
        kill_run_processes(run_dir)  # a failed test leaves no role or engine behind either
        proc.kill()
        proc.wait(30)
        raise
    assert proc.returncode == 130, out[-2000:]
    assert "interrupted: all roles stopped" in out
    time.sleep(1)
    assert _run_processes(run_dir) == []


@pytest.mark.parametrize("how", ["sigterm_with_stdout_closed", "sigkill"])
def test_a_launcher_gone_leaves_no_role_behind(tmp_path, how):
    """SIGTERM after the launcher's stdout reader went away (its prints fail) still stops every role; a launcher
    killed outright takes its roles with it (each asks Linux for SIGTERM when its parent dies)."""
    runs = tmp_path / "runs"
    run_dir = runs / f"gone-{how}"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.cli", "run", str(ROOT / "configs/smoke.yaml"), "--set", f"runs_dir={runs}",
         "--set", f"run_id=gone-{how}", "--set", f"cache_dir={ROOT / '.cache/asyncrl'}",
         "--set", "generation.num_servers=1", "--set", "training.steps=100000"],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ},
    )
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and proc.poll() is None:
            logs = run_dir / "logs"
            if logs.is_dir() and any(logs.glob("generation-*.log")) and any(logs.glob("reward-*.log")):
                break
            time.sleep(0.5)
        time.sleep(3)
        assert len(_run_processes(run_dir)) >= 3
        if how == "sigkill":
            proc.kill()
        else:
            proc.stdout.close()
            proc.send_signal(signal.SIGTERM)
        proc.wait(120)
        gone_by = time.monotonic() + 60
        while _run_processes(run_dir) and time.monotonic() < gone_by:
            time.sleep(1)
        left = _run_processes(run_dir)
    finally:
        if proc.poll() is None:
            proc.kill()
        for pid in _run_processes(run_dir):
            with contextlib.suppress(psutil.Error):
                psutil.Process(pid).kill()
    assert left == [], [" ".join(psutil.Process(p).cmdline()) for p in left if psutil.pid_exists(p)]
