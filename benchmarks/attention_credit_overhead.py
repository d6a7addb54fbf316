"""Overhead of attention-guided credit: training step time with and without it, side by side, same batches.

For each shape, two DeepSpeed actors (`PolicyTrainer`) with the same weights train on the same batch: one plain,
one with `training.attention_credit` (coupled scaling, 5 layers of the middle third, banded capture in the actor's
own forward). Steps alternate between the two; the figure is the median step time of each and the overhead share
`(t_credit − t_plain) / t_credit`. Shapes:
- `task`: the built-in model (2 layers, hidden 128) on the stability study's batch: 128 samples of 7 prompt +
  6 response tokens;
- `long-256`: the built-in model, 8 samples of 256 tokens (its longest);
- `wide-1k`: a wider random Qwen2 (8 layers, hidden 512, 8 heads of 64, vocab 4096), 2 samples of 1,024 tokens,
  closer to the regime where the method reports 2–3%.

    .venv/bin/python benchmarks/attention_credit_overhead.py        # a few minutes on 2 cores
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM

from asyncrl.config.schema import AttentionCreditConfig, RunConfig, TrainingConfig
from asyncrl.tiny_model.prepare import resolve_model_path
from asyncrl.training.batch import build_batch
from asyncrl.training.policy import PolicyTrainer
from asyncrl.types import Group, Sample

ROOT = Path(__file__).resolve().parents[1]


def wide_model(folder: Path) -> Path:
    cfg = Qwen2Config(hidden_size=512, num_attention_heads=8, num_key_value_heads=8, head_dim=64, num_hidden_layers=8,
                      intermediate_size=1536, vocab_size=4096, max_position_embeddings=2048, tie_word_embeddings=True)
    torch.manual_seed(0)
    Qwen2ForCausalLM(cfg).to(torch.float32).save_pretrained(folder, safe_serialization=True)
    return folder


def random_groups(n_samples: int, prompt_len: int, response_len: int, vocab: int, seed: int = 0) -> list[Group]:
    g = torch.Generator().manual_seed(seed)
    groups = []
    for gi in range(max(1, n_samples // 8)):
        size = min(8, n_samples)
        prompt = torch.randint(1, vocab, (prompt_len,), generator=g).tolist()
        samples = []
        for i in range(size):
            tokens = torch.randint(1, vocab, (response_len,), generator=g).tolist()
            samples.append(Sample(f"g{gi}", i, prompt, tokens, [-2.0] * response_len, [0] * response_len, 0,
                                  reward=float(i % 2)))
        groups.append(Group(f"g{gi}", 0, "bench", samples))
    return groups


def measure(model_path: Path, groups: list[Group], micro: int, steps: int, credit: AttentionCreditConfig) -> dict:
    n = sum(len(g.samples) for g in groups)
    plain_cfg = TrainingConfig(micro_batch_size=micro, lr=1e-6)
    credit_cfg = TrainingConfig(micro_batch_size=micro, lr=1e-6, attention_credit=credit)
    plain = PolicyTrainer(model_path, plain_cfg, batch_size=n)
    with_credit = PolicyTrainer(model_path, credit_cfg, batch_size=n)
    times: dict[str, list[float]] = {"plain": [], "credit": []}
    try:
        for i in range(steps + 1):  # the first step of each is a warm-up, not counted
            for name, trainer in (("plain", plain), ("credit", with_credit)):
                batch = build_batch(groups, norm_std=True, pad_id=0)
                t0 = time.perf_counter()
                trainer.train_step(batch)
                if i:
                    times[name].append(time.perf_counter() - t0)
    finally:
        with_credit.close()
        plain.close()
    t_plain, t_credit = statistics.median(times["plain"]), statistics.median(times["credit"])
    return {"samples": n, "tokens_per_sample": len(groups[0].samples[0].prompt_token_ids) + len(groups[0].samples[0].token_ids),
            "step_s_plain": t_plain, "step_s_credit": t_credit, "overhead_share": (t_credit - t_plain) / t_credit,
            "steps_timed": steps}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--only", action="append", default=[])
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/attention_credit_overhead.json"))
    args = p.parse_args()
    torch.set_num_threads(TrainingConfig().cpu_threads or (os.cpu_count() or 1))  # as the training role does
    builtin = resolve_model_path(RunConfig())
    task_credit = AttentionCreditConfig(scaling="coupled", window=4, fai_h_lo=1, fai_h_hi=8)
    default_credit = AttentionCreditConfig(scaling="coupled")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        shapes = [
            ("task", lambda: builtin, random_groups(128, 7, 6, 20), 128, task_credit),
            ("long-256", lambda: builtin, random_groups(8, 16, 240, 20), 8, default_credit),
            ("wide-1k", lambda: wide_model(Path(tmp) / "wide"), random_groups(2, 24, 1000, 4096), 2, default_credit),
        ]
        for name, model, groups, micro, credit in shapes:
            if args.only and name not in args.only:
                continue
            r = {"shape": name, **measure(model(), groups, micro, args.steps, credit)}
            rows.append(r)
            print(f"{name:<10} {r['samples']:>4} x {r['tokens_per_sample']:>5} tokens   plain {r['step_s_plain']:.3f} s   "
                  f"credit {r['step_s_credit']:.3f} s   overhead {100 * r['overhead_share']:.1f}% of step time", flush=True)
    out = {"benchmark": "attention_credit_overhead", "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
           "rows": rows}
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    Path(args.out).write_text(json.dumps(out, indent=2) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
