"""End to end: `asyncrl run` on the smoke config, with one vLLM server (two, with faults, run in
tests/faults/test_embedded_faults.py), DeepSpeed, SeaweedFS and MLflow.

Checks what issue 2 asks of the embedded launcher: groups are in S3; the version advanced; after the last sync
the weights in every vLLM worker equal the trainer's (checksums); every trained sample satisfied the α bound;
MLflow has the step metrics in the job's run and each role instance's figures in its child run (issue 18); a
committed checkpoint exists; no process is left running. Issue 18: each committed checkpoint is an MLflow model of
the run at its step, and the registered version (the best by eval) loads with transformers with the checkpoint's
logits.
"""

from __future__ import annotations

import json
from pathlib import Path

import mlflow
import psutil
import pytest
import torch
from transformers import AutoModelForCausalLM

from asyncrl.config import load_config
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.run.model_choice import choose_checkpoint
from asyncrl.storage.checkpoints import committed_versions, latest_committed_version, load_checkpoint
from asyncrl.storage.eval_points import eval_figures
from asyncrl.storage.groups import GroupReader
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.child_runs import CHILD_TAG, PARENT_TAG, child_runs
from asyncrl.weights.buckets import checksums_match
from tests.integration.conftest import SMOKE_OVERRIDES, SMOKE_RUN_ID, mlflow_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


OVERRIDES = SMOKE_OVERRIDES


@pytest.fixture
def finished_run(smoke_run: tuple[Path, str]) -> tuple[Path, str]:
    """(run folder, stdout) (tests/integration/conftest.py: run once per session, beside the algorithms run)."""
    return smoke_run


def test_summary_and_progress(finished_run):
    run_dir, stdout = finished_run
    cfg = load_config(ROOT / "configs/smoke.yaml", OVERRIDES)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    for key in ("run_id", "steps", "final_version", "samples_trained", "samples_dropped_stale", "eval_accuracy_before",
                "eval_accuracy_after", "staleness_mean", "staleness_max", "wall_s", "samples_per_s"):
        assert key in summary, key
    assert summary["final_version"] == cfg.training.steps
    assert summary["samples_trained"] == cfg.training.steps * cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    assert 0 <= summary["staleness_max"] <= cfg.rollout.async_ratio
    assert summary["weights_in_sync"] is True
    assert summary["num_generation_servers"] == 1
    assert 0.0 <= summary["eval_accuracy_before"] <= 1.0 and 0.0 <= summary["eval_accuracy_after"] <= 1.0
    assert f"step    {cfg.training.steps}/{cfg.training.steps}" in stdout


def test_s3_holds_groups_checkpoint_and_matching_checksums(finished_run, monkeypatch):
    run_dir, _ = finished_run
    summary = json.loads((run_dir / "run_summary.json").read_text())
    cfg = load_config(ROOT / "configs/smoke.yaml", OVERRIDES)
    # restart the S3 server over the run's data folder: everything the run wrote is still there
    with EmbeddedS3(run_dir / "s3") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        store = S3Store(s3.endpoint_url, cfg.storage.bucket)
        paths = RunPaths(cfg.storage.prefix, summary["run_id"])
        reader = GroupReader(store, paths)
        groups = reader.poll()
        assert len(groups) >= cfg.training.steps * cfg.rollout.prompts_per_step
        eos = 2
        for _, _, g in groups:
            assert len(g.samples) == cfg.rollout.samples_per_prompt  # the redundant sample was aborted or dropped
            for smp in g.samples:  # length-tailed decoding: trained only up to the first EOS
                cut = smp.token_ids.index(eos) + 1 if eos in smp.token_ids else len(smp.token_ids)
                assert smp.mask() == [1] * cut + [0] * (len(smp.token_ids) - cut)
        assert latest_committed_version(store, paths) == cfg.training.steps
        latest = store.get_json(paths.versions_latest())
        assert latest["version"] == cfg.training.steps
        assert len(summary["server_checksums"]) == cfg.generation.num_servers
        for c in summary["server_checksums"]:
            assert c["version"] == latest["version"] and checksums_match(c["checksum"], latest["checksum"])
        assert store.exists(paths.done())


