"""Held-out accuracy of saved weight snapshots (TRL's, `trl_real_worker`), with the protocol of asyncrl's own
held-out evaluation: vLLM, greedy, the same chat-rendered prompt ids, `max_new_tokens`, the model's stop ids, and the
run's scorer (a sample is correct when the verifier says so). One engine per snapshot, started in this process."""

from __future__ import annotations

import time

from efficiency_parts.common import part_args, write_result


def main() -> None:
    spec, out = part_args()
    import json
    from pathlib import Path

    from vllm import LLM, SamplingParams
    from vllm.inputs import TokensPrompt

    from asyncrl.config import load_config
    from asyncrl.models.tokenizer import decode_response, load_tokenizer
    from asyncrl.rewards.custom import is_correct, scorer_for

    data = json.loads(Path(spec["data"]).read_text())
    cfg = load_config(spec["config"], spec["overrides"])
    scorer = scorer_for(cfg.task)
    rows = data["eval"]
    points = []
    for snap in spec["snapshots"]:
        t0 = time.monotonic()
        tok = load_tokenizer(snap["path"])
        llm = LLM(model=snap["path"], skip_tokenizer_init=True, dtype="float32", enforce_eager=True,
                  max_model_len=data["max_model_len"], max_num_seqs=256, kv_cache_memory_bytes=int(2 << 30),
                  seed=0)
        params = SamplingParams(temperature=0.0, max_tokens=data["max_new_tokens"], stop_token_ids=data["stop_ids"],
                                detokenize=False)
        outs = llm.generate([TokensPrompt(prompt_token_ids=r["ids"]) for r in rows], params, use_tqdm=False)
        correct = 0
        for o, r in zip(outs, rows, strict=True):
            reward, details = scorer(cfg.task.name, r["prompt"], decode_response(tok, o.outputs[0].token_ids),
                                     r["answer"])
            correct += is_correct(reward, details)
        lengths = [len(o.outputs[0].token_ids) for o in outs]
        points.append({**snap, "accuracy": correct / len(rows), "correct": correct, "n": len(rows),
                       "mean_tokens": sum(lengths) / len(lengths), "eval_s": time.monotonic() - t0})
        print(f"snapshot {snap['path']}: accuracy {correct / len(rows):.3f}", flush=True)
        del llm
    write_result(out, {"points": points})


if __name__ == "__main__":
    main()
