"""TRL's `GRPOTrainer` on the job (runs in `.cache/bench-trl-venv`, never in the project's venv).

Imports from this repository only `asyncrl.models.tokenizer` (our tokenizer loader: tokenizers + transformers) and
`asyncrl.rewards.verifier` (pure Python), both of which the TRL venv can run; nothing else of asyncrl.
Synchronous GRPO: each step generates one batch (prompts_per_step × samples_per_prompt, group size
samples_per_prompt) with the current weights (transformers `generate`), scores it with our verifier and takes one
optimizer step (num_iterations 1). Prompts are "<bos>" + the problem, which our tokenizer turns into exactly the ids
our environment role sends (checked). Times every step; steady = every step but the first. Greedy held-out accuracy
before and after (our verifier, the launcher's evaluation settings: max_new_tokens, stop at EOS).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from efficiency_parts.common import ROOT, part_args, write_result

sys.path.insert(0, str(ROOT))


def accuracy(model: Any, tok: Any, rows: list[dict[str, str]], max_new_tokens: int, task: str) -> float:
    import torch

    from asyncrl.models.tokenizer import decode_response, encode_prompt
    from asyncrl.rewards.verifier import score

    ids = [encode_prompt(tok, r["prompt"]) for r in rows]
    width = max(len(i) for i in ids)
    pad = int(tok.pad_token_id)
    input_ids = torch.tensor([[pad] * (width - len(i)) + i for i in ids])
    mask = torch.tensor([[0] * (width - len(i)) + [1] * len(i) for i in ids])
    was_training = model.training
    model.eval()
    with torch.no_grad():
        out = model.generate(input_ids=input_ids, attention_mask=mask, max_new_tokens=max_new_tokens, do_sample=False,
                             eos_token_id=int(tok.eos_token_id), pad_token_id=pad)
    model.train(was_training)
    correct = sum(score(task, decode_response(tok, o[width:].tolist()), r["answer"])[0] for o, r in zip(out, rows, strict=True))
    return correct / len(rows)


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

    from asyncrl.models.tokenizer import BOS, load_tokenizer
    from asyncrl.rewards.verifier import score

    assert "+cpu" in torch.__version__, torch.__version__
    tok = load_tokenizer(data["model_dir"])
    for row, want in zip(data["train"], data["expected_prompt_ids"], strict=False):
        got = tok(text=BOS + row["prompt"])["input_ids"]  # what GRPOTrainer does with a plain-text prompt
        if got != want:
            raise SystemExit(f"TRL prompt ids {got} differ from our environment's {want} for {row['prompt']!r}")
    task = data["task"]

    def verifier_reward(prompts: list[str], completions: list[str], answer: list[str], **_: Any) -> list[float]:
        # TRL decodes each completion up to and including its first EOS, special tokens skipped: our verifier's cut
        return [score(task, c, a)[0] for c, a in zip(completions, answer, strict=True)]

    model = AutoModelForCausalLM.from_pretrained(data["model_dir"], dtype=torch.float32)
    acc_before = accuracy(model, tok, data["eval"], data["max_new_tokens"], task) if spec.get("eval") else None
    n, batch = data["samples_per_prompt"], data["prompts_per_step"] * data["samples_per_prompt"]
    generation_kwargs = None
    if data["length_tail"]:
        # our length-tail job decodes past EOS (ignore_eos); transformers has no per-sample budget and a batch runs to
        # its longest sample anyway, so every sample decodes max_new_tokens: generation stops on an id never sampled,
        # while TRL's completion mask (and so the reward and the loss) still ends at the first real EOS
        generation_kwargs = {"eos_token_id": int(model.config.vocab_size)}
    work = tempfile.mkdtemp(prefix="asyncrl-eff-trl-")
    args = GRPOConfig(
        output_dir=work, use_cpu=True, bf16=False, fp16=False, report_to="none", save_strategy="no", logging_steps=1,
        disable_tqdm=True, max_steps=int(spec["steps"]), seed=data["seed"], dataloader_num_workers=0,
        per_device_train_batch_size=batch, gradient_accumulation_steps=1, num_generations=n,
        max_completion_length=data["max_new_tokens"], temperature=data["temperature"], top_p=data["top_p"],
        learning_rate=data["lr"], lr_scheduler_type="constant", warmup_steps=0, weight_decay=data["weight_decay"],
        max_grad_norm=data["grad_clip"], beta=data["kl_coef"], num_iterations=1, epsilon=data["clip_low"],
        epsilon_high=data["clip_high"], loss_type="grpo", scale_rewards="group" if data["norm_std"] else "none",
        generation_kwargs=generation_kwargs, log_completions=False,
    )
    times: list[float] = []

    class StepTimes(TrainerCallback):
        def on_step_begin(self, *a: Any, **k: Any) -> None:
            self.t0 = time.perf_counter()

        def on_step_end(self, *a: Any, **k: Any) -> None:
            times.append(time.perf_counter() - self.t0)
            print(f"trl step {len(times)}: {times[-1]:.2f} s", flush=True)

    dataset = Dataset.from_list([{"prompt": BOS + r["prompt"], "answer": r["answer"]} for r in data["train"]])
    trainer = GRPOTrainer(model=model, reward_funcs=verifier_reward, args=args, train_dataset=dataset,
                          processing_class=tok, callbacks=[StepTimes()])
    t0 = time.monotonic()
    trainer.train()
    wall = time.monotonic() - t0
    acc_after = accuracy(trainer.model, tok, data["eval"], data["max_new_tokens"], task) if spec.get("eval") else None
    logs = [h for h in trainer.state.log_history if "completions/mean_length" in h]
    steady = times[1:]
    lengths = [h["completions/mean_length"] for h in logs[1:]]
    decoded = data["max_new_tokens"] if data["length_tail"] else None
    step_s = sum(steady) / len(steady) if steady else None
    write_result(out, {
        "versions": {"trl": trl.__version__, "transformers": transformers.__version__, "torch": torch.__version__},
        "torch_threads": torch.get_num_threads(), "omp_num_threads": os.environ.get("OMP_NUM_THREADS"),
        "batch": batch, "num_generations": n, "loss_type": "grpo", "train_wall_s": wall, "step_times_s": times,
        "step_s": step_s, "step_s_median": sorted(steady)[len(steady) // 2] if steady else None,
        "samples_per_s": batch / step_s if step_s else None,
        "mean_completion_tokens": sum(lengths) / len(lengths) if lengths else None,
        "decoded_tokens_per_sample": decoded,
        "tokens_per_s": (batch * (decoded or (sum(lengths) / len(lengths))) / step_s) if step_s and lengths else None,
        "reward_mean": [h.get("reward") for h in logs],
        "eval_accuracy_before": acc_before, "eval_accuracy_after": acc_after,
        "generation_kwargs": generation_kwargs,
    })


if __name__ == "__main__":
    main()
