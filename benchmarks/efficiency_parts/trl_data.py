"""The TRL baseline's inputs, prepared in the project's venv: model folder, train/eval prompts and answers, the
prompt ids our environment role would send (to check TRL's tokenization against), and the job's hyperparameters."""

from __future__ import annotations

from efficiency_parts.common import part_args, write_result


def main() -> None:
    spec, out = part_args()
    from asyncrl.config import load_config
    from asyncrl.config.loss_params import PPOParams
    from asyncrl.models.tokenizer import encode_prompt, load_tokenizer
    from asyncrl.tasks.datasets import load_split
    from asyncrl.tasks.materialised import prepare
    from asyncrl.tasks.prompt_fit import prompts_that_fit
    from asyncrl.tiny_model.prepare import resolve_model_path

    cfg = load_config(spec["config"], spec["overrides"])
    prepare(cfg)  # a reasoning_gym or file task: its rows made here, as `asyncrl run` makes them
    model = resolve_model_path(cfg)
    tok = load_tokenizer(model)
    train, _ = prompts_that_fit(cfg, tok, load_split(cfg.task, "train"))
    evals = load_split(cfg.task, "eval")
    ro, tr = cfg.rollout, cfg.training
    clip = tr.loss_params if isinstance(tr.loss_params, PPOParams) else PPOParams()  # TRL's GRPO clips as ppo does
    write_result(out, {
        "model_dir": str(model.resolve()), "task": cfg.task.name,
        "train": [{"prompt": p.prompt, "answer": p.answer} for p in train],
        "eval": [{"prompt": p.prompt, "answer": p.answer} for p in evals],
        "expected_prompt_ids": [encode_prompt(tok, p.prompt) for p in train[:16]],
        "prompts_per_step": ro.prompts_per_step, "samples_per_prompt": ro.samples_per_prompt,
        "max_new_tokens": ro.max_new_tokens, "temperature": ro.temperature, "top_p": ro.top_p,
        "length_tail": ro.length_tail is not None, "lr": tr.lr, "weight_decay": tr.weight_decay,
        "grad_clip": tr.grad_clip, "clip_low": clip.clip_low, "clip_high": clip.clip_high, "kl_coef": tr.kl_coef,
        "norm_std": tr.norm_std, "seed": tr.seed, "loss": tr.loss, "aggregation": tr.aggregation,
    })


if __name__ == "__main__":
    main()
