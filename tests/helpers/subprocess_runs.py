"""Run a test script or `asyncrl run` in a child process, the way the integration tests need it.

`run_lone_trainer_script`: a script that builds its own single-process torch.distributed group (DeepSpeed), run
with the launcher variables removed so that it cannot join another test's group; returns the JSON of its last
stdout line. `run_embedded`: `asyncrl run <config>` into `runs/<run_id>` with overrides; fails the test with the
tails of every role's log when the run fails.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_lone_trainer_script(script: Path, *args: str, timeout_s: float = 120) -> dict[str, Any]:
    env = {**os.environ, "DS_BUILD_OPS": "0"}
    for key in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK"):
        env.pop(key, None)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(REPO / ".cache" / "torch_extensions"))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO), env.get("PYTHONPATH", "")) if p)  # the script imports tests.*
    proc = subprocess.run([sys.executable, str(script), *args], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=timeout_s)
    assert proc.returncode == 0, proc.stderr[-4000:]
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))


def run_embedded(config: Path, runs: Path, run_id: str, overrides: list[str] = (), timeout_s: float = 900) -> str:
    """Run to completion; return its stdout."""
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", str(config), "--set", f"runs_dir={runs}",
           "--set", f"run_id={run_id}", "--set", f"cache_dir={REPO / '.cache/asyncrl'}"]
    for o in overrides:
        cmd += ["--set", o]
    proc = subprocess.run(cmd, cwd=REPO, capture_output=True, text=True, timeout=timeout_s,
                          env={**os.environ, "ASYNCRL_LOG_LEVEL": "INFO"})
    if proc.returncode != 0:
        logs = "\n".join(f"--- {p.name}\n{p.read_text()[-3000:]}" for p in sorted((runs / run_id / "logs").glob("*.log")))
        pytest.fail(f"asyncrl run failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-3000:]}\n{logs}")
    return proc.stdout
