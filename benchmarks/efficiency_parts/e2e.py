"""End to end: the real `asyncrl run`, its steady-state throughput, and the CPU time of every process of its tree.

While the run runs, every `interval_s` (and at once whenever the launcher prints a step) the CPU times (user +
system) of the launcher and all its descendants are read with psutil; the last value of each pid is kept, so a
process that exited still counts. Each pid is classified once, by the role process it descends from (the
launcher's child whose command line names the role module, or SeaweedFS's `weed`): the generation role process
itself is the server's front end, everything below it (vLLM's EngineCore and its worker) is the engine core.

Control-plane CPU per trained sample: the CPU seconds of every class but the engine core and the trainer, between
the first and the last step the launcher printed (so start-up, model loading and the first step's pipeline fill are
left out), divided by the samples trained in between. The trainer's `time/*` step metrics come from the run's
MLflow store (the sqlite file in the runs folder).
"""

from __future__ import annotations

import os
import queue
import re
import sqlite3
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import psutil

from efficiency_parts.common import EXPERIMENT, ROOT, log, mean, tail

ROLE_CLASSES = {"asyncrl.roles.environment": "environment", "asyncrl.roles.reward": "reward",
                "asyncrl.roles.generation": "generation_frontend", "asyncrl.roles.training": "trainer",
                "torch.distributed.run": "trainer"}
CLASSES = ("launcher", "seaweedfs", "environment", "reward", "generation_frontend", "vllm_engine_core", "trainer",
           "other")
NOT_CONTROL_PLANE = ("vllm_engine_core", "trainer")
STEP_LINE = re.compile(r"^step\s+(\d+)/(\d+)\s")


class TreeSampler:
    """CPU seconds by class of a process and all its descendants; an exited process keeps its last value."""

    def __init__(self, root_pid: int) -> None:
        self.root = psutil.Process(root_pid)
        self.procs: dict[int, psutil.Process] = {}
        self.classes: dict[int, str] = {}
        self.names: dict[int, str] = {}
        self.ppids: dict[int, int] = {}
        self.cpu: dict[int, float] = {}

    def _top_class(self, p: psutil.Process) -> str:
        cmd = p.cmdline()
        if cmd and Path(cmd[0]).name == "weed":
            return "seaweedfs"
        for module, cls in ROLE_CLASSES.items():
            if module in cmd:
                return cls
        return "other"

    def classify(self, p: psutil.Process) -> str:
        if p.pid == self.root.pid:
            return "launcher"
        chain = [p]
        while chain[-1].ppid() not in (self.root.pid, 0, 1):
            parent = chain[-1].parent()
            if parent is None:
                return "other"
            chain.append(parent)
        if chain[-1].ppid() != self.root.pid:
            return "other"
        top = self._top_class(chain[-1])
        if len(chain) > 1 and top == "generation_frontend":
            return "vllm_engine_core"
        return top

    def sample(self) -> None:
        try:
            found = [self.root, *self.root.children(recursive=True)]
        except psutil.Error:
            found = []
        for p in found:
            self.procs.setdefault(p.pid, p)
        for pid, p in self.procs.items():
            try:
                t = p.cpu_times()
                name = " ".join(p.cmdline())[:100] or p.name()
                # classified again when its command line changed: a child seen between fork and exec still shows
                # its parent's (the launcher's) command line
                if self.names.get(pid) != name:
                    self.classes[pid] = self.classify(p)
                    self.ppids[pid] = p.ppid()
                    self.names[pid] = name
            except psutil.Error:
                continue
            self.cpu[pid] = t.user + t.system

    def by_class(self) -> dict[str, float]:
        out = dict.fromkeys(CLASSES, 0.0)
        for pid, cpu in self.cpu.items():
            out[self.classes.get(pid, "other")] += cpu
        return out

    def processes(self) -> list[dict[str, Any]]:
        """Every process seen: pid, parent, class, command line (cut) and its last CPU seconds, most CPU first."""
        rows = [{"pid": pid, "ppid": self.ppids.get(pid), "class": self.classes.get(pid, "other"),
                 "cmdline": self.names.get(pid, "?"),
                 "cpu_s": round(cpu, 2)} for pid, cpu in self.cpu.items()]
        return sorted(rows, key=lambda r: -r["cpu_s"])


