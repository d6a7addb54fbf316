"""Training alone: `Learner.train_step` on one step's batch, by itself, with the training role's settings.

The batch is built as the training role builds it (`build_batch` of the step's groups, norm_std and pad id of the
run) from the raw-engine part's first timed batch (real prompts, responses, log-probs and rewards; with a length
tail the loss mask to the first EOS, as the environment role sets it). Without that file: synthetic responses of the
job's decode budgets. torch threads = `training.cpu_threads`, the heap setting of `asyncrl.training.heap`, DeepSpeed
config of the run (`Learner`). One warm-up step, then `repeats` timed steps; each timed figure is build_batch +
train_step (what the run's `time/train_s` holds).
"""

from __future__ import annotations

import json
import random
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import part_args, write_result


def groups_from_dump(cfg: Any, rows: list[dict[str, Any]], eos: int) -> list[Any]:
    from asyncrl.rollout.workload import loss_mask_to_first_eos
    from asyncrl.types import Group, Sample

    by_seq: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_seq.setdefault(r["seq"], []).append(r)
    tail = cfg.rollout.length_tail is not None
    groups = []
    for seq, rs in sorted(by_seq.items()):
        gid = f"bench-{seq}"
        samples = [Sample(gid, r["index"], r["prompt_ids"], r["token_ids"], r["logprobs"], [0] * len(r["token_ids"]), 0,
                          reward=r["reward"], finish_reason=r["finish_reason"],
                          loss_mask=loss_mask_to_first_eos(r["token_ids"], eos) if tail else None) for r in rs]
        groups.append(Group(gid, seq, cfg.task.name, samples))
    return groups


def synthetic_groups(cfg: Any, eos: int) -> list[Any]:
    """Responses of the job's decode budgets (max_new_tokens, or the length-tail draws), random tokens, EOS last."""
    from asyncrl.rollout.workload import decode_budget
    from asyncrl.types import Group, Sample

    ro, rng = cfg.rollout, random.Random(0)
    groups = []
    for seq in range(ro.prompts_per_step):
        gid = f"bench-{seq}"
        samples = []
        for i in range(ro.samples_per_prompt):
            n = ro.max_new_tokens if ro.length_tail is None else decode_budget(
                seq * 1000 + i, ro.length_tail.median_tokens, ro.length_tail.sigma, ro.max_new_tokens)
            ids = [rng.randrange(4, 19) for _ in range(n - 1)] + [eos]
            samples.append(Sample(gid, i, [1, 5, 6, 17, 7, 8, 18], ids, [-1.0] * n, [0] * n, 0, reward=float(i % 2)))
        groups.append(Group(gid, seq, cfg.task.name, samples))
    return groups


def main() -> None:
    spec, out = part_args()
    import torch

    from asyncrl.config import load_config
    from asyncrl.models.tokenizer import load_tokenizer
    from asyncrl.tiny_model.prepare import resolve_model_path
    from asyncrl.training.batch import build_batch
    from asyncrl.training.heap import keep_freed_memory
    from asyncrl.training.learner import Learner

    cfg = load_config(spec["config"], spec["overrides"])
    if cfg.training.cpu_threads:  # as the training role's main()
        torch.set_num_threads(cfg.training.cpu_threads)
    keep_freed_memory()
    model = resolve_model_path(cfg)
    tok = load_tokenizer(model)
    pad_id, eos = int(tok.pad_token_id), int(tok.eos_token_id)
    dump = Path(spec.get("batch_in") or "")
    source = "raw engine batch" if dump.is_file() else "synthetic"
    groups = groups_from_dump(cfg, json.loads(dump.read_text()), eos) if dump.is_file() else synthetic_groups(cfg, eos)
    t0 = time.monotonic()
    learner = Learner(model, cfg.training, timeout_s=cfg.timeouts.collective_s)
    init_s = time.monotonic() - t0
    temp = cfg.rollout.temperature
    try:
        learner.train_step(build_batch(groups, norm_std=cfg.training.norm_std, pad_id=pad_id), 0, temperature=temp)
        steps = []
        for k in range(int(spec.get("repeats", 3))):
            t = time.perf_counter()
            batch = build_batch(groups, norm_std=cfg.training.norm_std, pad_id=pad_id)
            built = time.perf_counter()
            learner.train_step(batch, k + 1, temperature=temp)
            done = time.perf_counter()
            steps.append({"build_s": built - t, "train_step_s": done - built, "total_s": done - t})
            print(f"train step {k + 1}: {done - t:.3f} s (build_batch {built - t:.3f} s)", flush=True)
    finally:
        learner.close()
    total = [s["total_s"] for s in steps]
    write_result(out, {"source": source, "samples": batch.num_samples, "padded_length": int(batch.input_ids.shape[1]),
                       "trained_tokens": batch.num_tokens, "torch_threads": torch.get_num_threads(),
                       "micro_batch_size": cfg.training.micro_batch_size, "zero_stage": cfg.training.zero_stage,
                       "learner_init_s": init_s, "steps": steps, "step_s": sum(total) / len(total),
                       "step_s_min": min(total)})


if __name__ == "__main__":
    main()
