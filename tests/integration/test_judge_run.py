"""A judge model as the reward, end to end: `asyncrl run` of the smoke job with `task.judge.model_path`, so the run
serves its own judge (the judge role: a second vLLM server of the frozen tiny model, never sent weights) and the
reward role asks it for every sample, concurrently.

The rubric is the problem itself and the score the number the judge writes, scaled from [0, 30]: so every trained
reward can be recomputed here from the frozen judge (transformers, greedy), which proves the rewards are the judge's
and that the judge never changed. A judge answer above 30 is a failed judgment: those samples fail, their groups
are replaced, and none of them is trained. Judge figures are in MLflow (the reward instance's child run).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import mlflow
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import load_config
from asyncrl.config.schema import JudgeConfig
from asyncrl.models.prompts import stop_token_ids
from asyncrl.models.tokenizer import load_tokenizer
from asyncrl.rewards.judge import ServedJudge, read_score
from asyncrl.tiny_model.build import build_tiny_model
from tests.helpers.run_groups import stats_and_groups
from tests.helpers.subprocess_runs import run_embedded

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "judge-test"
MAX_SCORE = 30


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    judge_model = build_tiny_model(load_config(ROOT / "configs/smoke.yaml", [f"cache_dir={ROOT / '.cache/asyncrl'}"]))
    judge = {"model_path": str(judge_model), "rubric": "{prompt}", "score_pattern": r"(\d+)", "min_score": 0,
             "max_score": MAX_SCORE, "max_tokens": 4, "attempts": 1, "max_concurrency": 8, "max_model_len": 32,
             "kv_cache_gib": 0.05}
    overrides = ["generation.num_servers=1", "eval.every_steps=0", "timeouts.heartbeat_s=0.25",
                 f"task.judge={json.dumps(judge)}"]
    stdout = run_embedded(ROOT / "configs/smoke.yaml", runs, RUN_ID, overrides)
    config = runs / "judge.yaml"
    config.write_text((ROOT / "configs/smoke.yaml").read_text())
    return runs / RUN_ID, config, JudgeConfig(**judge), stdout


def test_every_trained_reward_is_the_frozen_judges_score(finished_run, monkeypatch):
    run_dir, config, judge, _ = finished_run
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["final_version"] == load_config(config).training.steps
    _, groups = stats_and_groups(run_dir, config, monkeypatch)
    tok = load_tokenizer(Path(judge.model_path))
    served = ServedJudge(judge, httpx.Client(), lambda: "", None, tok, stop_token_ids(tok, Path(judge.model_path)))
    model = AutoModelForCausalLM.from_pretrained(judge.model_path, dtype=torch.float32).eval()
    checked = 0
    for g in groups:
        prompt = tok.decode(g.samples[0].prompt_token_ids, skip_special_tokens=True)
        ids = served.prompt_ids(prompt)
        with torch.no_grad():
            out = model.generate(torch.tensor([ids]), max_new_tokens=judge.max_tokens, do_sample=False,
                                 eos_token_id=served.stop_ids, pad_token_id=tok.pad_token_id)
        reply = tok.decode(out[0, len(ids):], skip_special_tokens=True)
        expected, _ = read_score(reply, judge.score_pattern, judge.min_score, judge.max_score)
        assert [s.reward for s in g.samples] == pytest.approx([expected] * len(g.samples)), (prompt, reply)
        checked += 1
    assert checked >= 3 * 4


def test_failed_judgments_are_counted_and_the_judge_figures_are_in_mlflow(finished_run):
    run_dir, config, _, _ = finished_run
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    experiment = client.get_experiment_by_name(load_config(config).tracking.experiment).experiment_id
    (reward,) = client.search_runs([experiment], "tags.`asyncrl.child` = 'reward-0'")
    last = {k.removeprefix("reward/"): v for k, v in reward.data.metrics.items() if k.startswith("reward/judge_")}
    assert last["judge_judgments"] >= 1 and last["judge_failed"] >= 1, last  # figures of a late heartbeat
    assert last["judge_calls"] == last["judge_judgments"] + last["judge_failed"]  # one attempt each
    assert 0 < last["judge_latency_mean_s"] <= last["judge_latency_max_s"]


def test_the_judge_role_ran_beside_the_policy_servers(finished_run):
    run_dir, _, _, stdout = finished_run
    log = (run_dir / "logs" / "judge-0.log").read_text()
    assert "generation server ready" in log and "published judge/0" in log
