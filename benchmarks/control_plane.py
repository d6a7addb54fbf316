"""The control plane alone: CPU seconds per trained sample with 256 and ~5,000 samples in flight.

What runs: the embedded S3 server (SeaweedFS `weed`, `asyncrl.local.seaweed.EmbeddedS3`), the real reward role and
the real environment role (`python -m asyncrl.roles.{reward,environment}`, one writer), each a process started the
way the embedded launcher starts them (`asyncrl.local.processes.ProcessGroup`, the launcher's child environment with
the run's bearer token); and two stand-ins (`benchmarks/control_plane_standins.py`): a generation server that
answers every request at once (the real FastAPI front end of `asyncrl.generation.server` over an instant engine: no
vLLM, no decode time) and a trainer that reads groups like the real one (GroupPrefetcher, B groups per step, stale
drops) and publishes `versions/latest.json` with no model (its "weight sync" is one POST /weights/update). So
nothing but the control plane sets the pace: this isolates it, it does not measure a run.

Per size (configs/default.yaml, α = 1, 8 samples per prompt, `rollout.max_new_tokens` 6; B = 32 prompts per step:
256 samples per step, or B = 625: 5,000), after a warm-up of `--warmup-s` past the first step, a window from one
step boundary (the trainer stand-in prints each step) to the first one `--window-s` later: psutil `cpu_times`
(user + system, the process and its children) of every process at both ends, and the samples trained in between.
Reported: CPU ms per trained sample of each process; the control plane = environment + reward + S3 server +
generation stand-in (the stand-in's front end is the real FastAPI app but its engine is a no-op, so its CPU is
close to, not equal to, the real front end's; the vLLM engine core is absent); samples/s; and the ratio of control-plane
CPU per sample at ~5,000 to that at 256 (target <= 1.2) against the target of <= 1 ms per trained sample.
With `--profile-s` (default 15) py-spy (native frames) then samples the environment role of each size for that long,
after the window (so it does not disturb the figures): its event loop's share in CPython's cyclic GC and its hottest
functions go in the JSON.
Figures depend on the machine and on whatever else runs on it: the JSON records the load average.

    .venv/bin/python benchmarks/control_plane.py                     # both sizes (make bench-control-plane)
    .venv/bin/python benchmarks/control_plane.py --sizes 256 --window-s 8 --profile-s 0 --out /tmp/cp.json
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.metadata
import json
import os
import platform
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from asyncrl.config import load_config  # noqa: E402
from asyncrl.local.launcher import EmbeddedRun  # noqa: E402
from asyncrl.local.processes import ProcessGroup  # noqa: E402
from asyncrl.local.seaweed import EmbeddedS3, find_weed  # noqa: E402
from asyncrl.roles.context import wait_for_rendezvous  # noqa: E402
from asyncrl.run.create import record_model, write_config  # noqa: E402
from asyncrl.storage.s3 import S3Store  # noqa: E402
from asyncrl.tiny_model.prepare import resolve_model_path  # noqa: E402

SIZES = {"256": 32, "5000": 625}  # samples per step -> prompts per step (8 samples each)
COMMON = ["rollout.samples_per_prompt=8", "rollout.max_new_tokens=6", "rollout.async_ratio=1",
          "training.steps=1000000", "eval.every_steps=0"]
CONTROL_PLANE = ("environment", "reward", "s3_weed", "generation_standin")
TARGET_MS, TARGET_RATIO = 1.0, 1.2


def log(msg: str) -> None:
    print(f"[control-plane {time.strftime('%H:%M:%S')}] {msg}", flush=True)


def cpu_s(pid: int) -> float:
    """User + system CPU seconds of `pid` and its descendants (0 for one that is gone)."""
    total = 0.0
    with contextlib.suppress(psutil.Error):
        p = psutil.Process(pid)
        for q in [p, *p.children(recursive=True)]:
            with contextlib.suppress(psutil.Error):
                t = q.cpu_times()
                total += t.user + t.system
    return total


def own_cpu_s() -> float:
    """This process's CPU seconds alone (its children are the measured roles)."""
    t = psutil.Process().cpu_times()
    return t.user + t.system


