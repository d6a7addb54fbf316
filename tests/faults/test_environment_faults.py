"""Agentic end to end: `asyncrl run` on FrozenLake (configs/agentic.yaml, smaller), multi-turn episodes on vLLM,
DeepSpeed, SeaweedFS and MLflow, with environment faults injected into every kind of step: raising, returning
garbage, hanging past the step deadline, and slow.

Checks what issue 5 asks: each trained trajectory is one token sequence whose loss mask covers exactly the
generated turns (observations never trained on), with per-turn offsets, rewards and versions; faulty episodes are
counted by kind, reported by the hang detector, replaced, and never written to a trained group; the run finishes
with held-out success measured before and after; no process is left.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import psutil
import pytest
import yaml

from asyncrl.config import load_config
from asyncrl.models.tokenizer import TEXT_VOCAB
from tests.helpers.run_groups import stats_and_groups
from tests.helpers.subprocess_runs import run_embedded

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
RUN_ID = "agentic-faults-test"
USER, ASSISTANT = TEXT_VOCAB["<|user|>"], TEXT_VOCAB["<|assistant|>"]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory):
    runs = tmp_path_factory.mktemp("runs")
    doc = yaml.safe_load((ROOT / "configs/agentic.yaml").read_text())
    doc["env"].update(num_eval=8, step_timeout_s=2.0, hang_report_s=1.0, injection={
        "latency_mean_s": 0.02, "latency_std_s": 0.02, "slowdown_rate": 0.05, "slowdown_factor": 10.0,
        "failure_rate": 0.04, "garbage_rate": 0.04, "hang_rate": 0.03, "seed": 1})
    doc["rollout"].update(prompts_per_step=4, samples_per_prompt=4, extra_samples_per_prompt=1, replace_failed=3,
                          stats_interval_s=0.5)
    doc["training"].update(steps=3, micro_batch_size=16)
    config = runs / "agentic_faults.yaml"
    config.write_text(yaml.safe_dump(doc))
    stdout = run_embedded(config, runs, RUN_ID)
    return runs / RUN_ID, config, stdout


def test_run_finishes_and_measures_held_out_success(finished_run):
    run_dir, config, stdout = finished_run
    cfg = load_config(config)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    assert summary["final_version"] == cfg.training.steps
    assert summary["samples_trained"] == cfg.training.steps * cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert 0.0 <= summary["eval_accuracy_before"] <= 1.0 and 0.0 <= summary["eval_accuracy_after"] <= 1.0
    assert "held-out success rate" in stdout
    assert summary["weights_in_sync"] is True


def test_trajectories_are_multi_turn_with_observations_masked(finished_run, monkeypatch):
    run_dir, config, _ = finished_run
    cfg = load_config(config)
    _, groups = stats_and_groups(run_dir, config, monkeypatch)
    assert len(groups) >= cfg.training.steps * cfg.rollout.prompts_per_step
    multi = 0
    for g in groups:
        assert g.task == "frozenlake" and g.prompt_index >= 1_000_000  # a training level, never a held-out one
        assert len(g.samples) == cfg.rollout.samples_per_prompt
        for s in g.samples:
            s.validate()
            assert s.turn_offsets and s.turn_rewards and len(s.turn_offsets) <= cfg.env.max_turns
            assert s.reward == pytest.approx(sum(s.turn_rewards)) and s.finish_reason in ("stop", "length")
            mask = s.mask()
            # every masked run sits between two turns and holds the next observation: <|user|> ... <|assistant|>
            for k, start in enumerate(s.turn_offsets[1:], start=1):
                gap = [t for t, m in zip(s.token_ids[:start], mask[:start], strict=True) if not m]
                assert gap.count(USER) == k and gap.count(ASSISTANT) == k
                assert mask[start - 1] == 0 and s.token_ids[start - 1] == ASSISTANT
            assert all(lp == 0.0 for lp, m in zip(s.logprobs, mask, strict=True) if not m)
            assert all(lp <= 0.0 for lp, m in zip(s.logprobs, mask, strict=True) if m)
            multi += len(s.turn_offsets) > 1
    assert multi > 0


def test_faults_are_counted_replaced_and_never_trained(finished_run, monkeypatch):
    run_dir, config, _ = finished_run
    stats, groups = stats_and_groups(run_dir, config, monkeypatch)
    m = stats["metrics"]
    for kind in ("raised", "garbage", "timeout"):
        assert m.get(f"env/faults_{kind}", 0) >= 1, (kind, m)
    assert m["env/faults"] == len(stats["failed_episodes"]) or len(stats["failed_episodes"]) == 1000
    assert m["env/stalled_reports"] >= 1  # the hang detector saw the hanging steps before their deadline
    assert m["rollout/replaced_samples"] >= 1 and m["env/episodes"] >= 1
    failed = {line.split(":")[0] for line in stats["failed_episodes"]}
    written = {f"{g.group_id}/{s.sample_index}" for g in groups for s in g.samples}
    assert failed and not failed & written  # no failed episode reached a written (trainable) group


def test_mlflow_has_environment_metrics(finished_run):
    run_dir, config, _ = finished_run
    cfg = load_config(config)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    (run,) = client.search_runs([client.get_experiment_by_name(cfg.tracking.experiment).experiment_id],
                                "tags.`asyncrl.child` IS NULL")  # the job's run, not its role instances' children
    for name in ("env/success_rate", "env/mean_turns", "env/faults", "env/episodes"):
        steps = [m.step for m in client.get_metric_history(run.info.run_id, name)]  # once per read, and the last step
        assert len(set(steps)) == len(steps) and cfg.training.steps in steps, name
    assert run.data.params["env.name"] == "frozenlake"


def test_no_process_left(finished_run):
    run_dir, _, _ = finished_run
    leftovers = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            env = {}
        if str(run_dir) in cmd or RUN_ID in cmd or any(str(run_dir) in v for v in env.values()):
            leftovers.append((p.info["pid"], cmd))
    assert leftovers == []
