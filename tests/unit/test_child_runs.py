"""One parent MLflow run per job, one child run per role instance (asyncrl.tracking.child_runs), on a real MLflow
sqlite store and the session's real S3 server: children made once and reused by a restarted trainer, found again
when their record was lost, figures routed to their own run (spooled ones too), ended with the parent's status
wherever it ends and reopened on resume; `asyncrl compare` leaves them out unless asked; a KFP task's run id leads
to KFP's run of the pipeline run."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
from mlflow import MlflowClient
from mlflow.exceptions import MlflowException

from asyncrl.compare.fetch import load_history, select_runs
from asyncrl.roles.role_metrics import instance_figures
from asyncrl.roles.step_reporter import Figures, StepReporter
from asyncrl.run.create import KFP_TASK_RUN_TAG, kfp_pipeline_run
from asyncrl.run.finalize import finish_tracking
from asyncrl.run.stop import end_tracking_killed
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.child_runs import (
    CHILD_TAG,
    PARENT_TAG,
    ChildRuns,
    child_runs,
    end_children,
    reopen_children,
)
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.tracking.spool import MetricSpool
from asyncrl.tracking.spooling_log import SpoolingLog, replay_run_spool

DOWN = MlflowException("API request to http://mlflow/api/2.0/mlflow/runs/log-batch failed: connection refused")


@pytest.fixture(autouse=True)
def _restore_mlflow_env(monkeypatch: pytest.MonkeyPatch) -> None:
    """Trackers bound the MLflow client's requests through the environment: restored after each test."""
    for name in ("MLFLOW_HTTP_REQUEST_MAX_RETRIES", "MLFLOW_HTTP_REQUEST_TIMEOUT"):
        monkeypatch.delenv(name, raising=False)


def _job(s3_store: S3Store, tmp_path: Path) -> tuple[Tracker, RunPaths]:
    """A job's MLflow run in a sqlite store and its tracking.json in S3, as `asyncrl.run.create` leaves them."""
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    paths = RunPaths("runs", f"job-{uuid.uuid4().hex[:8]}")
    tracker = Tracker.create(uri, "children-test", paths.run_id)
    s3_store.put_json(paths.tracking(), {"tracking_uri": uri, "mlflow_run_id": tracker.run_id})
    return tracker, paths


def _history(tracker: Tracker, run_id: str, name: str) -> list[tuple[int, float]]:
    return sorted((m.step, m.value) for m in tracker.client.get_metric_history(run_id, name))


