"""The check of an imported model folder: Hugging Face and vLLM decode it the same way.

`check_folder(folder, dtype)` renders PROMPTS through the folder's chat template (asyncrl's `load_tokenizer`; raw
text after the bos token when there is no template), decodes each greedily for up to NEW_TOKENS tokens with
transformers' `generate` (in this process) and with vLLM through asyncrl's own engine wrapper
(`asyncrl.generation.engine.GenerationEngine`, in a child process: `python -m asyncrl.models.import_check JOB OUT`),
both stopping at the folder's end ids (generation_config.json), and compares (`compare`):
- the token ids must be identical, prompt by prompt;
- the log-prob of each generated token must agree within TOLERANCE[dtype] (absolute, nats): HF's from the raw
  logits of `generate` (log-softmax in float32), vLLM's the ones it returns with each token.

TOLERANCE, from measurements on this machine (CPU, vLLM's CPU build, 4 prompts, 51 tokens compared,
SmolLM2-135M-Instruct imported from its Q4_1 GGUF): float32 max |diff| 2.6e-5 nats, mean 4.3e-6 (tolerance 1e-3:
about forty times what float32 rounding gives, so only a real difference in weights or computation exceeds it);
bfloat16 max 0.17 nats, mean 0.027, identical tokens (tolerance 0.5: bf16 keeps 8 bits of mantissa and the two
stacks round in different places; the token comparison is what catches a broken bf16 import).

The result (a JSON-ready dict, recorded in import.json by `asyncrl.models.gguf_import`) holds `passed`, the figures
above, the mismatches, HF's decoded answers and the seconds each side took; a vLLM that fails to start or to answer
gives `passed: false` with the error and the tail of its log, never an exception.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

PROMPTS = ("What is 17 + 25?", "Name the largest planet in the solar system.",
           "Write one word that rhymes with cat.", "Say hello in French.")
NEW_TOKENS = 16
TOLERANCE = {"float32": 1e-3, "bfloat16": 0.5}
VLLM_TIMEOUT_S = 600.0
LOG_TAIL_CHARS = 3000


def compare(hf: Sequence[dict[str, list[Any]]], vllm: Sequence[dict[str, list[Any]]],
            tolerance: float) -> dict[str, Any]:
    """Pure: HF's and vLLM's greedy outputs ({"tokens": [...], "logprobs": [...]} per prompt) side by side.

    Log-probs are compared where both sides generated the same token at the same position, up to the first
    position where they differ (after that the contexts differ). `passed`: every prompt's tokens identical and
    every compared log-prob within `tolerance`."""
    if len(hf) != len(vllm):
        raise ValueError(f"compare: {len(hf)} HF outputs against {len(vllm)} vLLM outputs")
    diffs: list[float] = []
    mismatches: list[dict[str, Any]] = []
    for i, (a, b) in enumerate(zip(hf, vllm, strict=True)):
        ta, tb = list(a["tokens"]), list(b["tokens"])
        same = 0
        while same < min(len(ta), len(tb)) and ta[same] == tb[same]:
            same += 1
        if ta != tb:
            mismatches.append({"prompt": i, "position": same, "hf": ta[same] if same < len(ta) else None,
                               "vllm": tb[same] if same < len(tb) else None})
        diffs.extend(abs(float(x) - float(y)) for x, y in zip(a["logprobs"][:same], b["logprobs"][:same], strict=True))
    worst = max(diffs, default=0.0)
    return {
        "passed": not mismatches and worst <= tolerance,
        "prompts": len(hf),
        "tokens_compared": len(diffs),
        "tokens_equal": not mismatches,
        "mismatches": mismatches,
        "max_abs_logprob_diff": worst,
        "mean_abs_logprob_diff": sum(diffs) / len(diffs) if diffs else 0.0,
        "tolerance": tolerance,
    }


def prompt_ids(folder: Path, prompts: Sequence[str] = PROMPTS) -> tuple[list[list[int]], str]:
    """The prompts as token ids the way asyncrl renders them for this folder, and how ("chat template" or "raw")."""
    from asyncrl.models.tokenizer import chat_ids, load_tokenizer

    tok = load_tokenizer(folder)
    if getattr(tok, "chat_template", None):
        return [chat_ids(tok, [{"role": "user", "content": p}], add_generation_prompt=True) for p in prompts], \
            "chat template"
    bos = [int(tok.bos_token_id)] if tok.bos_token_id is not None else []
    return [bos + list(tok(p, add_special_tokens=False)["input_ids"]) for p in prompts], "raw"


def end_ids(folder: Path) -> list[int]:
    """The folder's end ids: generation_config.json's eos_token_id (an id or a list), else config.json's."""
    for name in ("generation_config.json", "config.json"):
        path = folder / name
        if path.is_file():
            eos = json.loads(path.read_text(encoding="utf-8")).get("eos_token_id")
            if eos is not None:
                return [int(e) for e in (eos if isinstance(eos, list) else [eos])]
    return []


