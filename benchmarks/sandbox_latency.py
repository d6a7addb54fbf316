"""What isolation costs a tool call: `run_python` (namespaces, seccomp, rlimits) against the same program in a plain
`python -I -S` child process with no isolation at all, side by side, on a few legitimate tool programs.

    .venv/bin/python benchmarks/sandbox_latency.py [--reps 30] [--out benchmarks/results/sandbox_latency.json]

Prints median and p90 wall milliseconds per call and their ratio; run on a quiet machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=30)
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
    doc = {"reps": args.reps, "interpreter": host.python, "bwrap": host.bwrap, "programs": rows,
           "note": "plain_interpreter is the same program in `python -I -S` with no isolation (the floor)"}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
