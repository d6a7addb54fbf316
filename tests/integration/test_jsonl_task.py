"""`asyncrl build-model` on a user's JSON Lines dataset with bad rows, as a real process: the pre-flight check reads
the files, bad rows are logged with FILE:LINE, and the built-in model is warm-started on the good train rows with
the text tokenizer, keyed by the train file's content."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.models.tokenizer import encode_prompt, load_tokenizer
from asyncrl.tiny_model.build import BUILD_INFO

pytestmark = pytest.mark.integration


def test_build_model_on_a_jsonl_dataset_with_bad_rows(tmp_path: Path) -> None:
    train, evals = tmp_path / "train.jsonl", tmp_path / "eval.jsonl"
    rows = [json.dumps({"prompt": f"What is {i} plus {i}?", "answer": str(2 * i)}) for i in range(12)]
    train.write_text("\n".join(rows[:5] + ["{broken", '{"prompt": "x"}'] + rows[5:]) + "\n")
    evals.write_text(json.dumps({"prompt": "What is 20 plus 20?", "answer": "40"}) + "\n")
    argv = [sys.executable, "-m", "asyncrl.cli", "build-model", "--set", f"cache_dir={tmp_path / 'cache'}",
            "--set", "task.name=jsonl", "--set", f"task.train_path={train}", "--set", f"task.eval_path={evals}",
            "--set", "model.tiny.sft_steps=4", "--set", "model.tiny.sft_batch_size=4",
            "--set", "generation.max_model_len=40", "--set", "rollout.max_new_tokens=4"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert f"{train}:6: row skipped: not valid JSON" in done.stderr
    assert f"{train}:7: row skipped: answer: missing" in done.stderr
    folder = Path(done.stdout.strip().splitlines()[-1])
    info = json.loads((folder / BUILD_INFO).read_text())
    assert info["inputs"]["charset"] == "text" and len(info["inputs"]["train_sha256"]) == 64
    assert info["dev_problems"] == 3  # 12 good rows: a quarter is the SFT dev set
    tok = load_tokenizer(folder)
    assert len(encode_prompt(tok, "What is 1 plus 1?")) == 18 and tok.unk_token_id not in encode_prompt(tok, "What")

    evals.unlink()  # a missing file stops the command before anything is built
    done = subprocess.run(argv, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stderr.strip().endswith(
        f"asyncrl: task.eval_path: {evals}: no such dataset file (expected JSON Lines)")
