"""The trainer alone on the real model: `PolicyTrainer.train_step` on realistic long-answer batches, against this
machine's matrix-multiply peak measured in the same process on the same threads.

The batch: 8 ChatML prompts (the model's chat template, a system prompt and an arithmetic word problem, 60-90 tokens)
x 8 samples = 64 samples a step; responses of a long-tailed length (lognormal, median 90 tokens, sigma 0.7, at most
256 = max_new_tokens; one that reaches 256 has no end-of-turn token, as a truncated answer), their tokens cut from a
tokenized reasoning text, loss mask 1 throughout, rewards 0/1 by a fixed draw. The content does not change the
compute; the lengths do.

Each variant runs in a subprocess of its own (fresh memory for the RSS figure, its own DeepSpeed init): torch threads
= `--threads`, the trainer's heap setting (`asyncrl.training.heap`), the matmul peak of the variant's dtype
(`real_parts.matmul_peak`) before and after the steps, one warm-up step on 8 samples, then `--steps` timed steps of
`train_step` on the 64-sample batch. Figures per variant:
- tokens/s: all tokens processed (prompt + response, padding excluded) and response (trained) tokens, per second of
  `train_step`;
- GFLOP/s as 6 x N x tokens, N = the model's unique parameters (the tied embedding counted once, as the LM head's
  matrix product), tokens = all tokens processed; `attention` adds the causal attention products, 6 x layers x
  hidden x L^2 per sequence of length L (QK^T and AV, the causal half, forward and backward); `executed` counts the
  matrix products the trainer actually runs: the body (N less the embedding) on every computed token (padding
  included), the LM head on the positions it runs at (every computed position, or the trained ones only), and
  attention on the padded lengths;
- the fraction of each of those of the peak (the better of the two peak measurements), by the wall clock, and per
  CPU second of the step's threads against the peak's own (`_per_cpu_s`: robust to other processes sharing the
  cores, which the result records as `others_cpu_share` per step);
- RSS: the process's peak (`ru_maxrss`) and after the steps.
With `--profile` a variant also records torch.profiler's top operators of one more step.

Run (alone on the machine: no vLLM, no other heavy job):
`flock /tmp/asyncrl-heavy.lock .venv/bin/python benchmarks/real_parts/trainer_alone.py --out
benchmarks/results/trainer_alone.json`. `--asyncrl-src DIR` runs the workers on another copy of the package (a
`git archive` of an earlier commit, for before/after figures).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve()
ROOT = HERE.parents[2]
MODEL = ROOT / ".cache/asyncrl/models/smollm2-135m-instruct"  # make import-smollm2
PROMPTS, SAMPLES, MAX_NEW = 8, 8, 256
MEDIAN, SIGMA = 90, 0.7
SYSTEM = "You are a careful math tutor. Think step by step and end with the final answer as 'Answer: N'."
PROBLEMS = (
    "A bakery sells {a} loaves in the morning and {b} in the afternoon. In the evening it sells {c} fewer than in "
    "the morning and afternoon together. How many loaves does it sell that day?",
    "Mia has {a} stickers. She gives {b} to her brother and then buys {c} packs of 4 stickers each. How many "
    "stickers does she have now?",
    "A train travels {a} km in the first hour and {b} km in the second hour. In the third hour it travels {c} km "
    "more than in the first. What distance does it cover in three hours?",
    "A farmer plants {a} rows of {b} trees each, and {c} of the trees do not grow. How many trees grow?",
)
REASONING = (
    "Let us work through the problem one step at a time. First, we write down the quantities that the problem "
    "gives us and what it asks for. The first amount is added to the second amount, which gives the total of the "
    "first two parts. Next, we compute the third part from the information in the question: it is described "
    "relative to the others, so we subtract or add as the wording says. Then we add the three parts together. "
    "Checking the arithmetic again: the sum of the first two numbers is correct, the difference is correct, and "
    "the final total matches. We can also verify by estimating: the numbers are close to round values, and the "
    "estimate agrees with the exact result. Therefore the final answer is the total we computed above. "
)

# ---- the driver ------------------------------------------------------------------------------------------------

VARIANTS: dict[str, dict[str, Any]] = {
    # the setting: 16 samples per forward/backward, in order (the trainer before the token budget needed
    # ~16 GB there: skipped when the machine has less available)
    "float32_by_count_16": {"dtype": "float32", "min_available_gb": 18, "training": {"micro_batch_size": 16}},
    "float32_by_count_8": {"dtype": "float32", "min_available_gb": 10, "training": {"micro_batch_size": 8}},
    "float32_tokens_1024": {"dtype": "float32", "training": {"micro_batch_size": 64, "micro_batch_tokens": 1024}},
    "float32_tokens_2048": {"dtype": "float32", "training": {"micro_batch_size": 64, "micro_batch_tokens": 2048}},
    "float32_tokens_4096": {"dtype": "float32", "training": {"micro_batch_size": 64, "micro_batch_tokens": 4096}},
    "float32_tokens_4096_ckpt": {"dtype": "float32", "training": {"micro_batch_size": 64, "micro_batch_tokens": 4096,
                                                                  "gradient_checkpointing": True}},
    # an experiment, not a trainer setting: each decoder layer compiled by torch.compile (inductor: fused C++ kernels
    # for the elementwise work around the matrix products); the warm-up step compiles
    "float32_tokens_2048_compiled": {"dtype": "float32", "compile_layers": True,
                                     "training": {"micro_batch_size": 64, "micro_batch_tokens": 2048}},
    # bf16 on a CPU without native bf16 multiplies at ~1-3 GFLOP/s: one small step only
    "bfloat16_tokens_4096_small": {"dtype": "bfloat16", "samples": 2, "warmup": False, "steps": 1,
                                   "training": {"micro_batch_size": 64, "micro_batch_tokens": 4096}},
}


def run_variant(name: str, spec: dict[str, Any], args: argparse.Namespace) -> dict[str, Any]:
    """`name` in a subprocess of its own; its result, or {"error": ...}."""
    if args.samples and "samples" not in spec:
        spec = {**spec, "samples": args.samples}
    spec = {**spec, "name": name, "threads": args.threads, "steps": spec.get("steps", args.steps),
            "profile": args.profile, "model": str(args.model)}
    env = dict(os.environ)
    env.setdefault("DS_BUILD_OPS", "0")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.setdefault("HF_HUB_OFFLINE", "1")
    src = str(args.asyncrl_src) if args.asyncrl_src else str(ROOT)
    env["PYTHONPATH"] = os.pathsep.join([src, str(ROOT / "benchmarks")])
    available = _available_gb()
    if available < spec.get("min_available_gb", 0):
        return {"name": name, "error": f"skipped: {available:.1f} GB available, the variant needs "
                                       f"{spec['min_available_gb']} GB"}
    out = Path(f"/tmp/trainer_alone.{os.getpid()}.{name}.json")
    out.unlink(missing_ok=True)
    cmd = [sys.executable, str(HERE), "--worker", json.dumps(spec), "--out", str(out)]
    print(f"[trainer_alone] {name}: {' '.join(cmd[:2])} ...", flush=True)
    t0 = time.monotonic()
    proc = subprocess.run(cmd, env=env, cwd=src, timeout=args.timeout_s, check=False)
    if proc.returncode != 0 or not out.is_file():
        return {"name": name, "error": f"exited with code {proc.returncode}", "wall_s": time.monotonic() - t0}
    result = json.loads(out.read_text())
    out.unlink()
    result["wall_s"] = time.monotonic() - t0
    return result


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--out", type=Path, default=ROOT / "benchmarks/results/trainer_alone.json")
    p.add_argument("--model", type=Path, default=MODEL)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--steps", type=int, default=2, help="timed steps per variant")
    p.add_argument("--samples", type=int, help="samples a step (a multiple of 8; default 64, a quick look: 16)")
    p.add_argument("--variants", default=",".join(VARIANTS), help=f"comma-separated, of {', '.join(VARIANTS)}")
    p.add_argument("--profile", action="store_true", help="torch.profiler's top operators of one more step")
    p.add_argument("--asyncrl-src", type=Path, help="run the workers on this copy of the asyncrl package")
    p.add_argument("--label", default="", help="a free-form note stored with the result")
    p.add_argument("--timeout-s", type=float, default=3600.0, help="per variant")
    p.add_argument("--quiet-load", type=float, default=1.5,
                   help="before each variant, wait until the 1-minute load average is below this (other processes on "
                        "the cores slow every figure), at most --quiet-wait-s")
    p.add_argument("--quiet-wait-s", type=float, default=300.0)
    a = p.parse_args(argv)
    if a.worker:
        spec = json.loads(a.worker)
        a.out.write_text(json.dumps(worker(spec), indent=2) + "\n")
        return
    unknown = [v for v in a.variants.split(",") if v not in VARIANTS]
    if unknown:
        raise SystemExit(f"--variants: unknown {unknown}; expected some of {list(VARIANTS)}")
    sys.path.insert(0, str(ROOT / "benchmarks"))  # as the workers have it (PYTHONPATH)
    from real_parts.matmul_peak import _machine

    doc: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "machine": _machine(),
                           "cpus": os.cpu_count(), "threads": a.threads, "load_avg_start": os.getloadavg(),
                           "code": str(a.asyncrl_src) if a.asyncrl_src else "working tree", "label": a.label,
                           "model": str(a.model), "variants": []}
    for name in a.variants.split(","):
        waited = wait_quiet(a.quiet_load, a.quiet_wait_s)
        result = run_variant(name, VARIANTS[name], a)
        result |= {"waited_for_quiet_s": waited, "load_avg_at_start": os.getloadavg()[0]}
        doc["variants"].append(result)
        doc["load_avg_end"] = os.getloadavg()
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(doc, indent=2) + "\n")
    print(summary(doc))
    print(f"wrote {a.out}")


def wait_quiet(load: float, max_wait_s: float) -> float:
    """Wait until the 1-minute load average is below `load`, at most `max_wait_s`; the seconds waited."""
    t0 = time.monotonic()
    while os.getloadavg()[0] >= load and time.monotonic() - t0 < max_wait_s:
        time.sleep(10)
    return time.monotonic() - t0


def summary(doc: dict[str, Any]) -> str:
    lines = [f"trainer alone, {doc['machine']}, {doc['threads']} threads, {doc['date']} ({doc['code']})"]
    for v in doc["variants"]:
        if "error" in v:
            lines.append(f"  {v['name']}: {v['error']}")
            continue
        lines.append(f"  {v['name']}: {v['step_s']:.1f} s/step, {v['tokens_per_s']:.0f} tok/s "
                     f"({v['response_tokens_per_s']:.0f} response), 6NT {v['gflops_6nt']:.1f} GFLOP/s = "
                     f"{v['fraction_6nt']:.2f} of peak {v['peak_gflops']:.1f}; +attn {v['fraction_6nt_attention']:.2f}; "
                     f"executed {v['fraction_executed']:.2f}; per CPU s: 6NT {v['fraction_6nt_per_cpu_s']:.2f}, "
                     f"executed {v['fraction_executed_per_cpu_s']:.2f}; padding {v['padding_fraction']:.2f}; "
                     f"peak RSS {v['rss_peak_gb']:.1f} GB; others used {max(v['others_cpu_share']):.0%} of the CPUs")
    return "\n".join(lines)


# ---- the worker ------------------------------------------------------------------------------------------------

def make_groups(tok: Any, prompts: int, samples: int, seed: int = 0) -> list[Any]:
    """`prompts` groups of `samples` samples (see the module docstring)."""
    from asyncrl.rollout.workload import decode_budget
    from asyncrl.types import Group, Sample

    rng = random.Random(seed)
    text_ids = tok.encode(REASONING * 8, add_special_tokens=False)
    end = int(tok.convert_tokens_to_ids("<|im_end|>"))
    groups = []
    for g in range(prompts):
        problem = PROBLEMS[g % len(PROBLEMS)].format(a=rng.randint(12, 480), b=rng.randint(3, 95),
                                                     c=rng.randint(2, 40))
        messages = [{"role": "system", "content": SYSTEM}, {"role": "user", "content": problem}]
        prompt = list(tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                              return_dict=False))
        out = []
        for i in range(samples):
            n = decode_budget(seed * 10_000 + g * 100 + i, MEDIAN, SIGMA, MAX_NEW)
            start = rng.randrange(0, len(text_ids) - MAX_NEW)
            ids = text_ids[start : start + n]
            if n < MAX_NEW:
                ids = ids[:-1] + [end]
            behav = [-1.0 - 0.5 * rng.random() for _ in ids]
            out.append(Sample(f"g{g}", i, prompt, ids, behav, [0] * len(ids), 0, reward=float(rng.random() < 0.4)))
        groups.append(Group(f"g{g}", g, "bench", out))
    return groups


def flop_counts(model_cfg: Any, n_params: int, n_embed: int, lengths: list[int], computed: list[tuple[int, int]],
                head_positions: int) -> dict[str, float]:
    """FLOP of one step (see the module docstring): `lengths` of the rows; `computed` (rows, padded length) of each
    micro batch; `head_positions` the positions the LM head runs at."""
    layers, hidden = int(model_cfg.num_hidden_layers), int(model_cfg.hidden_size)
    heads_dim = int(model_cfg.num_attention_heads) * int(getattr(model_cfg, "head_dim", hidden //
                                                                 model_cfg.num_attention_heads))
    tokens = sum(lengths)
    attention = 6.0 * layers * heads_dim * sum(n * n for n in lengths) / 2.0
    computed_tokens = sum(r * t for r, t in computed)
    attention_padded = 6.0 * layers * heads_dim * sum(r * t * t for r, t in computed) / 2.0
    return {"flop_6nt": 6.0 * n_params * tokens, "flop_attention": attention,
            "flop_executed": 6.0 * (n_params - n_embed) * computed_tokens + 6.0 * n_embed * head_positions
            + attention_padded}


def _available_gb() -> float:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemAvailable:"):
            return int(line.split()[1]) / 2**20
    return float("inf")


def _machine_busy_s() -> float:
    """Busy CPU seconds of the whole machine so far (all processes; /proc/stat, in USER_HZ = 100 ticks)."""
    fields = Path("/proc/stat").read_text().splitlines()[0].split()[1:]
    user, nice, system, _idle, _iowait, irq, softirq, steal = (int(x) for x in fields[:8])
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def _rss_gb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 2**20
    return float("nan")


def worker(spec: dict[str, Any]) -> dict[str, Any]:
    import torch

    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.batch import build_batch
    from asyncrl.training.heap import keep_freed_memory
    from asyncrl.training.policy import PolicyTrainer
    from real_parts.matmul_peak import measure_matmul_peak

    threads, dtype = int(spec["threads"]), spec["dtype"]
    torch.set_num_threads(threads)
    keep_freed_memory()
    from transformers import AutoTokenizer

    model_path = Path(spec["model"])
    tok = AutoTokenizer.from_pretrained(str(model_path))
    samples = int(spec.get("samples", PROMPTS * SAMPLES))
    groups = make_groups(tok, max(1, samples // SAMPLES), min(SAMPLES, samples))
    batch = build_batch(groups, norm_std=True, pad_id=int(tok.pad_token_id))
    warm = build_batch(make_groups(tok, 1, SAMPLES, seed=1), norm_std=True, pad_id=int(tok.pad_token_id))
    peak_before = measure_matmul_peak(threads, dtypes=(dtype,))
    training = {"cpu_threads": threads, "matmul_dtype": dtype, "lr": 1e-6, **spec["training"]}
    cfg = TrainingConfig(**training)
    if cfg.mini_batches * cfg.epochs > 1:  # the plan and FLOP figures below are those of one update a step
        raise ValueError(f"{spec['name']}: training.mini_batches x training.epochs must be 1 here (one "
                         f"optimizer step a train_step), got {cfg.mini_batches} x {cfg.epochs}")
    t0 = time.monotonic()
    trainer = PolicyTrainer(model_path, cfg, batch_size=batch.num_samples)
    init_s = time.monotonic() - t0
    rss_init = _rss_gb()
    if spec.get("compile_layers"):
        for layer in trainer.engine.module.model.layers:
            layer.compile(dynamic=True)
    model = trainer.engine.module
    n_params = sum(p.numel() for p in model.parameters())
    n_embed = model.get_input_embeddings().weight.numel()
    steps, cpu, others, metrics, profile = [], [], [], {}, None
    try:
        if spec.get("warmup", True):
            t = time.perf_counter()
            trainer.train_step(warm, temperature=1.0)
            print(f"warm-up step (8 samples): {time.perf_counter() - t:.1f} s", flush=True)
        for k in range(int(spec["steps"])):
            t, c, busy = time.perf_counter(), time.process_time(), _machine_busy_s()
            metrics = trainer.train_step(batch, temperature=1.0)
            steps.append(time.perf_counter() - t)
            cpu.append(time.process_time() - c)
            others.append(max(0.0, _machine_busy_s() - busy - cpu[-1]) / (steps[-1] * (os.cpu_count() or 1)))
            print(f"step {k + 1}: {steps[-1]:.1f} s, {cpu[-1]:.1f} CPU s; other processes used {others[-1]:.0%} of "
                  "the machine", flush=True)
        if spec.get("profile"):
            profile = _profile(trainer, batch)
    finally:
        trainer.close()
    peak_after = measure_matmul_peak(threads, dtypes=(dtype,))
    peak = max(peak_before[f"{dtype}_gflops"], peak_after[f"{dtype}_gflops"])
    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    plan = _plan(batch, cfg)
    computed = [(len(mb), max(lengths[i] for i in mb)) for mb in plan]
    trained_only = "computed_tokens" in metrics  # the working tree's trainer runs the LM head at trained tokens only
    head_positions = batch.num_tokens if trained_only else sum(r * (t - 1) for r, t in computed)
    flops = flop_counts(model.config, n_params, n_embed, lengths, computed, head_positions)
    step_s = sum(steps) / len(steps)
    tokens, response = sum(lengths), batch.num_tokens
    result = {
        "name": spec["name"], "dtype": dtype, "threads": threads, "training": training, "samples": batch.num_samples,
        "prompt_tokens": [int(x) for x in batch.prompt_lengths.tolist()][::SAMPLES],
        "response_tokens_mean": response / batch.num_samples, "response_tokens_max": int(batch.response_lengths.max()),
        "truncated_samples": int((batch.response_lengths >= MAX_NEW).sum()),
        "tokens": tokens, "response_tokens": response, "computed_tokens": sum(r * t for r, t in computed),
        "padding_fraction": 1 - tokens / sum(r * t for r, t in computed), "micro_batches": len(plan),
        "lm_head_positions": head_positions, "n_params": n_params, "n_embedding": n_embed,
        "init_s": init_s, "steps_s": steps, "step_s": step_s, "step_s_min": min(steps), "steps_cpu_s": cpu,
        "others_cpu_share": others,
        "tokens_per_s": tokens / step_s, "response_tokens_per_s": response / step_s,
        "peak_gflops": peak, "peak_before": peak_before, "peak_after": peak_after,
        "rss_after_init_gb": rss_init, "rss_end_gb": _rss_gb(),
        "rss_peak_gb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
        "train_metrics": {k: v for k, v in metrics.items() if isinstance(v, float)},
    }
    cpu_step_s = sum(cpu) / len(cpu) / threads  # the step's CPU seconds per thread
    peak_cpu = max(x for x in (peak_before.get(f"{dtype}_gflops_per_cpu_s"), peak_after.get(f"{dtype}_gflops_per_cpu_s"),
                               0.0) if x is not None)
    result["peak_gflops_per_cpu_s"] = peak_cpu
    for key, flop in (("6nt", flops["flop_6nt"]), ("6nt_attention", flops["flop_6nt"] + flops["flop_attention"]),
                      ("executed", flops["flop_executed"])):
        result[f"gflops_{key}"] = flop / step_s / 1e9
        result[f"fraction_{key}"] = result[f"gflops_{key}"] / peak
        # the same per CPU second of the step's threads against the peak's: robust to other processes on the machine
        result[f"fraction_{key}_per_cpu_s"] = flop / cpu_step_s / 1e9 / peak_cpu if peak_cpu else None
    result["flop"] = flops
    if profile is not None:
        result["profile"] = profile
    return result


def _plan(batch: Any, cfg: Any) -> list[list[int]]:
    """The micro batches the step ran (row indices); by count where the package has no token budget."""
    lengths = (batch.prompt_lengths + batch.response_lengths).tolist()
    tokens = getattr(cfg, "micro_batch_tokens", None)
    if tokens is None:
        size = cfg.micro_batch_size
        return [list(range(k, min(k + size, len(lengths)))) for k in range(0, len(lengths), size)]
    from asyncrl.training.micro_batches import pack_by_tokens

    return pack_by_tokens(lengths, tokens, cfg.micro_batch_size)


def _profile(trainer: Any, batch: Any) -> list[str]:
    """torch.profiler's 30 operators of most self CPU time in one more step, as table lines."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        trainer.train_step(batch, temperature=1.0)
    table = prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=30, max_name_column_width=60)
    print(table, flush=True)
    return table.splitlines()


if __name__ == "__main__":
    main()
