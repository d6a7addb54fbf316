"""Raw engine: `vllm.LLM` in-process on the job's model, prompts and sampling, with the generation role's settings.

One batch = one training step's samples: `prompts_per_step` prompts of the train split (the order of environment
writer env0's prompt stream, encoded as the environment role encodes them) × `samples_per_prompt`, each with the
environment role's per-sample seed and decode budget (`single_turn.sample_budget`: the length-tail budgets with
`ignore_eos`, else `max_new_tokens` stopping at EOS) and log-probs. Engine settings are those of
`GenerationEngine.start` (checked against its source: `engine_args_drift`). One warm-up batch, then `batches` timed.
Writes the first timed batch (prompt and response ids, log-probs, rewards) for the train-step part.
"""

from __future__ import annotations

import ast
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import ROOT, cpu_seconds, part_args, write_result


def engine_settings(cfg: Any, model: str) -> Any:
    """The `EngineSettings` the generation role builds for this config's generation server 0."""
    from asyncrl.generation.engine import EngineSettings

    g = cfg.generation
    return EngineSettings(model=model, max_model_len=g.max_model_len, kv_cache_gib=g.kv_cache_gib,
                          max_num_seqs=g.max_num_seqs, seed=g.seed, dtype=g.dtype, cpu_threads=g.cpu_threads,
                          ring_poll_s=g.ring_poll_s)


def engine_kwargs(cfg: Any, model: str) -> dict[str, Any]:
    """The keyword arguments `GenerationEngine.start` gives vLLM for this config's generation server 0."""
    from vllm.config import WeightTransferConfig

    from asyncrl.generation.engine import WORKER_EXTENSION

    s = engine_settings(cfg, model)
    return dict(model=s.model, skip_tokenizer_init=True, dtype=s.dtype, max_model_len=s.max_model_len,
                max_num_seqs=s.max_num_seqs, kv_cache_memory_bytes=int(s.kv_cache_gib * (1 << 30)), seed=s.seed,
                enforce_eager=s.enforce_eager, logprobs_mode="processed_logprobs", worker_extension_cls=WORKER_EXTENSION,
                weight_transfer_config=WeightTransferConfig(backend="asyncrl"), enable_prefix_caching=True,
                enable_chunked_prefill=False, max_num_batched_tokens=max(s.max_model_len, 2048),
                disable_log_stats=True)


