"""The trainer's CPU while nothing new arrives: a real run whose environment roles are stopped on purpose.

`asyncrl run` starts as in the end-to-end part; once the launcher prints step `after_step`, every environment role
process is sent SIGSTOP (an injected fault: no group is generated or written any more). The trainer takes what it
had read ahead, then waits on an empty buffer while its read-ahead thread polls S3 with backoff, its reporter and
its heartbeat keep running. After `settle_s`, the CPU time (user + system) of the trainer's process tree is read
twice, `measure_s` apart; the share of a core in between is the idle trainer's cost. Then the environment roles
get SIGCONT and the launcher SIGTERM (it stops every role). Its `time/wait_cpu_s` share in the end-to-end part is a
different figure: there groups arrive while the trainer waits, and it decodes them then.
"""

from __future__ import annotations

import contextlib
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from efficiency_parts.common import EXPERIMENT, ROOT, cpu_seconds, log
from efficiency_parts.e2e import TreeSampler, read_launcher

TARGET_SHARE = 0.05


def run_trainer_idle(config: str, overrides: list[str], runs_dir: Path, run_id: str, after_step: int = 3,
                     settle_s: float = 3.0, measure_s: float = 10.0, start_timeout_s: float = 600.0) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", config, "--set", f"runs_dir={runs_dir}", "--set",
           f"run_id={run_id}", "--set", "training.steps=1000", "--set", "eval.every_steps=0",
           "--set", f"tracking.experiment={EXPERIMENT}"]
    for o in overrides:
        cmd += ["--set", o]
    runs_dir.mkdir(parents=True, exist_ok=True)
    out_log = runs_dir / f"{run_id}.launcher.log"
    log(f"trainer idle: {' '.join(cmd[2:])} (environment stopped after step {after_step})")
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    stopped: list[psutil.Process] = []
    try:
        events: queue.Queue = queue.Queue()
        threading.Thread(target=read_launcher, args=(proc.stdout, events, out_log), daemon=True).start()
        deadline = time.monotonic() + start_timeout_s
        while True:
            try:
                ev = events.get(timeout=max(0.1, deadline - time.monotonic()))
            except queue.Empty:
                return {"error": f"no step {after_step} within {start_timeout_s:.0f} s; launcher output {out_log}"}
            if ev is None:
                return {"error": f"asyncrl run ended before step {after_step}; launcher output {out_log}"}
            if ev[0] >= after_step:
                break
        sampler = TreeSampler(proc.pid)
        sampler.sample()
        envs = [psutil.Process(pid) for pid, c in sampler.classes.items() if c == "environment"]
        trainer = [psutil.Process(pid) for pid, c in sampler.classes.items() if c == "trainer"]
        if not envs or not trainer:
            return {"error": f"found {len(envs)} environment and {len(trainer)} trainer processes"}
        for p in envs:
            p.send_signal(signal.SIGSTOP)
            stopped.append(p)
        time.sleep(settle_s)
        c0, t0 = cpu_seconds(trainer), time.monotonic()
        time.sleep(measure_s)
        c1, t1 = cpu_seconds(trainer), time.monotonic()
        share = (c1 - c0) / (t1 - t0)
        log(f"trainer idle: {share:.3f} of a core over {t1 - t0:.1f} s ({len(trainer)} processes)")
        return {"cpu_share": share, "window_s": t1 - t0, "cpu_s": c1 - c0, "trainer_processes": len(trainer),
                "stopped_environment_processes": len(envs), "after_step": after_step, "settle_s": settle_s,
                "target_share": TARGET_SHARE, "meets_target": share <= TARGET_SHARE,
                "note": "environment roles stopped on purpose (SIGSTOP): the trainer waits with nothing new"}
    finally:
        for p in stopped:
            with contextlib.suppress(psutil.Error):
                p.send_signal(signal.SIGCONT)
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(120)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(30)