def test_mlflow_has_step_metrics(finished_run):
    run_dir, _ = finished_run
    summary = json.loads((run_dir / "run_summary.json").read_text())
    cfg = load_config(ROOT / "configs/smoke.yaml", OVERRIDES)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    run = mlflow_run(run_dir.parent, SMOKE_RUN_ID, cfg.tracking.experiment)
    assert run.info.status == "FINISHED"
    for name in ("reward/mean", "reward/accuracy", "train/loss", "train/clip_fraction", "staleness/mean",
                 "staleness/max", "throughput/samples_per_s", "time/wait_s", "time/train_s", "time/sync_s"):
        history = client.get_metric_history(run.info.run_id, name)
        assert [m.step for m in history] == list(range(1, cfg.training.steps + 1)), name
    assert all(m.value <= cfg.rollout.async_ratio for m in client.get_metric_history(run.info.run_id, "staleness/max"))
    hist = [sorted(client.get_metric_history(run.info.run_id, f"staleness/hist_{lag}"), key=lambda m: m.step)
            for lag in (0, 1)]
    for step in range(cfg.training.steps):  # the histogram counts every trained sample
        assert sum(h[step].value for h in hist) == cfg.rollout.prompts_per_step * cfg.rollout.samples_per_prompt
    for name in ("rollout/admitted_groups", "rollout/requests_in_flight", "rollout/aborted_redundant_groups",
                 "rollout/aborted_samples", "rollout/dropped_samples", "rollout/verified_samples", "reward/correct"):
        # the writers' figures are logged once per read (every few seconds), always at the last step
        steps = [m.step for m in client.get_metric_history(run.info.run_id, name)]
        assert len(set(steps)) == len(steps) and set(steps) <= set(range(1, cfg.training.steps + 1)), name
        assert cfg.training.steps in steps, name
    shares = {name: max(client.get_metric_history(run.info.run_id, name), key=lambda m: m.step).value
              for name in ("reward/correct", "rollout/correct_samples", "rollout/verified_samples")}
    # the share of scored samples correct (the verifier's details), from the same read as its counts
    assert shares["reward/correct"] == shares["rollout/correct_samples"] / shares["rollout/verified_samples"], shares
    last = {name: max(client.get_metric_history(run.info.run_id, f"rollout/{name}"), key=lambda m: m.step).value
            for name in ("generate_calls", "generate_requests", "reward_calls", "reward_items", "s3_requests",
                         "s3_get_missing")}
    # requests and scores travel many per call: a group's samples at least share their calls
    assert 1 <= last["generate_calls"] < last["generate_requests"] and 1 <= last["reward_calls"] < last["reward_items"]
    # S3 requests by role: the writer's (at least its group objects' PUTs) and the trainer's (at least their GETs)
    written = max(client.get_metric_history(run.info.run_id, "rollout/written_objects"), key=lambda m: m.step).value
    assert 0 <= last["s3_get_missing"] < last["s3_requests"] and last["s3_requests"] >= written, last
    trainer_requests = client.get_metric_history(run.info.run_id, "storage/requests_total")
    assert max(m.value for m in trainer_requests) >= cfg.training.steps, trainer_requests
    admitted = sorted(client.get_metric_history(run.info.run_id, "rollout/admitted_groups"), key=lambda m: m.step)
    assert admitted[-1].value >= cfg.training.steps * cfg.rollout.prompts_per_step - cfg.rollout.prompts_per_step
    evals = sorted(client.get_metric_history(run.info.run_id, "eval/accuracy"), key=lambda m: m.step)
    assert evals and evals[0].step == 0  # the warm start first, then points at the versions that generated them
    assert evals[-1].step == summary["final_version"]  # and the final version, waited for before the run ended
    assert summary["eval_accuracy_before"] == evals[0].value and summary["eval_accuracy_after"] == evals[-1].value
    assert summary["eval_curve"] == {str(m.step): m.value for m in evals}
    passk = client.get_metric_history(run.info.run_id, "eval/pass_at_k")  # k samples at the rollout temperature
    assert sorted(m.step for m in passk) == [m.step for m in evals] and all(0.0 <= m.value <= 1.0 for m in passk)
    assert {m.value for m in client.get_metric_history(run.info.run_id, "eval/k")} == {float(cfg.eval.pass_k)}
    assert len({m.step for m in evals}) == len(evals) and all(0 <= m.step <= cfg.training.steps for m in evals)
    assert all(0.0 <= m.value <= 1.0 for m in evals)
    assert all(m.value == cfg.task.num_eval for m in client.get_metric_history(run.info.run_id, "eval/n"))
    assert run.data.params["rollout.async_ratio"] == str(cfg.rollout.async_ratio)
    assert not [k for k in run.data.metrics if k.startswith(("system/", "generation/", "environment/", "reward/0"))]


def test_each_role_instance_has_a_child_run_with_its_own_figures(finished_run):
    run_dir, _ = finished_run
    cfg = load_config(ROOT / "configs/smoke.yaml", OVERRIDES)
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{run_dir.parent / 'mlflow.db'}")
    job = mlflow_run(run_dir.parent, SMOKE_RUN_ID, cfg.tracking.experiment)
    children = {r.data.tags[CHILD_TAG]: r for r in child_runs(client, job.info.run_id)}
    assert sorted(children) == ["environment-env0", "generation-0", "reward-0", "training-0"]  # each made once
    steps = set(range(1, cfg.training.steps + 1))

    def history(key: str, name: str) -> list[mlflow.entities.Metric]:
        return client.get_metric_history(children[key].info.run_id, name)

    for key, child in children.items():
        assert child.info.run_name == key and child.data.tags[PARENT_TAG] == job.info.run_id
        assert child.info.status == "FINISHED", key  # ended with the job's run
        rss, machine = history(key, "system/memory_rss_mb"), history(key, "system/cpu_utilization_percentage")
        assert rss and all(m.value > 10 for m in rss), key  # the role's own process tree
        assert machine and all(0.0 <= m.value <= 100.0 for m in machine), key  # MLflow's system metric name
        assert history(key, "system/system_memory_usage_megabytes"), key
        # read every few seconds, logged at the training step they were read at, each step once
        logged = [m.step for m in rss]
        assert len(set(logged)) == len(logged) and set(logged) <= steps and cfg.training.steps in logged, key
    tokens = history("generation-0", "generation/tokens_generated")
    assert tokens and max(m.value for m in tokens) > 0
    busy = history("environment-env0", "rollout/server0/busy_fraction")
    assert busy and all(0.0 <= m.value <= 1.0 for m in busy)
    assert history("reward-0", "reward/scored")