def engine_args_drift(ours: set[str]) -> list[str]:
    """Keyword names that differ between ours and the `AsyncEngineArgs(...)` call of asyncrl/generation/engine.py."""
    tree = ast.parse((ROOT / "asyncrl/generation/engine.py").read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and getattr(node.func, "id", None) == "AsyncEngineArgs":
            theirs = {k.arg for k in node.keywords if k.arg}
            return sorted(ours ^ theirs)
    return ["AsyncEngineArgs call not found in engine.py"]


def make_batches(cfg: Any, tok: Any, count: int) -> list[list[dict[str, Any]]]:
    """`count` batches of one step's requests, as environment writer env0 would send them (first turn)."""
    from asyncrl.models.tokenizer import encode_prompt
    from asyncrl.roles.context import instance_index
    from asyncrl.roles.rollout_driver import sample_seed
    from asyncrl.roles.single_turn import prompt_stream, sample_budget
    from asyncrl.tasks.datasets import load_split
    from asyncrl.tasks.materialised import prepare
    from asyncrl.tasks.prompt_fit import prompts_that_fit

    prepare(cfg)  # a reasoning_gym or file task: its rows made here, as `asyncrl run` makes them
    ro = cfg.rollout
    problems, _ = prompts_that_fit(cfg, tok, load_split(cfg.task, "train"))
    stream = prompt_stream(len(problems), cfg.task.seed + 7919 * instance_index("env0"))
    batches = []
    for b in range(count):
        batch = []
        for j in range(ro.prompts_per_step):
            seq = b * ro.prompts_per_step + j
            problem = problems[next(stream)]
            ids = encode_prompt(tok, problem.prompt)
            for i in range(ro.samples_per_prompt):
                batch.append({"seq": seq, "index": i, "prompt": problem.prompt, "answer": problem.answer,
                              "prompt_ids": ids, "budget": sample_budget(cfg, seq, i),
                              "seed": sample_seed(cfg.generation.seed, seq, i, ro.samples_per_prompt)})
        batches.append(batch)
    return batches


def cpu_of_tree() -> float:
    """User + system CPU seconds of this process and its live descendants (the engine core)."""
    import psutil

    me = psutil.Process()
    return cpu_seconds([me, *me.children(recursive=True)])


def main() -> None:
    spec, out = part_args()
    from asyncrl.config import load_config
    from asyncrl.generation.engine import engine_process_env
    from asyncrl.generation.vllm_plugin import POLL_ENV

    cfg = load_config(spec["config"], spec["overrides"])
    ro = cfg.rollout
    work = Path(tempfile.mkdtemp(prefix="asyncrl-eff-"))  # short: vLLM's IPC socket paths are length-limited
    os.environ.setdefault("VLLM_RPC_BASE_PATH", str(work / "rpc"))
    os.environ.setdefault("VLLM_CACHE_ROOT", str(work / "vllm-cache"))
    os.makedirs(os.environ["VLLM_RPC_BASE_PATH"], exist_ok=True)
    os.environ.update(engine_process_env(engine_settings(cfg, "unused")))  # as GenerationEngine.start

    from asyncrl.models.tokenizer import decode_response, load_tokenizer
    from asyncrl.rewards.verifier import score
    from asyncrl.tiny_model.prepare import resolve_model_path

    model = str(resolve_model_path(cfg))
    tok = load_tokenizer(model)
    eos = int(tok.eos_token_id)
    n_batches = int(spec.get("batches", 3))
    batches = make_batches(cfg, tok, 1 + n_batches)

    from vllm import LLM, SamplingParams

    import asyncrl.generation.worker_extension  # noqa: F401  (registers the "asyncrl" weight-transfer backend)

    kwargs = engine_kwargs(cfg, model)
    t0 = time.monotonic()
    llm = LLM(**kwargs)
    start_s = time.monotonic() - t0
    tail = ro.length_tail is not None

    client_cpu = [0.0]  # this process's CPU inside llm.generate: vLLM's own client side (inputs, outputs, logprobs)

    def run(batch: list[dict[str, Any]]) -> tuple[float, list[Any]]:
        params = [SamplingParams(n=1, max_tokens=r["budget"], temperature=ro.temperature, top_p=ro.top_p,
                                 seed=r["seed"], stop_token_ids=[] if tail else [eos], ignore_eos=tail, logprobs=0,
                                 detokenize=False, skip_clone=True) for r in batch]
        prompts = [{"prompt_token_ids": r["prompt_ids"]} for r in batch]
        t, c = time.perf_counter(), time.process_time()
        outs = llm.generate(prompts, params, use_tqdm=False)
        client_cpu[0] += time.process_time() - c
        return time.perf_counter() - t, outs

    warm_s, _ = run(batches[0])
    print(f"raw engine: started in {start_s:.1f} s, warm-up batch {warm_s:.2f} s", flush=True)
    rows, dump = [], []
    cpu0 = cpu_of_tree()
    client_cpu[0] = 0.0
    for k, batch in enumerate(batches[1:]):
        wall, outs = run(batch)
        tokens = sum(len(o.outputs[0].token_ids) for o in outs)
        rows.append({"wall_s": wall, "samples": len(batch), "tokens": tokens,
                     "prompt_tokens": sum(len(r["prompt_ids"]) for r in batch)})
        print(f"raw engine: batch {k + 1}/{n_batches}: {wall:.2f} s, {len(batch) / wall:.1f} samples/s, "
              f"{tokens / wall:.0f} tokens/s", flush=True)
        if k == 0:
            for r, o in zip(batch, outs, strict=True):
                c = o.outputs[0]
                ids = list(c.token_ids)
                lps = [float(lp[t].logprob) for t, lp in zip(ids, c.logprobs or [], strict=True)]
                reward, _ = score(cfg.task.name, decode_response(tok, ids), r["answer"])
                dump.append({"seq": r["seq"], "index": r["index"], "prompt_ids": r["prompt_ids"], "token_ids": ids,
                             "logprobs": lps, "reward": reward, "finish_reason": c.finish_reason})
    cpu_s = cpu_of_tree() - cpu0
    wall = sum(r["wall_s"] for r in rows)
    samples = sum(r["samples"] for r in rows)
    tokens = sum(r["tokens"] for r in rows)
    result = {
        "engine_kwargs": {k: (v if isinstance(v, int | float | str | bool) else repr(v)) for k, v in kwargs.items()},
        "engine_args_drift": engine_args_drift(set(kwargs)),
        "omp_num_threads": os.environ.get("OMP_NUM_THREADS"), "omp_bind": os.environ.get("VLLM_CPU_OMP_THREADS_BIND"),
        "ring_poll_s": os.environ.get(POLL_ENV),
        "engine_start_s": start_s, "warmup_batch_s": warm_s, "batches": rows,
        "batch_s": wall / len(rows), "batch_s_min": min(r["wall_s"] for r in rows),
        "samples_per_s": samples / wall, "tokens_per_s": tokens / wall,
        "mean_response_tokens": tokens / samples, "mean_prompt_tokens": sum(r["prompt_tokens"] for r in rows) / samples,
        "cpu_s_per_sample": cpu_s / samples, "cpu_share": cpu_s / wall,
        # the engine's own client work (input processing, output and logprob processing) outside its core process:
        # the part of a generation server front end's CPU that any front end of this engine pays
        "client_cpu_s_per_sample": client_cpu[0] / samples,
        "reward_mean_first_batch": sum(d["reward"] for d in dump) / max(1, len(dump)),
    }
    if spec.get("batch_out"):
        import json

        Path(spec["batch_out"]).write_text(json.dumps(dump))
    write_result(out, result)


if __name__ == "__main__":
    main()
