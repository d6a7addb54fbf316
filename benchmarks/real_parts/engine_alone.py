"""The generation engine alone on a real model: tokens/s and GFLOP/s against this machine's matrix-multiply peak.

Each configuration (dtype, OpenMP threads, `max_num_seqs`) runs in a child process of its own, started fresh (vLLM's
processes, threads and memory gone before the next), through asyncrl's own engine wrapper
(`asyncrl.generation.engine.GenerationEngine`, the generation server's engine settings) in process. A child:
1. measures the matrix-multiply peak (`real_parts.matmul_peak`, 2048^3) in the engine's precision on the engine's
   thread count (cpu_threads 0, vLLM's automatic binding, binds one core of two here: measured on 1 thread);
2. starts the engine with a KV cache sized for `max_num_seqs` whole sequences (prompt + max_tokens), warms it up;
3. for each sampling mode (temperature 1 with a seed per request, greedy), submits `requests_per_seq` x
   `max_num_seqs` chat-formatted prompts of 60-90 tokens at once (arithmetic word problems rendered with the
   model's chat template; different prompts per mode) and times them to the last token;
4. measures the peak again (the machine is shared: the two peaks bracket the engine's run).
Work is counted by `real_parts.engine_flops` (linear FLOPs = 2 x params per position, tied head counted once,
attention separately, prompt positions that hit vLLM's prefix cache not counted: the shared chat header).
With `ignore_eos` (default) every request decodes exactly `max_tokens`: the batch stays full, which measures the
engine at `max_num_seqs`; `--stop-at-eos` measures the realistic mix (the batch drains as answers end).

Run: `python benchmarks/real_parts/engine_alone.py --model DIR --seqs 64,128,256 --threads 1,2,0
--dtypes float32 --out benchmarks/results/real_engine_alone.json` (heavy: wrap in
`flock /tmp/asyncrl-heavy.lock` on a shared machine).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
DEFAULT_MODEL = str(ROOT / ".cache/asyncrl/models/smollm2-135m-instruct")  # make import-smollm2
KV_HEADROOM = 1.05  # a little more than whole sequences need (`kv_budget.gib_for` already counts whole blocks)

_NAMES = ["Tom", "Ana", "Ravi", "Mei", "Lucas", "Fatima", "Jonas", "Chloe", "Kenji", "Amara", "Diego", "Sofia"]
_ITEMS = [("marbles", "bags"), ("apples", "crates"), ("stickers", "packs"), ("pencils", "boxes"),
          ("cookies", "trays"), ("stamps", "albums"), ("seashells", "buckets"), ("cards", "decks")]


def word_problem(rng: random.Random) -> str:
    """One multi-step arithmetic word problem (answer: a whole number), with the instruction to reason first."""
    name, other = rng.sample(_NAMES, 2)
    item, box = rng.choice(_ITEMS)
    a, b, c, d, e = rng.randint(5, 90), rng.randint(2, 9), rng.randint(3, 25), rng.randint(1, 30), rng.randint(1, 9)
    loses = f" and loses {e} more" if rng.random() < 0.5 else ""
    return (f"{name} has {a} {item}. {name} buys {b} {box} with {c} {item} in each, then gives {d} {item} to "
            f"{other}{loses}. How many {item} does {name} have now? Think step by step, then end with 'Answer: N'.")


def chat_prompts(model: str, count: int, seed: int, lo: int = 60, hi: int = 90) -> list[list[int]]:
    """`count` distinct chat-rendered prompts (the model's own template, generation prompt added) of lo..hi tokens."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    rng = random.Random(seed)
    out: list[list[int]] = []
    seen: set[tuple[int, ...]] = set()
    for _ in range(100 * count):
        if len(out) == count:
            return out
        ids = tok.apply_chat_template([{"role": "user", "content": word_problem(rng)}], add_generation_prompt=True,
                                      tokenize=True, return_dict=True)["input_ids"]
        if lo <= len(ids) <= hi and tuple(ids) not in seen:
            seen.add(tuple(ids))
            out.append(list(ids))
    raise RuntimeError(f"could not render {count} distinct prompts of {lo}-{hi} tokens (got {len(out)})")


def common_prefix(seqs: list[list[int]]) -> int:
    """Length of the token prefix every sequence shares (what vLLM's prefix cache serves after the first)."""
    if not seqs:
        return 0
    n = min(len(s) for s in seqs)
    for i in range(n):
        if any(s[i] != seqs[0][i] for s in seqs):
            return i
    return n


def tree_cpu_s() -> dict[str, float]:
    """User + system CPU seconds of this process ("front") and its live descendants by process title (vLLM's
    "VLLM::EngineCore" and "VLLM::Worker"; anything else under "other")."""
    import psutil

    me = psutil.Process()
    out: dict[str, float] = {}
    for p in [me, *me.children(recursive=True)]:
        try:
            t = p.cpu_times()
            title = " ".join(p.cmdline())
        except psutil.Error:
            continue
        key = "front" if p.pid == me.pid else "worker" if "Worker" in title else "core" if "EngineCore" in title \
            else "other"
        out[key] = out.get(key, 0.0) + t.user + t.system
    return out


# ---- one configuration (child process) -----------------------------------------------------------------------------
async def run_config(spec: dict[str, Any]) -> dict[str, Any]:
    from asyncrl.generation.engine import EngineSettings, GenerateParams, GenerationEngine
    from asyncrl.generation.kv_budget import BLOCK_SIZE, gib_for
    from real_parts.engine_flops import ModelShape, batch_work
    from real_parts.matmul_peak import measure_matmul_peak

    model, dtype, threads, seqs = spec["model"], spec["dtype"], int(spec["threads"]), int(spec["seqs"])
    max_tokens, per_seq, ignore_eos = int(spec["max_tokens"]), int(spec["requests_per_seq"]), bool(spec["ignore_eos"])
    cfg = json.loads((Path(model) / "config.json").read_text())
    shape = ModelShape.from_config(cfg)
    peak_threads = threads if threads > 0 else 1  # vLLM's auto binding: one core per worker, one left to the rest
    peak_kw = dict(size=int(spec["peak_size"]), warmup=1, repeats=int(spec["peak_repeats"]), dtypes=(dtype,))
    peak_before = measure_matmul_peak(peak_threads, **peak_kw)[f"{dtype}_gflops"]

    modes = [m for m in spec["modes"]]
    n = seqs * per_seq
    prompts = chat_prompts(model, n * len(modes) + seqs, seed=int(spec["seed"]))
    warm, prompts = prompts[:seqs], prompts[seqs:]
    max_prompt = max(len(p) for p in prompts + warm)
    max_model_len = (max_prompt + max_tokens + 15) // 16 * 16
    kv_gib = spec.get("kv_cache_gib") or KV_HEADROOM * gib_for(cfg, dtype, seqs, max_model_len)
    settings = EngineSettings(model=model, max_model_len=max_model_len, kv_cache_gib=float(kv_gib), max_num_seqs=seqs,
                              seed=0, dtype=dtype, cpu_threads=threads, ring_poll_s=spec["ring_poll_s"],
                              work_dir=tempfile.mkdtemp(prefix="asyncrl-ea-"),
                              enforce_eager=not spec.get("compile", False))
    t0 = time.monotonic()
    engine = await GenerationEngine.start(settings)
    start_s = time.monotonic() - t0
    eos = int(cfg.get("eos_token_id", 2)) if not isinstance(cfg.get("eos_token_id"), list) else cfg["eos_token_id"][0]
    try:
        async def batch(ps: list[list[int]], greedy: bool, tokens: int, tag: str) -> list[dict[str, Any]]:
            return list(await asyncio.gather(*[engine.generate(GenerateParams(
                request_id=f"{tag}-{i}", prompt_token_ids=p, max_tokens=tokens, temperature=0.0 if greedy else 1.0,
                seed=None if greedy else 1000 + i, stop_token_ids=[] if ignore_eos else [eos], ignore_eos=ignore_eos,
                )) for i, p in enumerate(ps)]))

        t = time.monotonic()
        await batch(warm, greedy=False, tokens=8, tag="warm")
        warm_s = time.monotonic() - t
        rows = []
        for k, mode in enumerate(modes):
            ps = prompts[k * n:(k + 1) * n]
            cached = common_prefix(ps) // BLOCK_SIZE * BLOCK_SIZE  # vLLM's prefix cache serves whole blocks only
            cpu0, load0 = tree_cpu_s(), os.getloadavg()[0]
            t = time.perf_counter()
            outs = await batch(ps, greedy=mode == "greedy", tokens=max_tokens, tag=mode)
            wall = time.perf_counter() - t
            cpu1 = tree_cpu_s()
            cpu_by = {k: cpu1.get(k, 0.0) - cpu0.get(k, 0.0) for k in cpu1}
            cpu = sum(cpu_by.values())
            gen = [len(o["token_ids"]) for o in outs]
            work = batch_work(shape, [(len(p), g, cached) for p, g in zip(ps, gen, strict=True)])
            decode_only = batch_work(shape, [(len(p), g, len(p) - 1) for p, g in zip(ps, gen, strict=True)])
            peak = peak_before
            rows.append({
                "mode": mode, "requests": n, "wall_s": wall, "generated_tokens": sum(gen),
                "prompt_tokens": sum(len(p) for p in ps), "prompt_tokens_cached": cached * (n - 1),
                "finish_length": sum(o["finish_reason"] == "length" for o in outs),
                "tokens_per_s": sum(gen) / wall,
                "linear_gflops": work.linear_flops / wall / 1e9,
                "attention_gflops": work.attention_flops / wall / 1e9,
                "total_gflops": work.total_flops / wall / 1e9,
                "decode_linear_gflops": decode_only.linear_flops / wall / 1e9,
                "fraction_of_peak_linear": work.linear_flops / wall / 1e9 / peak,
                "fraction_of_peak_total": work.total_flops / wall / 1e9 / peak,
                "cpu_s": cpu, "cpu_s_by_process": cpu_by, "cores_busy": cpu / wall,
                # per CPU-second of the worker (the process that runs the model): what the work got of the cores it
                # ran on, less sensitive than wall-clock figures to other processes sharing the machine
                "linear_gflop_per_worker_cpu_s": work.linear_flops / max(cpu_by.get("worker", 0.0), 1e-9) / 1e9,
                "loadavg_1m_before": load0,
                "loadavg_1m_after": os.getloadavg()[0],
            })
            print(f"engine alone: {dtype} threads={threads} seqs={seqs} {mode}: {sum(gen)} tokens in {wall:.1f} s, "
                  f"{sum(gen) / wall:.0f} tok/s, {rows[-1]['linear_gflops']:.1f} linear GFLOP/s "
                  f"({rows[-1]['fraction_of_peak_linear']:.2f} of {peak:.0f}), {cpu / wall:.2f} cores, "
                  f"{rows[-1]['linear_gflop_per_worker_cpu_s']:.1f} GFLOP per worker CPU-s", flush=True)
    finally:
        engine.shutdown()
    peak_after = measure_matmul_peak(peak_threads, **peak_kw)[f"{dtype}_gflops"]
    for r in rows:
        r["fraction_of_peak_linear_after"] = r["linear_gflops"] / peak_after
    return {"dtype": dtype, "threads": threads, "peak_threads": peak_threads, "max_num_seqs": seqs,
            "max_model_len": max_model_len, "kv_cache_gib": kv_gib, "max_tokens": max_tokens, "ignore_eos": ignore_eos,
            "ring_poll_s": spec["ring_poll_s"], "engine_start_s": start_s, "warmup_s": warm_s,
            "peak_gflops_before": peak_before, "peak_gflops_after": peak_after, "runs": rows}


# ---- the matrix (parent) -------------------------------------------------------------------------------------------
def run_child(spec: dict[str, Any], timeout_s: float) -> dict[str, Any]:
    """One configuration in a fresh process (its own session: whatever is left of it afterwards is killed)."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-ea-spec-") as d:
        spec_path, out_path = Path(d) / "spec.json", Path(d) / "out.json"
        spec_path.write_text(json.dumps(spec))
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(BENCH), str(ROOT), os.environ.get("PYTHONPATH", "")]),
                   TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1")
        proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--child", str(spec_path),
                                 "--out", str(out_path)], cwd=ROOT, env=env, start_new_session=True)
        try:
            rc = proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            rc = None
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        if rc is None:
            return {**spec, "error": f"timed out after {timeout_s:.0f} s"}
        if rc != 0 or not out_path.is_file():
            return {**spec, "error": f"exited with code {rc}"}
        return dict(json.loads(out_path.read_text()))


def _csv(kind: type, text: str) -> list[Any]:
    return [kind(x) for x in text.split(",") if x.strip()]


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL, help="Hugging Face model folder")
    p.add_argument("--seqs", default="64,128,256", help="max_num_seqs values (comma-separated)")
    p.add_argument("--threads", default="1,2,0", help="generation.cpu_threads values (0: vLLM's binding)")
    p.add_argument("--dtypes", default="float32", help="engine dtypes: float32, bfloat16")
    p.add_argument("--modes", default="sampled,greedy", help="sampled (temperature 1), greedy")
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--requests-per-seq", type=int, default=1, help="requests = this x max_num_seqs, sent at once")
    p.add_argument("--stop-at-eos", action="store_true", help="stop at the model's EOS (default: decode max_tokens)")
    p.add_argument("--ring-poll-s", type=float, default=0.0005, help="generation.ring_poll_s (negative: vLLM's spin)")
    p.add_argument("--kv-cache-gib", type=float, default=None, help="default: sized for max_num_seqs sequences")
    p.add_argument("--peak-size", type=int, default=2048)
    p.add_argument("--peak-repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compile", action="store_true", help="let vLLM compile the model (torch.compile; default eager)")
    p.add_argument("--timeout-s", type=float, default=1800.0, help="per configuration")
    p.add_argument("--out", type=Path, help="write the JSON result here")
    p.add_argument("--child", type=Path, help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    if a.child is not None:
        sys.path[:0] = [str(BENCH), str(ROOT)]
        result = asyncio.run(run_config(json.loads(a.child.read_text())))
        a.out.write_text(json.dumps(result, indent=2) + "\n")
        return
    base = {"model": a.model, "max_tokens": a.max_tokens, "requests_per_seq": a.requests_per_seq,
            "ignore_eos": not a.stop_at_eos, "ring_poll_s": None if a.ring_poll_s < 0 else a.ring_poll_s,
            "kv_cache_gib": a.kv_cache_gib, "peak_size": a.peak_size, "peak_repeats": a.peak_repeats, "seed": a.seed,
            "modes": _csv(str, a.modes), "compile": a.compile}
    results = []
    for dtype in _csv(str, a.dtypes):
        for threads in _csv(int, a.threads):
            for seqs in _csv(int, a.seqs):
                results.append(run_child({**base, "dtype": dtype, "threads": threads, "seqs": seqs}, a.timeout_s))
                if a.out:  # after each configuration: a long matrix cut short keeps what it measured
                    a.out.parent.mkdir(parents=True, exist_ok=True)
                    a.out.write_text(json.dumps({"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "args": vars(a) | {
                        "out": str(a.out), "child": None}, "configs": results}, indent=2) + "\n")
    for r in results:
        for row in r.get("runs", []):
            print(f"{r['dtype']:>8} threads={r['threads']} seqs={r['max_num_seqs']:>3} {row['mode']:>7}: "
                  f"{row['tokens_per_s']:6.0f} tok/s  linear {row['linear_gflops']:6.1f} GFLOP/s  "
                  f"({row['fraction_of_peak_linear']:.2f} of peak {r['peak_gflops_before']:.0f}) "
                  f"+ attention {row['attention_gflops']:.1f}")
        if "error" in r:
            print(f"{r['dtype']} threads={r['threads']} seqs={r['seqs']}: {r['error']}")


if __name__ == "__main__":
    main()
