"""A run terminated from the Kubeflow UI, rehearsed locally: the committed pipeline's tasks run as local processes
(asyncrl.cluster.rehearsal_runner) with the built-in tiny model and a real local MLflow store; once training has
committed a checkpoint, every running task gets SIGTERM as Kubernetes would stop its pod (torchrun forwards it to
the training rank). One rehearsal checks both ends a cancel can have:
- the exit task never runs (Argo cut it short): what the stopped roles left is checked before it would have run;
  the trainer ended the MLflow run as KILLED itself and recorded the stop in `stopped.json`;
- the exit task runs with the state KFP gives a cancelled run ("CANCELED"): `final_status.json` says cancelled and
  the MLflow run is KILLED.
Either way every role exits within its grace period, every checkpoint and group object committed before the cancel
is still there, and the run can be resumed (asyncrl.run.resume, on the same S3 data)."""

from pathlib import Path

import mlflow
import psutil
import pytest

from asyncrl.cluster.pipeline_cli import DEFAULT_YAML
from asyncrl.cluster.rehearsal_runner import rehearse
from asyncrl.config import config_from_json
from asyncrl.run.resume import check_not_finished, resume_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
ROLES = ["environment-env0", "generation-0", "reward", "training"]
STOP_GRACE_S = 30.0  # Kubernetes' default terminationGracePeriodSeconds


def _objects(store, paths) -> dict[str, list[str]]:
    return {"committed": [k for k in store.list_keys(paths.checkpoints_root()) if k.endswith("/COMMITTED")],
            "checkpoint_files": store.list_keys(paths.checkpoints_root()),
            "groups": store.list_keys(paths.groups_prefix())}


def _mlflow_status(db: Path, store, paths) -> str:
    tracking = store.get_json(paths.tracking())
    return mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}").get_run(tracking["mlflow_run_id"]).info.status


@pytest.fixture(scope="module")
def cancelled(tmp_path_factory):
    work = tmp_path_factory.mktemp("cancel")
    db = work / "mlflow.db"
    params = {
        # far more steps than the test lets it make: the run is cancelled once checkpoint 1 is committed
        "steps": 200, "prompts_per_step": 4, "samples_per_prompt": 4, "mlflow_uri": f"sqlite:///{db}",
        "mlflow_experiment": "rehearsal", "s3_bucket": "rehearsal", "model_path": "",
        "generation_replica_ids": ["0"], "training_gpus": 1,
        "overrides": [f"cache_dir={ROOT / '.cache' / 'asyncrl'}", "generation.max_model_len=32",
                      "training.micro_batch_size=16", "training.checkpoint_every=1"],
    }

    def committed_one(store, paths):
        return store.exists(paths.checkpoint_committed(1))

    def before_exit_task(store, paths):  # all a run keeps when Argo never runs the exit task
        return {**_objects(store, paths), "mlflow": _mlflow_status(db, store, paths),
                "stopped": store.get_json(paths.file("stopped.json")), "done": store.exists(paths.done()),
                "final": store.get_json(paths.file("final_status.json")),
                "trainer": store.get_json(paths.heartbeat("training", "0"))}

    def after_exit_task(store, paths):
        out = {**_objects(store, paths), "mlflow": _mlflow_status(db, store, paths),
               "final": store.get_json(paths.file("final_status.json")), "done": store.get_json(paths.done()),
               "resumable": check_not_finished(store, paths, paths.run_id) is not None}
        cfg = config_from_json(store.get_bytes(paths.config()).decode(), paths.config())
        resumed = resume_run(store, paths, cfg, asked_as="resume_run_id", missing_hint="", attempt="kfp-resume")
        out.update(resumed_from=resumed.point.version, previous_stop=resumed.record["previous_stop"],
                   stopped_after_resume=store.exists(paths.file("stopped.json")),
                   latest_after_resume=store.get_json(paths.versions_latest()),
                   committed_after_resume=_objects(store, paths)["committed"])
        return out

    result = rehearse(DEFAULT_YAML, params, workdir=work / "run", timeout_s=1500, exit_grace_s=90,
                      cancel_when=committed_one, cancel_state="CANCELED", stop_grace_s=STOP_GRACE_S,
                      inspect_cancel=before_exit_task, inspect=after_exit_task)
    return result, db


def test_every_role_got_sigterm_and_exited_within_its_grace(cancelled):
    result, _ = cancelled
    assert result.cancelled_s is not None and result.killed == []
    for role in ROLES:
        assert result.started_s[role] < result.cancelled_s
        assert result.ended_s[role] - result.cancelled_s <= STOP_GRACE_S, role
    # stopped before the run was done: 128 + SIGTERM, as Kubernetes counts a pod killed by it (not succeeded)
    assert {r: result.exit_codes[r] for r in ROLES if r != "training"} == {
        "environment-env0": 143, "generation-0": 143, "reward": 143}
    assert result.exit_codes["training"] != 0  # torchrun, stopped by the signal it forwarded
    assert result.exit_codes["finalize"] == 0 and result.started_s["finalize"] >= max(result.ended_s[r] for r in ROLES)


def test_without_the_exit_task_the_trainer_ended_the_mlflow_run_killed(cancelled):
    result, _ = cancelled
    left = result.cancel_inspection
    assert left["mlflow"] == "KILLED"
    assert left["stopped"]["signal"] == "SIGTERM" and left["stopped"]["role"] in {"training", "generation", "reward",
                                                                                    "environment"}
    assert left["trainer"]["state"] == "stopped" and "SIGTERM" in left["trainer"]["error"]
    assert left["done"] is False and left["final"] is None  # nothing pretends the run was finished


def test_the_exit_task_with_the_cancelled_state_marks_the_run_cancelled_and_killed(cancelled):
    result, _ = cancelled
    end = result.inspection
    assert end["final"]["status"] == "CANCELED" and end["final"]["outcome"] == "cancelled"
    assert end["final"]["mlflow_status"] == "KILLED" and end["mlflow"] == "KILLED"
    assert end["final"]["final_version"] >= 1 and end["done"]["by"] == "finalize"


def test_nothing_committed_before_the_cancel_is_lost(cancelled):
    result, _ = cancelled
    before, end = result.cancel_inspection, result.inspection
    assert any(k.endswith("/checkpoints/1/COMMITTED") for k in before["committed"])
    assert set(before["committed"]) <= set(end["committed"]) and before["groups"]
    assert set(before["groups"]) <= set(end["groups"])
    assert set(before["checkpoint_files"]) <= set(end["checkpoint_files"])


def test_a_cancelled_run_can_be_resumed(cancelled):
    result, _ = cancelled
    end = result.inspection
    assert end["resumable"] is True
    last = max(int(k.rstrip("/").split("/")[-2]) for k in end["committed"])
    assert end["resumed_from"] == last == end["latest_after_resume"]["version"]
    assert end["previous_stop"]["signal"] == "SIGTERM" and end["stopped_after_resume"] is False
    assert end["committed_after_resume"] == end["committed"]


def test_no_process_left(cancelled):
    result, _ = cancelled
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = p.environ()
        except (psutil.Error, OSError):
            env = {}
        if result.run_id in " ".join(p.info["cmdline"] or []) or any(str(result.workdir) in v for v in env.values()):
            left.append((p.info["pid"], p.info["cmdline"]))
    assert left == []
