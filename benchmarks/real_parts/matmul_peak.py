"""This machine's matrix-multiply peak: GFLOP/s of one n x n x n product (default 2048) in float32 and bfloat16.

Owns the one measurement every real-model FLOP/s figure is divided by: `measure_matmul_peak(threads)` sets torch to
`threads` threads (restored afterwards), warms each dtype up, then times `repeats` products and keeps the best
(2·n³ FLOP each; the best, not the mean, because a shared machine only ever slows a run down). Measure it in the same
run and on the same threads as the figure it is compared with: a frequency or load change between the two would
otherwise show up as a change of efficiency.

Library use: `from real_parts.matmul_peak import measure_matmul_peak` (with `benchmarks/` on `sys.path`).
Script: `python benchmarks/real_parts/matmul_peak.py --threads 2 --out benchmarks/results/matmul_peak.json`.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path
from typing import Any

DTYPES = ("float32", "bfloat16")


def _best_gflops(dtype_name: str, size: int, warmup: int, repeats: int,
                 max_seconds: float) -> tuple[float, list[float], list[float]]:
    """(best GFLOP/s, every timed product's seconds, and its process CPU seconds) of `size`³ products in `dtype_name` on torch's current threads.

    A warm-up product that takes over a second is warm-up enough (a CPU without native bf16 takes ~20 s for one);
    timed products stop once they have taken `max_seconds` together (at least one is timed)."""
    import torch

    dtype = getattr(torch, dtype_name)
    gen = torch.Generator().manual_seed(0)
    a = torch.randn(size, size, generator=gen).to(dtype)
    b = torch.randn(size, size, generator=gen).to(dtype)
    out = torch.empty(size, size, dtype=dtype)
    for _ in range(warmup):
        t0 = time.perf_counter()
        torch.mm(a, b, out=out)
        if time.perf_counter() - t0 > 1.0:
            break
    times: list[float] = []
    cpu: list[float] = []
    while len(times) < repeats and sum(times) < max_seconds:
        t0, c0 = time.perf_counter(), time.process_time()
        torch.mm(a, b, out=out)
        times.append(time.perf_counter() - t0)
        cpu.append(time.process_time() - c0)
    return 2.0 * size**3 / min(times) / 1e9, times, cpu


def measure_matmul_peak(threads: int, size: int = 2048, warmup: int = 2, repeats: int = 5,
                        dtypes: tuple[str, ...] = DTYPES, max_seconds: float = 20.0,
                        verbose: bool = True) -> dict[str, Any]:
    """GFLOP/s of a `size`³ matrix product on `threads` torch threads, per dtype: the best of up to `repeats` timed
    products (fewer once they took `max_seconds`) after `warmup` untimed ones.

    Returns {"threads", "size", "repeats", "<dtype>_gflops", "<dtype>_seconds" (every timed product),
    "<dtype>_gflops_per_cpu_s" (the best product's FLOP over its process CPU seconds / threads), "torch",
    "machine", "cpu_flags" (the matrix-relevant ones)}; prints one line per dtype when `verbose`."""
    import torch

    if threads < 1:
        raise ValueError(f"threads: expected >= 1, got {threads}")
    if size < 1 or warmup < 0 or repeats < 1:
        raise ValueError(f"size, warmup, repeats: expected >= 1, >= 0, >= 1, got {size}, {warmup}, {repeats}")
    unknown = [d for d in dtypes if d not in DTYPES]
    if unknown:
        raise ValueError(f"dtypes: expected some of {DTYPES}, got {unknown}")
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    result: dict[str, Any] = {"threads": threads, "size": size, "repeats": repeats, "torch": torch.__version__,
                              "machine": _machine(), "cpu_flags": _matrix_flags()}
    try:
        for name in dtypes:
            gflops, times, cpu = _best_gflops(name, size, warmup, repeats, max_seconds)
            result[f"{name}_gflops"] = gflops
            result[f"{name}_seconds"] = times
            # per thread-second of CPU: what the threads do while they run (a loaded machine slows the wall clock)
            result[f"{name}_gflops_per_cpu_s"] = 2.0 * size**3 * threads / min(cpu) / 1e9 if min(cpu) > 0 else None
            if verbose:
                print(f"matmul peak: {size}x{size}x{size} {name} on {threads} thread(s): {gflops:.1f} GFLOP/s "
                      f"(best of {len(times)}, {min(times) * 1e3:.1f} ms)", flush=True)
    finally:
        torch.set_num_threads(before)
    return result


def _machine() -> str:
    """The CPU's model name (from /proc/cpuinfo where there is one) and its architecture."""
    model = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return f"{model} ({platform.machine()})"


def _matrix_flags() -> list[str]:
    """The CPU flags that decide matrix-multiply speed (AVX2/FMA, AVX-512, its bf16 extension, AMX), from
    /proc/cpuinfo; [] where it is unreadable."""
    try:
        text = Path("/proc/cpuinfo").read_text()
    except OSError:
        return []
    flags = next((line.split(":", 1)[1].split() for line in text.splitlines() if line.startswith("flags")), [])
    return sorted(f for f in flags if f in ("avx2", "fma") or f.startswith(("avx512", "amx")))


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--size", type=int, default=2048)
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--max-seconds", type=float, default=20.0, help="per dtype, the timed products' total at most")
    p.add_argument("--out", type=Path, help="write the result as JSON here")
    a = p.parse_args(argv)
    result = measure_matmul_peak(a.threads, a.size, repeats=a.repeats, max_seconds=a.max_seconds)
    result["date"] = time.strftime("%Y-%m-%d %H:%M:%S %Z")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        print(f"wrote {a.out}")


if __name__ == "__main__":
    main()