class StepClock:
    """The trainer stand-in's `STEP {...}` lines, read from its log as they appear."""

    def __init__(self, log_path: Path) -> None:
        self.path, self.offset, self.last = log_path, 0, None

    def poll(self) -> dict[str, Any] | None:
        if not self.path.exists():
            return None
        with open(self.path, "rb") as f:
            f.seek(self.offset)
            data = f.read()
        end = data.rfind(b"\n") + 1
        self.offset += end
        for line in data[:end].decode(errors="replace").splitlines():
            if line.startswith("STEP "):
                self.last = json.loads(line[5:])
        return self.last

    def next_step(self, after: int, deadline: float, check: Any) -> dict[str, Any]:
        """The first step with version > `after` (its line seen), calling `check()` while waiting."""
        while True:
            step = self.poll()
            if step is not None and step["version"] > after:
                return step
            check()
            if time.monotonic() > deadline:
                raise TimeoutError(f"no trainer step after version {after} in time; see {self.path}")
            time.sleep(0.02)


def _frame(f: str) -> str:
    """`func (path/file.py:123)` -> `func (file path within the repository or library)`."""
    name, _, where = f.partition(" (")
    return f"{name} ({where.rsplit(':', 1)[0].rstrip(')').replace(str(ROOT) + '/', '')})" if where else name


def summarize_profile(path: Path, top: int = 12) -> dict[str, Any]:
    """py-spy raw (folded, --native) stacks of the event-loop thread while it runs callbacks (not waiting in
    select): the share in CPython's cyclic GC, the asyncrl functions with the largest inclusive share and the
    innermost Python frames. Worker threads (S3 writes through asyncio.to_thread) are left out."""
    incl: dict[str, int] = {}
    inner: dict[str, int] = {}
    busy = gc = 0
    for line in path.read_text(errors="replace").splitlines():
        stack, _, count = line.rpartition(" ")
        frames = stack.split(";")
        if not count.isdigit() or not any(f.startswith("BaseEventLoop._run_once") for f in frames) or any(
                f.startswith("EpollSelector.select") for f in frames):
            continue
        n = int(count)
        busy += n
        gc += n * any(f.startswith("gc_collect_main") for f in frames)
        py = [_frame(f) for f in frames if ".py:" in f]
        for f in set(py):
            incl[f] = incl.get(f, 0) + n
        inner[py[-1]] = inner.get(py[-1], 0) + n

    def share(d: dict[str, int]) -> list[dict[str, Any]]:
        return [{"function": k, "share": round(v / max(1, busy), 4)} for k, v in sorted(d.items(), key=lambda kv: -kv[1])[:top]]

    return {"event_loop_busy_samples": busy, "gc_share": round(gc / max(1, busy), 4),
            "inclusive_asyncrl": share({k: v for k, v in incl.items()
                                        if "asyncrl/" in k and not k.startswith(("<module>", "main "))}),
            "innermost_python": share(inner)}