def test_each_checkpoint_is_an_mlflow_model_and_the_best_by_eval_is_registered(finished_run, monkeypatch, tmp_path):
    run_dir, stdout = finished_run
    cfg = load_config(ROOT / "configs/smoke.yaml", OVERRIDES)
    with EmbeddedS3(run_dir / "s3") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        store = S3Store(s3.endpoint_url, cfg.storage.bucket)
        paths = RunPaths(cfg.storage.prefix, SMOKE_RUN_ID)
        committed, figures = committed_versions(store, paths), eval_figures(store, paths)
        published = store.get_json(paths.file("models/published.json"))
        registered = store.get_json(paths.file("models/registered.json"))
        weights, _, _ = load_checkpoint(store, paths, registered["checkpoint_version"])
        start_folder = store.get_json(paths.model())["path"]
    assert committed == [2, 3] and published["models_logged"] == committed and published["models_not_logged"] == []
    assert published["registered_model"] == registered
    # evaluation at every version: the registered checkpoint is the best by eval among the checkpoints
    evaluated = {v: figures[v]["eval/accuracy"] for v in committed if v in figures}
    assert evaluated, figures
    best = max(evaluated.values())
    assert registered["reason"] == "best_eval" and registered["eval_accuracy"] == best
    assert registered["checkpoint_version"] == max(v for v, a in evaluated.items() if a == best)
    assert choose_checkpoint(committed, figures).version == registered["checkpoint_version"]
    assert registered["name"] == f"{cfg.tracking.experiment}-{cfg.name}"
    assert f"registered model {registered['model_uri']}: checkpoint {registered['checkpoint_version']}" in stdout

    uri = f"sqlite:///{run_dir.parent / 'mlflow.db'}"
    client = mlflow.MlflowClient(tracking_uri=uri, registry_uri=uri)
    run = mlflow_run(run_dir.parent, SMOKE_RUN_ID, cfg.tracking.experiment)
    steps = {o.model_id: o.step for o in run.outputs.model_outputs}
    models = client.search_logged_models([run.info.experiment_id],
                                         filter_string=f"source_run_id='{run.info.run_id}'")
    assert sorted((m.name, steps[m.model_id]) for m in models) == [(f"checkpoint-{v}", v) for v in committed]
    for m in models:
        v = int(m.params["checkpoint_version"])
        assert str(m.status) == "READY" and m.tags["asyncrl.checkpoint_version"] == str(v)
        if v in figures:
            assert float(m.params["eval/accuracy"]) == figures[v]["eval/accuracy"]
    version = client.get_model_version(registered["name"], registered["version"])
    assert version.run_id == run.info.run_id and version.source == registered["source"]

    # the registered version loads with transformers; its logits are those of the checkpoint's weights
    monkeypatch.setenv("MLFLOW_REGISTRY_URI", uri)  # models:/<name>/<version> resolves through the registry
    folder = mlflow.artifacts.download_artifacts(registered["model_uri"], dst_path=str(tmp_path / "model"),
                                                 tracking_uri=uri)
    loaded = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    reference = AutoModelForCausalLM.from_pretrained(start_folder, dtype=torch.float32).eval()
    missing, unexpected = reference.load_state_dict(weights, strict=False)
    assert unexpected == [] and set(missing) <= {"lm_head.weight"}  # tied to the embeddings
    ids = torch.tensor([[3, 7, 11, 5, 9]])
    with torch.no_grad():
        assert not torch.equal(loaded(ids).logits, AutoModelForCausalLM.from_pretrained(
            start_folder, dtype=torch.float32).eval()(ids).logits)  # trained: not the start weights
        assert torch.equal(loaded(ids).logits, reference(ids).logits)


def test_no_process_left(finished_run):
    run_dir, _ = finished_run
    leftovers = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        cmd = " ".join(p.info["cmdline"] or [])
        try:
            env = p.environ()  # every child of the run has the run folder in its environment (VLLM_RPC_BASE_PATH)
        except (psutil.Error, OSError):
            env = {}
        if str(run_dir) in cmd or "smoke-test" in cmd or any(str(run_dir) in v for v in env.values()):
            leftovers.append((p.info["pid"], cmd))
    assert leftovers == []