def read_launcher(stream: Any, events: queue.Queue, log_path: Path) -> None:
    with open(log_path, "w") as f:
        for line in stream:
            f.write(line)
            f.flush()
            m = STEP_LINE.match(line)
            if m:
                events.put((int(m.group(1)), time.monotonic()))
    events.put(None)


def run_e2e(config: str, overrides: list[str], steps: int, runs_dir: Path, run_id: str, samples_per_step: int,
            interval_s: float = 0.5) -> dict[str, Any]:
    cmd = [sys.executable, "-m", "asyncrl.cli", "run", config, "--set", f"runs_dir={runs_dir}", "--set",
           f"run_id={run_id}", "--set", f"training.steps={steps}", "--set", "eval.every_steps=0",
           "--set", f"tracking.experiment={EXPERIMENT}"]
    for o in overrides:
        cmd += ["--set", o]
    runs_dir.mkdir(parents=True, exist_ok=True)
    out_log = runs_dir / f"{run_id}.launcher.log"
    log(f"e2e: {' '.join(cmd[2:])}")
    t0 = time.monotonic()
    proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    sampler = TreeSampler(proc.pid)
    me = psutil.Process()
    my_cpu0 = sum(me.cpu_times()[:2])
    events: queue.Queue = queue.Queue()
    threading.Thread(target=read_launcher, args=(proc.stdout, events, out_log), daemon=True).start()
    marks: dict[int, tuple[float, dict[str, float]]] = {}
    finished = False
    while not finished:
        try:
            ev = events.get(timeout=interval_s)
        except queue.Empty:
            ev = None
        sampler.sample()
        if ev is None and proc.poll() is not None and events.empty():
            finished = True
        elif ev is not None:
            version, at = ev
            marks[version] = (at, sampler.by_class())
            log(f"e2e: step {version}/{steps} ({time.monotonic() - t0:.0f} s)")
    rc = proc.wait()
    sampler.sample()
    wall = time.monotonic() - t0
    sampler_cpu = sum(me.cpu_times()[:2]) - my_cpu0
    summary_path = runs_dir / run_id / "run_summary.json"
    if rc != 0 or not summary_path.is_file():
        return {"error": f"asyncrl run exited with code {rc}; launcher output {out_log}, logs {runs_dir / run_id}/logs",
                "log": tail(out_log)}
    import json

    summary = json.loads(summary_path.read_text())
    res: dict[str, Any] = {"run_id": run_id, "command": " ".join(cmd[1:]), "wall_s": wall,
                           "samples_per_s": summary["steady_samples_per_s"], "step_s": summary["steady_step_s"],
                           "all_steps_samples_per_s": summary["samples_per_s"], "samples_trained": summary["samples_trained"],
                           "staleness_mean": summary["staleness_mean"], "samples_dropped_stale": summary["samples_dropped_stale"],
                           "processes": sampler.processes(), "benchmark_sampler_cpu_s": sampler_cpu}
    res["control_plane"] = control_plane(marks, sampler.by_class(), samples_per_step, summary["samples_trained"])
    res["mlflow"] = mlflow_figures(runs_dir / "mlflow.db", run_id)
    return res


def control_plane(marks: dict[int, tuple[float, dict[str, float]]], final: dict[str, float], samples_per_step: int,
                  samples_trained: int) -> dict[str, Any]:
    """CPU seconds per trained sample by class, in the window between the first and last printed steps."""
    out: dict[str, Any] = {"target_ms_per_sample": 1.0}
    whole = {k: v for k, v in final.items()}
    out["whole_run_cpu_s"] = whole
    out["whole_run_ms_per_sample"] = {k: 1e3 * v / max(1, samples_trained) for k, v in whole.items()}
    versions = sorted(v for v in marks if v >= 1)
    if len(versions) < 2:
        out["error"] = "fewer than two steps seen: no steady window"
        return out
    (t_a, a), (t_b, b) = marks[versions[0]], marks[versions[-1]]
    samples = (versions[-1] - versions[0]) * samples_per_step
    cpu = {k: b[k] - a[k] for k in CLASSES}
    span = max(1e-9, t_b - t_a)
    out.update({"window_steps": [versions[0], versions[-1]], "window_s": span, "window_samples": samples,
                "cpu_s": cpu, "ms_per_sample": {k: 1e3 * v / samples for k, v in cpu.items()},
                "cores": {k: v / span for k, v in cpu.items()}})
    cp = sum(v for k, v in cpu.items() if k not in NOT_CONTROL_PLANE)
    out["control_plane_ms_per_sample"] = 1e3 * cp / samples
    out["control_plane_cores"] = cp / span
    out["meets_target"] = out["control_plane_ms_per_sample"] <= out["target_ms_per_sample"]
    # every process's CPU per sample, engine and trainer included: on a machine whose cores all of them share, the
    # run cannot train faster than its cores divided by this (the CPU-bound ceiling); how close it comes says whether
    # the processes wait on each other (far below) or the CPU itself is the limit (close)
    total_ms = 1e3 * sum(cpu.values()) / samples
    cores = len(os.sched_getaffinity(0))
    out["all_processes_ms_per_sample"] = total_ms
    out["machine_cores"] = cores
    out["cpu_bound_ceiling_samples_per_s"] = 1e3 * cores / total_ms if total_ms > 0 else None
    out["busy_cores"] = sum(cpu.values()) / span
    return out


