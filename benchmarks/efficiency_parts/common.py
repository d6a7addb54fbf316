"""Shared by the parts of the efficiency benchmark: paths, the jobs, and running one part in a subprocess.

A part that loads vLLM or DeepSpeed runs as `python -m efficiency_parts.<part> --spec IN.json --out OUT.json` in a
new session, so its memory, threads and child processes (vLLM's EngineCore) are gone before the next part starts.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
JOBS = {"default": "configs/default.yaml", "longtail": "configs/bench_longtail.yaml"}
EXPERIMENT = "efficiency"  # the MLflow experiment of its runs: end to end, trainer idle, and the raw engine and TRL


def log(msg: str) -> None:
    print(f"[efficiency {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def part_env() -> dict[str, str]:
    """The environment of a part subprocess: this one's, the caches of the Makefile, `efficiency_parts` importable."""
    env = dict(os.environ)
    env.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    env.setdefault("DS_BUILD_OPS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(BENCH), env.get("PYTHONPATH", "")) if p)
    return env


def run_part(module: str, spec: dict[str, Any], work: Path, timeout_s: float, python: str | None = None,
             env: dict[str, str] | None = None) -> dict[str, Any]:
    """Run `efficiency_parts.<module>` on `spec` in a new session; its JSON result, or {"error": ...}.

    Its output goes to `work/<module>.log`; whatever is left of its session afterwards (an engine core) is killed.
    """
    work.mkdir(parents=True, exist_ok=True)
    spec_path, out_path, log_path = work / f"{module}.spec.json", work / f"{module}.out.json", work / f"{module}.log"
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    out_path.unlink(missing_ok=True)
    cmd = [python or sys.executable, "-m", f"efficiency_parts.{module}", "--spec", str(spec_path), "--out", str(out_path)]
    t0 = time.monotonic()
    with open(log_path, "wb") as logf:
        proc = subprocess.Popen(cmd, cwd=ROOT, env=env or part_env(), stdout=logf, stderr=subprocess.STDOUT,
                                stdin=subprocess.DEVNULL, start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    wall = time.monotonic() - t0
    if rc is None:
        return {"error": f"{module}: timed out after {timeout_s:.0f} s; log {log_path}", "log": tail(log_path)}
    if rc != 0 or not out_path.is_file():
        return {"error": f"{module}: exited with code {rc}; log {log_path}", "log": tail(log_path)}
    result = json.loads(out_path.read_text())
    result["part_wall_s"] = wall
    return result


def tail(path: Path, lines: int = 25) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def part_args() -> tuple[dict[str, Any], Path]:
    """A part's command line: (its spec, where to write its result)."""
    import argparse

    p = argparse.ArgumentParser()
    p.add_argument("--spec", required=True)
    p.add_argument("--out", required=True)
    a = p.parse_args()
    return json.loads(Path(a.spec).read_text()), Path(a.out)


def write_result(out: Path, result: dict[str, Any]) -> None:
    out.write_text(json.dumps(result, indent=2) + "\n")


def mean(xs: list[float]) -> float | None:
    return sum(xs) / len(xs) if xs else None


def cpu_seconds(procs: list[Any]) -> float:
    """User + system CPU seconds of the psutil processes `procs` (one that is gone counts 0)."""
    import psutil

    total = 0.0
    for p in procs:
        try:
            t = p.cpu_times()
            total += t.user + t.system
        except psutil.Error:
            pass
    return total