def run_size(size: str, args: argparse.Namespace, runs_dir: Path) -> dict[str, Any]:
    overrides = [*COMMON, f"rollout.prompts_per_step={SIZES[size]}",
                 f"training.micro_batch_size={8 * SIZES[size]}", f"runs_dir={runs_dir}",
                 f"cache_dir={ROOT / '.cache/asyncrl'}", f"run_id=cp{size}-{time.strftime('%Y%m%d-%H%M%S')}",
                 *args.set]
    cfg = load_config(ROOT / "configs/default.yaml", overrides)
    model_folder = resolve_model_path(cfg)  # build the tiny model once, before any role needs it
    run = EmbeddedRun(cfg)
    run.run_dir.mkdir(parents=True, exist_ok=True)
    ro = cfg.rollout
    res: dict[str, Any] = {"overrides": overrides, "samples_per_step": ro.prompts_per_step * ro.samples_per_prompt,
                           "in_flight_bound_samples": (ro.async_ratio + 1) * ro.prompts_per_step * ro.samples_per_prompt}
    log(f"size {size}: B={ro.prompts_per_step} x n={ro.samples_per_prompt}, run folder {run.run_dir}")
    with EmbeddedS3(run.run_dir / "s3") as s3:
        os.environ.update(s3.env())  # this process talks to S3 with the server's credentials, as the launcher does
        store = S3Store(s3.endpoint_url, cfg.storage.bucket, region=cfg.storage.region)
        write_config(store, run.paths, cfg)  # the run's documents as the launcher writes them (no MLflow run)
        record_model(store, run.paths, cfg, model_folder)
        env = {**run.child_env(s3), "PYTHONPATH": os.pathsep.join(
            p for p in (str(ROOT / "benchmarks"), str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
        procs = ProcessGroup(run.run_dir / "logs", env)
        try:
            res.update(measure(size, args, run, store, procs, s3.pid or 0))
        finally:
            with contextlib.suppress(Exception):
                store.put_json(run.paths.done(), {"version": -1, "time": time.time()})
            procs.stop_all(grace_s=10)
            store.close()
    if not args.keep_data:
        shutil.rmtree(run.run_dir / "s3", ignore_errors=True)
    return res


def measure(size: str, args: argparse.Namespace, run: EmbeddedRun, store: S3Store, procs: ProcessGroup,
            weed_pid: int) -> dict[str, Any]:
    common = ["--run-url", run.url]
    reward = procs.start("reward-0", "asyncrl.roles.reward", [*common, "--id", "0"])
    gen = procs.start("generation-0", "control_plane_standins", ["generation", *common, "--id", "0"])
    trainer = procs.start("training-0", "control_plane_standins", ["trainer", *common, "--id", "0"])

    def check() -> None:
        bad = procs.failed()
        if bad is not None:
            raise RuntimeError(f"{bad.name} exited with code {bad.proc.returncode}; log {bad.log_path}:\n{bad.tail()}")

    for role in ("generation", "reward"):
        deadline = time.monotonic() + 180
        while True:
            check()
            try:
                wait_for_rendezvous(store, run.paths, role, 1, timeout_s=1.0, poll_s=0.2)
                break
            except TimeoutError:
                if time.monotonic() > deadline:
                    raise
    envr = procs.start("environment-0", "asyncrl.roles.environment", [*common, "--id", "env0"])
    pids = {"environment": envr.proc.pid, "reward": reward.proc.pid, "s3_weed": weed_pid,
            "generation_standin": gen.proc.pid, "trainer_standin": trainer.proc.pid}
    clock = StepClock(trainer.log_path)
    first = clock.next_step(0, time.monotonic() + 300, check)
    log(f"size {size}: first step done; warming up {args.warmup_s:.0f} s")
    warm_until = time.monotonic() + args.warmup_s
    while time.monotonic() < warm_until:
        check()
        time.sleep(0.2)
    a = clock.next_step(clock.poll()["version"], time.monotonic() + 300, check)  # type: ignore[index]
    cpu_a, t_a, me_a = {k: cpu_s(p) for k, p in pids.items()}, time.monotonic(), own_cpu_s()
    load_a = os.getloadavg()
    log(f"size {size}: window opens at version {a['version']}")
    while time.monotonic() < t_a + args.window_s:
        check()
        time.sleep(0.2)
    b = clock.next_step(clock.poll()["version"], time.monotonic() + 600, check)  # type: ignore[index]
    cpu_b, t_b, me_b = {k: cpu_s(p) for k, p in pids.items()}, time.monotonic(), own_cpu_s()
    stats = (store.get_json(run.paths.rollout_stats("env0")) or {}).get("metrics", {})
    latest = store.get_json(run.paths.versions_latest()) or {}
    samples = b["samples_trained"] - a["samples_trained"]
    if samples <= 0:
        raise RuntimeError(f"no samples trained between versions {a['version']} and {b['version']}")
    span = t_b - t_a
    cpu = {k: cpu_b[k] - cpu_a[k] for k in pids}
    ms = {k: 1e3 * v / samples for k, v in cpu.items()}
    out: dict[str, Any] = {
        "warmup_from_version": first["version"], "window_versions": [a["version"], b["version"]], "window_s": span,
        "window_samples": samples, "samples_per_s": samples / span, "cpu_s": cpu, "ms_per_sample": ms,
        "cores": {k: v / span for k, v in cpu.items()},
        "control_plane_ms_per_sample": sum(ms[k] for k in CONTROL_PLANE),
        "control_plane_cores": sum(cpu[k] for k in CONTROL_PLANE) / span,
        "benchmark_process_cpu_s": me_b - me_a, "loadavg_window_start": load_a, "loadavg_window_end": os.getloadavg(),
        "samples_dropped_stale": int(latest.get("counters", {}).get("samples_dropped_stale", 0)),
        "env_stats_snapshot_at_window_end": {k: stats.get(k) for k in (
            "rollout/live_groups", "rollout/requests_in_flight", "rollout/written_groups", "rollout/written_objects",
            "rollout/aborted_samples", "rollout/failed_samples")},
        "pids": pids,
    }
    if args.profile_s > 0:
        out["profile"] = profile(pids["environment"], args.profile_s, run.run_dir)
    return out


def profile(pid: int, seconds: float, folder: Path) -> dict[str, Any]:
    """py-spy (with native frames, so time in CPython's GC shows as such) on the environment role for `seconds`,
    after the window, summarized."""
    py_spy = shutil.which("py-spy")
    if py_spy is None:
        return {"error": "py-spy is not on PATH"}
    raw = folder / "environment.pyspy.txt"
    log(f"profiling the environment role (pid {pid}) for {seconds:.0f} s")
    proc = subprocess.run([py_spy, "record", "-p", str(pid), "-d", str(int(seconds)), "-r", "50", "--native", "-f",
                           "raw", "-o", str(raw)], capture_output=True, text=True, timeout=seconds + 60)
    if proc.returncode != 0 or not raw.is_file():
        return {"error": f"py-spy exited with code {proc.returncode}: {proc.stderr[-500:]}"}
    return {"raw": str(raw), "seconds": seconds, **summarize_profile(raw)}


def versions() -> dict[str, str]:
    out = {"python": platform.python_version()}
    for pkg in ("asyncrl", "fastapi", "uvicorn", "httpx", "boto3", "pyarrow", "psutil"):
        with contextlib.suppress(importlib.metadata.PackageNotFoundError):
            out[pkg] = importlib.metadata.version(pkg)
    with contextlib.suppress(Exception):
        out["weed"] = subprocess.run([find_weed(), "version"], capture_output=True, text=True, timeout=10).stdout.strip()
    with contextlib.suppress(Exception):
        out["git"] = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                                    timeout=10).stdout.strip()
    return out


def machine() -> dict[str, Any]:
    model = next((ln.split(":", 1)[1].strip() for ln in Path("/proc/cpuinfo").read_text().splitlines()
                  if ln.startswith("model name")), platform.processor())
    return {"platform": platform.platform(), "cpu": model, "logical_cpus": os.cpu_count(),
            "memory_gib": round(psutil.virtual_memory().total / 2**30, 1), "loadavg_at_start": os.getloadavg()}


def fmt(x: float | None, spec: str = ".3f") -> str:
    return "-" if x is None else format(x, spec)


def report(res: dict[str, Any]) -> None:
    sizes = [s for s in res["sizes"] if "error" not in res["sizes"][s]]
    cols = ["environment", "reward", "s3_weed", "generation_standin", "trainer_standin"]
    print("\nControl plane alone (instant stand-in generation server, stand-in trainer; CPU ms per trained sample)")
    print(f"{'size':>6} {'samples/s':>10} " + " ".join(f"{c[:12]:>12}" for c in cols) + f" {'control plane':>14}"
          f" {'cp cores':>9} {'load avg':>9}")
    for s in sizes:
        r = res["sizes"][s]
        print(f"{s:>6} {r['samples_per_s']:>10.0f} " + " ".join(f"{r['ms_per_sample'][c]:>12.3f}" for c in cols)
              + f" {r['control_plane_ms_per_sample']:>14.3f} {r['control_plane_cores']:>9.2f}"
              f" {r['loadavg_window_end'][0]:>9.1f}")
    s = res["summary"]
    print(f"ratio control-plane CPU/sample {s.get('large')} / {s.get('small')}: {fmt(s.get('ratio'))} "
          f"(target <= {TARGET_RATIO}); <= {TARGET_MS} ms per sample: {s.get('meets_ms_target')}")
    for s_name in sizes:
        prof = res["sizes"][s_name].get("profile", {})
        if prof.get("event_loop_busy_samples"):
            print(f"  profile {s_name}: environment event loop busy {prof['event_loop_busy_samples']} samples, "
                  f"{prof['gc_share']:.1%} of them in CPython's cyclic GC")
        for row in prof.get("inclusive_asyncrl", [])[:6]:
            print(f"  profile {s_name}: {row['share']:6.1%} {row['function']}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--sizes", default="256,5000", help=f"comma-separated, of {sorted(SIZES)}")
    p.add_argument("--warmup-s", type=float, default=10.0)
    p.add_argument("--window-s", type=float, default=20.0)
    p.add_argument("--profile-s", type=float, default=15.0, help="py-spy the largest size's environment; 0: none")
    p.add_argument("--set", action="append", default=[], help="more config overrides (key=value)")
    p.add_argument("--keep-data", action="store_true", help="keep each run's S3 data folder")
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/control_plane.json"))
    args = p.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))  # a killed benchmark still stops every role it started
    args.sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in args.sizes if s not in SIZES]
    if unknown:
        raise SystemExit(f"--sizes: unknown {unknown}, expected some of {sorted(SIZES)}")
    res: dict[str, Any] = {
        "what": "control plane alone: real environment and reward roles and embedded S3 (weed); stand-in "
                "generation server (real FastAPI front end, instant no-op engine) and stand-in trainer (no model)",
        "command": shlex.join([".venv/bin/python", "benchmarks/control_plane.py", *sys.argv[1:]]),
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"), "machine": machine(), "versions": versions(),
        "targets": {"control_plane_ms_per_sample": TARGET_MS, "ratio_large_to_small": TARGET_RATIO},
        "notes": ["generation_standin: the real front end's routes and validation, but no vLLM engine client; "
                  "its CPU approximates, does not equal, the real front end's",
                  "figures are sensitive to other load on the machine: see loadavg_* per size"],
        "sizes": {},
    }
    runs_dir = ROOT / "runs" / "bench-control-plane"
    for size in args.sizes:
        try:
            res["sizes"][size] = run_size(size, args, runs_dir)
        except Exception as e:  # the other size still runs; the error goes in the JSON
            log(f"size {size} failed: {e}")
            res["sizes"][size] = {"error": f"{type(e).__name__}: {e}"}
    ok = {s: r for s, r in res["sizes"].items() if "error" not in r}
    summary: dict[str, Any] = {}
    if ok:
        small, large = min(ok, key=int), max(ok, key=int)
        a, b = ok[small]["control_plane_ms_per_sample"], ok[large]["control_plane_ms_per_sample"]
        summary = {"small": small, "large": large, "ratio": b / a if small != large else None,
                   "ratio_by_process": {k: ok[large]["ms_per_sample"][k] / ok[small]["ms_per_sample"][k]
                                        for k in ok[small]["ms_per_sample"] if ok[small]["ms_per_sample"][k] > 0},
                   "meets_ms_target": all(r["control_plane_ms_per_sample"] <= TARGET_MS for r in ok.values())}
        summary["meets_ratio_target"] = summary["ratio"] is not None and summary["ratio"] <= TARGET_RATIO
    res["summary"] = summary
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(res, indent=2) + "\n")
    report(res)
    log(f"wrote {out}")
    if len(ok) < len(args.sizes):
        raise SystemExit(1)


if __name__ == "__main__":
    main()