def mlflow_figures(db: Path, run_name: str) -> dict[str, Any]:
    """The trainer's step metrics of the run (steady = every step but the first) from the sqlite MLflow store."""
    if not db.is_file():
        return {"error": f"{db}: no MLflow store"}
    con = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
    try:
        row = con.execute("SELECT run_uuid FROM runs WHERE name = ? ORDER BY start_time DESC", (run_name,)).fetchone()
        if row is None:
            return {"error": f"no MLflow run named {run_name} in {db}"}
        rows = con.execute("SELECT key, step, value FROM metrics WHERE run_uuid = ? AND (key LIKE 'time/%' OR "
                           "key = 'train/tokens' OR "
                           "key LIKE 'generation/%/tokens_generated' OR key LIKE 'generation/%/uptime_s')",
                           (row[0],)).fetchall()
    finally:
        con.close()
    series: dict[str, dict[int, float]] = {}
    for key, step, value in rows:
        series.setdefault(key, {})[int(step)] = float(value)
    steps = sorted(series.get("time/step_s", {}))
    steady = steps[1:]
    out: dict[str, Any] = {"steps_logged": len(steps)}
    for key in ("time/wait_s", "time/wait_cpu_s", "time/train_s", "time/sync_s", "time/step_s"):
        vals = [series[key][s] for s in steady if s in series.get(key, {})]
        out[key.split("/")[1] + "_mean"] = mean(vals)
    waits = series.get("time/wait_s", {})
    wait_cpu = series.get("time/wait_cpu_s")
    if wait_cpu:
        common = [s for s in steady if s in wait_cpu and s in waits]
        w = sum(waits[s] for s in common)
        out["trainer_wait_cpu_share"] = sum(wait_cpu[s] for s in common) / w if w > 0 else None
    else:
        out["trainer_wait_cpu_share"] = None
        out["trainer_wait_cpu_note"] = "not measured: the run logged no time/wait_cpu_s"
    step_s = [series["time/step_s"][s] for s in steady]
    trained = [series.get("train/tokens", {}).get(s) for s in steady]
    out["trained_tokens_per_s"] = (sum(trained) / sum(step_s)  # type: ignore[arg-type]
                                   if step_s and None not in trained else None)
    out["generated_tokens_per_s"] = _token_rate(series, steady)
    out["generated_tokens_note"] = ("the generation servers' own token counters between the heartbeats logged at the "
                                    "first and last steady steps (heartbeats every timeouts.heartbeat_s: rough on a "
                                    "short run); includes aborted and stale-dropped work")
    return out


def _token_rate(series: dict[str, dict[int, float]], steady: list[int]) -> float | None:
    """Generated tokens/s of all servers between the first and last steady steps at which their counters were logged
    (the servers' own counters; the trainer logs them once per read of the heartbeats, every few seconds)."""
    if len(steady) < 2:
        return None
    first = steady[0] - 1 if steady[0] - 1 in series.get("time/step_s", {}) else steady[0]
    rate, found = 0.0, False
    for key, tokens in series.items():
        if not key.endswith("/tokens_generated"):
            continue
        up = series.get(key.replace("/tokens_generated", "/uptime_s"), {})
        logged = [s for s in sorted(tokens) if first <= s <= steady[-1] and s in up]
        if len(logged) < 2:
            continue
        a, b = logged[0], logged[-1]
        if up[b] > up[a]:
            rate += (tokens[b] - tokens[a]) / (up[b] - up[a])
            found = True
    return rate if found else None