def hf_greedy(folder: Path, dtype: str, prompts: list[list[int]], new_tokens: int,
              eos: list[int]) -> list[dict[str, list[Any]]]:
    """transformers' greedy `generate`, one prompt at a time; each generated token with its log-prob."""
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=getattr(torch, dtype))
    model.eval()
    out = []
    with torch.no_grad():
        for ids in prompts:
            x = torch.tensor([ids])
            gen = model.generate(x, attention_mask=torch.ones_like(x), max_new_tokens=new_tokens, do_sample=False,
                                 eos_token_id=eos or None, pad_token_id=eos[0] if eos else None, output_logits=True,
                                 return_dict_in_generate=True)
            tokens = [int(t) for t in gen.sequences[0, len(ids):]]
            logprobs = [float(torch.log_softmax(step[0].float(), dim=-1)[t]) for step, t in zip(gen.logits, tokens,
                                                                                                   strict=True)]
            out.append({"tokens": tokens, "logprobs": logprobs})
    return out


def vllm_greedy(folder: Path, dtype: str, prompts: list[list[int]], new_tokens: int, eos: list[int],
                timeout_s: float = VLLM_TIMEOUT_S) -> list[dict[str, list[Any]]]:
    """vLLM's greedy decode of `prompts` in a child process (see the module docstring); RuntimeError with the tail of
    its log when it fails."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-import-check-") as tmp:
        job, out, log = Path(tmp) / "job.json", Path(tmp) / "out.json", Path(tmp) / "vllm.log"
        max_len = max(len(p) for p in prompts) + new_tokens
        job.write_text(json.dumps({"folder": str(folder), "dtype": dtype, "prompts": prompts, "new_tokens": new_tokens,
                                   "stop_token_ids": eos, "max_model_len": max(64, -(-max_len // 64) * 64),
                                   "work_dir": str(Path(tmp) / "vllm")}))
        with log.open("wb") as f:
            try:
                rc = subprocess.run([sys.executable, "-m", "asyncrl.models.import_check", str(job), str(out)],
                                    stdout=f, stderr=subprocess.STDOUT, timeout=timeout_s, check=False).returncode
            except subprocess.TimeoutExpired:
                rc = None
        if rc != 0 or not out.is_file():
            tail = log.read_text(errors="replace")[-LOG_TAIL_CHARS:]
            what = f"did not finish within {timeout_s:g} s" if rc is None else f"exited with {rc}"
            raise RuntimeError(f"vLLM on {folder} {what}; the end of its log:\n{tail}")
        return list(json.loads(out.read_text())["outputs"])


def check_folder(folder: Path, dtype: str, progress: Callable[[str], None] = lambda _: None,
                 prompts: Sequence[str] = PROMPTS, new_tokens: int = NEW_TOKENS) -> dict[str, Any]:
    """HF against vLLM on `folder` (see the module docstring); the result dict, `passed` in it."""
    from asyncrl.models.tokenizer import decode_response, load_tokenizer

    ids, rendering = prompt_ids(folder, prompts)
    eos = end_ids(folder)
    progress(f"check: {len(ids)} prompts ({rendering}), {new_tokens} new tokens, greedy, HF generate")
    t0 = time.monotonic()
    hf = hf_greedy(folder, dtype, ids, new_tokens, eos)
    hf_s = time.monotonic() - t0
    progress(f"check: vLLM (asyncrl's engine wrapper, {dtype}) in a child process")
    t0 = time.monotonic()
    result: dict[str, Any] = {"dtype": dtype, "rendering": rendering, "new_tokens": new_tokens}
    try:
        vllm = vllm_greedy(folder, dtype, ids, new_tokens, eos)
    except RuntimeError as err:
        return {**result, "passed": False, "error": str(err), "prompts": len(ids)}
    result.update(compare(hf, vllm, TOLERANCE[dtype]))
    tok = load_tokenizer(folder)
    result["answers"] = [{"prompt": p, "hf": decode_response(tok, h["tokens"])}
                         for p, h in zip(prompts, hf, strict=True)]
    result["seconds"] = {"hf": round(hf_s, 1), "vllm": round(time.monotonic() - t0, 1)}
    return result


def _vllm_main(job_path: str, out_path: str) -> None:
    """The child process: start the engine, decode every prompt concurrently, write {"outputs": [...]}, stop."""
    import asyncio

    from asyncrl.generation.engine import EngineSettings, GenerateParams, GenerationEngine

    job = json.loads(Path(job_path).read_text())

    async def main() -> list[dict[str, Any]]:
        settings = EngineSettings(model=job["folder"], max_model_len=int(job["max_model_len"]), dtype=job["dtype"],
                                  max_num_seqs=max(1, len(job["prompts"])), cpu_threads=min(4, os.cpu_count() or 1),
                                  work_dir=job["work_dir"])
        engine = await GenerationEngine.start(settings)
        try:
            outs = await asyncio.gather(*(engine.generate(GenerateParams(
                request_id=f"import-check-{i}", prompt_token_ids=list(p), max_tokens=int(job["new_tokens"]),
                temperature=0.0, stop_token_ids=list(job["stop_token_ids"]))) for i, p in enumerate(job["prompts"])))
        finally:
            engine.shutdown()
        return [{"tokens": o["token_ids"], "logprobs": o["logprobs"]} for o in outs]

    outputs = asyncio.run(main())
    Path(out_path).write_text(json.dumps({"outputs": outputs}))


if __name__ == "__main__":
    _vllm_main(sys.argv[1], sys.argv[2])
