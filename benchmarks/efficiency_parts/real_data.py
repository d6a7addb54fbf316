"""The real job's inputs for TRL and the snapshot evaluation, prepared in the project's venv: the model folder, the
train and held-out problems with their chat-rendered prompt text and the exact ids our environment role sends, the
ids that end an answer, and the job's hyperparameters."""

from __future__ import annotations

from pathlib import Path

from efficiency_parts.common import part_args, write_result


def main() -> None:
    spec, out = part_args()
    from asyncrl.config import load_config
    from asyncrl.config.loss_params import PPOParams
    from asyncrl.models.prompts import prompt_format, stop_token_ids
    from asyncrl.models.tokenizer import load_tokenizer
    from asyncrl.tasks.datasets import load_split
    from asyncrl.tasks.materialised import prepare
    from asyncrl.tasks.prompt_fit import prompts_that_fit

    cfg = load_config(spec["config"], spec["overrides"])
    prepare(cfg)  # a reasoning_gym task's rows are generated (or read from the cache) before load_split
    model = Path(cfg.model.path).resolve()
    tok = load_tokenizer(model)
    fmt = prompt_format(cfg, tok)
    train, _ = prompts_that_fit(cfg, tok, load_split(cfg.task, "train"))
    evals = load_split(cfg.task, "eval")
    ro, tr = cfg.rollout, cfg.training
    clip = tr.loss_params if isinstance(tr.loss_params, PPOParams) else PPOParams()  # TRL's GRPO clips as ppo does
    write_result(out, {
        "model_dir": str(model), "task": cfg.task.name, "prompt_format": fmt.format,
        "verifier": cfg.task.resolved_verifier(), "format_reward": cfg.task.format_reward,
        "train": [{"text": fmt.text(p.prompt), "ids": fmt.ids(p.prompt), "answer": p.answer} for p in train],
        "eval": [{"prompt": p.prompt, "ids": fmt.ids(p.prompt), "answer": p.answer} for p in evals],
        "stop_ids": stop_token_ids(tok, model, chat=fmt.format == "chat"),
        "prompts_per_step": ro.prompts_per_step, "samples_per_prompt": ro.samples_per_prompt,
        "max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p,
        "lr": tr.lr, "weight_decay": tr.weight_decay, "grad_clip": tr.grad_clip, "clip_low": clip.clip_low,
        "clip_high": clip.clip_high, "norm_std": tr.norm_std, "seed": tr.seed, "aggregation": tr.aggregation,
        "overlong": ro.overlong,
        "bf16": tr.matmul_dtype == "bfloat16", "max_model_len": cfg.generation.max_model_len,
    })


if __name__ == "__main__":
    main()
