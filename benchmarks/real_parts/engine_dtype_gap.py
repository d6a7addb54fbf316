"""The engine-trainer log-prob gap by engine dtype: how far the engine's behaviour log-probs (`behav`) are from the
trainer's float32 recomputation (`prox`) of the same tokens under the same weights (no staleness at all).

For each engine dtype (float32, bfloat16) asyncrl's engine wrapper (`asyncrl.generation.engine.GenerationEngine`,
in this process, one engine after the other) samples `--max-tokens` tokens at temperature 1 for each of `--prompts`
chat-formatted prompts (`real_parts.engine_alone.chat_prompts`); the model folder's weights are then run in float32
by Hugging Face transformers (the trainer's model code, as the trainer's float32 master weights would be) over
prompt + response, and each sampled token's log-prob is compared with the engine's. Reported per dtype, over every
sampled token (docs/algorithms.md §7): `gap_abs` = mean |prox - behav|, `gap_k3` = mean (exp(d) - 1 - d) with
d = prox - behav, the largest |d|, and the engine's tokens/s (a bf16 engine on a CPU without bf16 instructions is
slow: vLLM falls back to PyTorch's generic bf16 product).

Run: `python benchmarks/real_parts/engine_dtype_gap.py --model DIR --out benchmarks/results/real_engine_dtype_gap.json`.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[1]
ROOT = BENCH.parent
DEFAULT_MODEL = str(ROOT / ".cache/asyncrl/models/smollm2-135m-instruct")  # make import-smollm2


async def sample(model: str, dtype: str, prompts: list[list[int]], max_tokens: int, threads: int) -> dict[str, Any]:
    """Sampled tokens and the engine's log-probs for every prompt (temperature 1, a seed per prompt)."""
    from asyncrl.generation.engine import EngineSettings, GenerateParams, GenerationEngine
    from asyncrl.generation.kv_budget import gib_for

    cfg = json.loads((Path(model) / "config.json").read_text())
    max_len = (max(len(p) for p in prompts) + max_tokens + 15) // 16 * 16
    settings = EngineSettings(model=model, max_model_len=max_len, max_num_seqs=len(prompts), dtype=dtype,
                              kv_cache_gib=1.05 * gib_for(cfg, dtype, len(prompts), max_len), cpu_threads=threads,
                              work_dir=tempfile.mkdtemp(prefix="asyncrl-gap-"))
    engine = await GenerationEngine.start(settings)
    try:
        t0 = time.perf_counter()
        outs = await asyncio.gather(*[engine.generate(GenerateParams(
            request_id=f"{dtype}-{i}", prompt_token_ids=p, max_tokens=max_tokens, temperature=1.0, seed=100 + i,
            ignore_eos=True)) for i, p in enumerate(prompts)])
        wall = time.perf_counter() - t0
    finally:
        engine.shutdown()
    return {"tokens": [o["token_ids"] for o in outs], "logprobs": [o["logprobs"] for o in outs], "wall_s": wall}


def float32_logprobs(model: str, prompts: list[list[int]], responses: list[list[int]]) -> list[list[float]]:
    """The trainer's view: log-probs of each response token under the folder's weights in float32 (HF)."""
    import torch
    from transformers import AutoModelForCausalLM

    hf = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float32)
    hf.eval()
    out = []
    with torch.no_grad():
        for p, r in zip(prompts, responses, strict=True):
            logits = hf(torch.tensor([p + r])).logits[0].double()
            lp = torch.log_softmax(logits, dim=-1)
            out.append([float(lp[len(p) - 1 + i, t]) for i, t in enumerate(r)])
    return out


def gap(prox: list[list[float]], behav: list[list[float]]) -> dict[str, float]:
    """docs/algorithms.md §7's gap_abs and gap_k3 over every token, and the largest |prox - behav|."""
    d = [a - b for pa, pb in zip(prox, behav, strict=True) for a, b in zip(pa, pb, strict=True)]
    return {"tokens": len(d), "gap_abs": sum(abs(x) for x in d) / len(d),
            "gap_k3": sum(math.exp(x) - 1 - x for x in d) / len(d), "max_abs": max(abs(x) for x in d)}


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtypes", default="float32,bfloat16")
    p.add_argument("--prompts", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    sys.path[:0] = [str(BENCH), str(ROOT)]
    from real_parts.engine_alone import chat_prompts

    prompts = chat_prompts(a.model, a.prompts, seed=7)
    result: dict[str, Any] = {"date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "model": a.model,
                              "prompts": a.prompts, "max_tokens": a.max_tokens, "threads": a.threads, "dtypes": {}}
    for dtype in [d for d in a.dtypes.split(",") if d]:
        s = asyncio.run(sample(a.model, dtype, prompts, a.max_tokens, a.threads))
        g = gap(float32_logprobs(a.model, prompts, s["tokens"]), s["logprobs"])
        g["engine_tokens_per_s"] = sum(len(t) for t in s["tokens"]) / s["wall_s"]
        result["dtypes"][dtype] = g
        print(f"{dtype}: {g['tokens']} tokens, mean |prox - behav| {g['gap_abs']:.5f}, k3 {g['gap_k3']:.6f}, "
              f"max {g['max_abs']:.4f}; engine {g['engine_tokens_per_s']:.1f} tok/s", flush=True)
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
