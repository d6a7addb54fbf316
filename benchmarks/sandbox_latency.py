"""What isolation costs a tool call: `run_python` (namespaces, seccomp, rlimits) against the same program in a plain
`python -I -S` child process with no isolation at all, and through the sandbox service (`asyncrl.sandbox.server`
on loopback, one kept-alive client, as the tool-use environment calls a cluster's sandbox pool), side by side, on a
few legitimate tool programs. Then the service's throughput: a burst of calls at once, and the CPU seconds per call
of the service and everything it started (the figure that sizes a pool: pods = peak calls/s x CPU per call / CPUs
per pod).

    .venv/bin/python benchmarks/sandbox_latency.py [--reps 30] [--burst 200] [--out benchmarks/results/sandbox_latency.json]

Prints median and p90 wall milliseconds per call and their ratios; run on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import secrets
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from asyncrl.sandbox.client import RemoteSandbox  # noqa: E402
from asyncrl.sandbox.host import sandbox_host  # noqa: E402
from asyncrl.sandbox.runner import run_python  # noqa: E402

PROGRAMS = {
    "print": "print(3 * 9)",
    "loop_100k": "print(sum(i * i for i in range(100000)))",
    "stdlib_imports": "import json, re, math, fractions\nprint(json.dumps([math.pi, str(fractions.Fraction(1, 3))]))",
    "files": "open('x.txt', 'w').write('1' * 1000)\nprint(len(open('x.txt').read()))",
}


async def plain(code: str, python: str) -> str:
    proc = await asyncio.create_subprocess_exec(python, "-I", "-S", "-c", code, stdout=asyncio.subprocess.PIPE,
                                                cwd="/tmp", env={})
    out, _ = await proc.communicate()
    return out.decode()


def timed(fn, reps: int) -> list[float]:
    ms = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        ms.append((time.perf_counter() - t) * 1000)
    return ms


def summary(ms: list[float]) -> dict[str, float]:
    return {"median_ms": statistics.median(ms), "p90_ms": sorted(ms)[int(0.9 * (len(ms) - 1))]}


def start_service(token: str) -> tuple[subprocess.Popen, str]:
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.sandbox.server", "--port", "0"], cwd=ROOT,
                            env={**os.environ, "ASYNCRL_SANDBOX_TOKEN": token}, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    assert proc.stdout is not None
    for line in proc.stdout:
        if "listening on" in line:
            return proc, f"http://127.0.0.1:{line.rsplit(':', 1)[1].strip()}"
    raise RuntimeError("the sandbox service did not start")


def busy_cpu() -> float:
    """CPU seconds the whole machine spent busy so far. A sandboxed program's time does not reach the service's
    `children_*` counters (the program's PID namespace ends with it), so the burst is measured machine-wide: the
    service, its sandboxes and this client (quiet machine assumed)."""
    t = psutil.cpu_times()
    return sum(t) - t.idle - getattr(t, "iowait", 0.0)


async def service_rows(url: str, token: str, reps: int, burst: int) -> tuple[dict, dict]:
    sandbox = RemoteSandbox(url, token=token)
    try:
        rows = {}
        for name, code in PROGRAMS.items():
            assert (await sandbox.run(code)).ok, name
            ms = []
            for _ in range(reps):
                t = time.perf_counter()
                await sandbox.run(code)
                ms.append((time.perf_counter() - t) * 1000)
            rows[name] = summary(ms)
        health = await sandbox.health()
        c0, t0 = busy_cpu(), time.perf_counter()
        results = await asyncio.gather(*[sandbox.run(PROGRAMS["print"]) for _ in range(burst)])
        wall, cpu = time.perf_counter() - t0, busy_cpu() - c0
        assert all(r.ok for r in results)
        return rows, {"calls": burst, "max_concurrent": health["max_concurrent"], "wall_s": wall,
                      "calls_per_s": burst / wall, "cpu_s_per_call": cpu / burst, "cpu_measured": "machine-wide busy time", "cpus": len(os.sched_getaffinity(0))}
    finally:
        await sandbox.aclose()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--burst", type=int, default=200, help="calls sent to the service at once for its throughput")
    ap.add_argument("--out", default=str(ROOT / "benchmarks/results/sandbox_latency.json"))
    args = ap.parse_args()
    host = sandbox_host()
    rows = {}
    for name, code in PROGRAMS.items():
        r = asyncio.run(run_python(code))
        assert r.ok, (name, r.stderr)
        sandboxed = summary(timed(lambda c=code: asyncio.run(run_python(c)), args.reps))
        bare = summary(timed(lambda c=code: asyncio.run(plain(c, host.python)), args.reps))
        rows[name] = {"sandboxed": sandboxed, "plain_interpreter": bare,
                      "ratio_median": sandboxed["median_ms"] / bare["median_ms"]}
        print(f"{name:16s} sandboxed {sandboxed['median_ms']:6.1f} ms (p90 {sandboxed['p90_ms']:6.1f})   "
              f"plain {bare['median_ms']:6.1f} ms (p90 {bare['p90_ms']:6.1f})   x{rows[name]['ratio_median']:.2f}")
    token = secrets.token_urlsafe(32)
    proc, url = start_service(token)
    try:
        served, throughput = asyncio.run(service_rows(url, token, args.reps, args.burst))
    finally:
        proc.terminate()
        proc.wait(10)
    for name, row in served.items():
        rows[name]["service"] = row
        rows[name]["ratio_service_median"] = row["median_ms"] / rows[name]["sandboxed"]["median_ms"]
        print(f"{name:16s} through the service {row['median_ms']:6.1f} ms (p90 {row['p90_ms']:6.1f})   "
              f"x{rows[name]['ratio_service_median']:.2f} of the in-process sandbox")
    print(f"service burst: {throughput['calls']} calls at once, {throughput['calls_per_s']:.1f} calls/s on "
          f"{throughput['cpus']} CPUs ({throughput['max_concurrent']} at a time), "
          f"{throughput['cpu_s_per_call'] * 1000:.1f} ms of CPU per call")
    doc = {"reps": args.reps, "interpreter": host.python, "bwrap": host.bwrap, "programs": rows,
           "service_burst": throughput,
           "note": "plain_interpreter is the same program in `python -I -S` with no isolation (the floor); service "
                   "is the same sandbox through asyncrl.sandbox.server on loopback"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