def test_a_child_is_made_once_recorded_and_reused_by_a_restarted_trainer(s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    first = ChildRuns(tracker, s3_store, paths)
    gen = first.run_id("generation-0")
    assert first.run_id("generation-0") == gen
    run = tracker.client.get_run(gen)
    assert run.info.run_name == "generation-0" and run.info.status == "RUNNING"
    assert run.info.experiment_id == tracker.client.get_run(tracker.run_id).info.experiment_id
    assert {k: run.data.tags[k] for k in (PARENT_TAG, CHILD_TAG, "asyncrl.role", "asyncrl.role_id",
                                          "asyncrl.run_id")} == {
        PARENT_TAG: tracker.run_id, CHILD_TAG: "generation-0", "asyncrl.role": "generation", "asyncrl.role_id": "0",
        "asyncrl.run_id": paths.run_id}
    doc = s3_store.get_json(paths.tracking())
    assert doc["children"] == {"generation-0": gen} and doc["mlflow_run_id"] == tracker.run_id  # the rest kept
    restarted = ChildRuns(Tracker.for_run(tracker.tracking_uri, tracker.run_id), s3_store, paths)
    assert restarted.run_id("generation-0") == gen
    assert restarted.run_id("environment-env0") != gen
    assert sorted(r.data.tags[CHILD_TAG] for r in child_runs(tracker.client, tracker.run_id)) == [
        "environment-env0", "generation-0"]  # no duplicate
    with pytest.raises(ValueError, match=r"child run key: expected <role>-<id>.*\"reward-0' or 'x\""):
        restarted.run_id("reward-0' or 'x")


def test_a_child_made_by_an_attempt_that_died_before_recording_it_is_found_again(
        s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    gen = ChildRuns(tracker, s3_store, paths).run_id("generation-0")
    s3_store.put_json(paths.tracking(), {"tracking_uri": tracker.tracking_uri, "mlflow_run_id": tracker.run_id})
    assert ChildRuns(tracker, s3_store, paths).run_id("generation-0") == gen  # MLflow's search finds it
    assert s3_store.get_json(paths.tracking())["children"] == {"generation-0": gen}  # and it is recorded again
    assert len(child_runs(tracker.client, tracker.run_id)) == 1


def test_the_reporter_logs_each_instance_figures_in_its_child_at_the_step_they_were_read_at(
        s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    beats = [{"role": "generation", "id": "0", "metrics": {"busy_s": 1.5}, "system": {"cpu_cores": 0.5}},
             {"role": "training", "id": "0", "metrics": {"step": 2},
              "system": {"cpu_utilization_percentage": 55.0, "system_memory_usage_megabytes": 900.0}}]
    children = ChildRuns(tracker, s3_store, paths)
    log = SpoolingLog(children.send, MetricSpool(s3_store, paths), deadline_s=30.0)
    reporter = StepReporter(lambda: Figures(job={"rollout/admitted_groups": 4.0}, children=instance_figures(beats)),
                            log.log_runs)
    for step in (1, 2):
        reporter.submit({"train/loss": 1.0 / step}, step, fresh=True)
        assert reporter.flush(30.0)
    reporter.close()
    assert reporter.failures == 0
    assert _history(tracker, tracker.run_id, "train/loss") == [(1, 1.0), (2, 0.5)]
    assert _history(tracker, tracker.run_id, "rollout/admitted_groups") == [(1, 4.0), (2, 4.0)]
    job_metrics = tracker.client.get_run(tracker.run_id).data.metrics
    assert not any(k.startswith(("generation/", "system/")) for k in job_metrics), job_metrics  # none in the job's
    gen, trainer = children.run_id("generation-0"), children.run_id("training-0")
    assert _history(tracker, gen, "generation/busy_s") == [(1, 1.5), (2, 1.5)]
    assert _history(tracker, gen, "system/cpu_cores") == [(1, 0.5), (2, 0.5)]
    assert set(tracker.client.get_run(trainer).data.metrics) == {"system/cpu_utilization_percentage",
                                                                  "system/system_memory_usage_megabytes"}


def test_spooled_figures_name_their_child_and_a_replay_sends_them_there(s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    spool = MetricSpool(s3_store, paths)
    down = SpoolingLog(lambda run, steps: (_ for _ in ()).throw(DOWN.with_traceback(None)), spool, deadline_s=0.01)
    down.log_runs([("", [({"train/loss": 0.5}, 3, 1_003)]), ("reward-0", [({"reward/scored": 16.0}, 3, 1_003)])])
    entries = spool.keys()
    assert [s3_store.get_json(k)["run"] for k in entries] == ["", "reward-0"]  # one entry per run, in order
    assert child_runs(tracker.client, tracker.run_id) == []  # MLflow was down: no child made yet
    tracking = s3_store.get_json(paths.tracking())
    assert replay_run_spool(s3_store, paths, tracking, 30.0) == {"replayed": 2, "left": 0, "failures": 0}
    reward = s3_store.get_json(paths.tracking())["children"]["reward-0"]
    assert _history(tracker, tracker.run_id, "train/loss") == [(3, 0.5)]
    assert _history(tracker, reward, "reward/scored") == [(3, 16.0)]
    assert "reward/scored" not in tracker.client.get_run(tracker.run_id).data.metrics


def test_children_end_with_the_parent_wherever_it_ends_and_reopen_on_resume(
        s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    children = ChildRuns(tracker, s3_store, paths)
    keys = ["generation-0", "reward-0", "training-0"]
    ids = [children.run_id(k) for k in keys]
    experiment = tracker.client.get_run(tracker.run_id).info.experiment_id
    kfp_task = tracker.client.create_run(experiment, run_name="generation-task", tags={PARENT_TAG: tracker.run_id})

    def statuses() -> list[str]:
        return [tracker.client.get_run(i).info.status for i in [tracker.run_id, *ids]]

    finish_tracking(tracker, succeeded=False)  # the embedded launcher's end
    assert statuses() == ["FAILED"] * 4
    tracker.client.update_run(tracker.run_id, status="RUNNING")
    assert sorted(reopen_children(tracker.client, tracker.run_id)) == keys  # a resume
    assert statuses() == ["RUNNING"] * 4
    assert end_tracking_killed(s3_store, paths) == tracker.run_id  # the cancel path
    assert statuses() == ["KILLED"] * 4
    assert end_children(tracker.client, tracker.run_id, "FINISHED") == keys  # finalize's, after the parent's
    assert tracker.client.get_run(kfp_task.info.run_id).info.status == "RUNNING"  # a run others nested: not ours


def test_compare_leaves_children_out_unless_asked_and_names_them_by_their_job(
        s3_store: S3Store, tmp_path: Path) -> None:
    tracker, paths = _job(s3_store, tmp_path)
    ChildRuns(tracker, s3_store, paths).run_id("generation-0")
    client = MlflowClient(tracking_uri=tracker.tracking_uri)
    assert [r.info.run_id for r in select_runs(client, "children-test")] == [tracker.run_id]
    both = select_runs(client, "children-test", children=True)
    assert sorted(load_history(client, r, []).name for r in both) == sorted([paths.run_id,
                                                                             f"{paths.run_id}/generation-0"])
    only = select_runs(client, "children-test", filter_string="tags.`asyncrl.role` = 'generation'", children=True)
    assert [r.data.tags[CHILD_TAG] for r in only] == ["generation-0"]


def test_a_kfp_task_run_leads_to_kfp_run_of_the_pipeline_run(s3_store: S3Store, tmp_path: Path) -> None:
    from asyncrl.config import load_config
    from asyncrl.run.create import open_tracking

    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    client = MlflowClient(tracking_uri=uri)
    experiment = client.create_experiment("Default-kfp")
    pipeline = client.create_run(experiment, run_name="kfp-pipeline-run").info.run_id  # made by KFP's API server
    dag = client.create_run(experiment, run_name="exit-handler-1", tags={PARENT_TAG: pipeline}).info.run_id
    setup = client.create_run(experiment, run_name="setup", tags={PARENT_TAG: dag}).info.run_id  # MLFLOW_RUN_ID
    assert kfp_pipeline_run(client, setup) == pipeline and kfp_pipeline_run(client, pipeline) == pipeline
    cfg = load_config(Path(__file__).resolve().parents[2] / "configs/smoke.yaml", [f"run_id=kfp-{uuid.uuid4().hex[:6]}"])
    paths = RunPaths(cfg.storage.prefix, cfg.run_id)
    tracker = open_tracking(s3_store, paths, cfg, uri, "cluster", join_run_id=setup)
    assert tracker is not None and tracker.run_id == pipeline
    assert s3_store.get_json(paths.tracking())["mlflow_run_id"] == pipeline
    run = client.get_run(pipeline)
    assert run.data.tags[KFP_TASK_RUN_TAG] == setup and run.data.params["rollout.async_ratio"]
    assert ChildRuns(tracker, s3_store, paths).run_id("generation-0") != setup  # children nest under the job's run
