"""The pipeline in real containers (marker `containers`; `make test-containers` builds the images and runs it):
the compiled pipeline's tasks as containers of the CPU images, S3 and MLflow in containers too. The training
role's container is killed without grace once checkpoint 1 is committed (a lost node); every other role stops by
itself, the exit task records the failure, and a second rehearsal resumes the run on the same S3 data and trains it
to its last step. Needs root and the images `asyncrl-{generation,training,light}:$ASYNCRL_CONTAINER_TAG`; skipped
without that variable (the rest of the suite never needs a container runtime)."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from asyncrl.cluster.container_rehearsal import main

pytestmark = pytest.mark.containers
TAG = os.environ.get("ASYNCRL_CONTAINER_TAG", "")
STEPS = 4


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    if not TAG:
        pytest.skip("ASYNCRL_CONTAINER_TAG is not set: `make test-containers` builds the images and sets it")
    docker = os.environ.get("DOCKER", "docker")
    if shutil.which(docker) is None:
        pytest.skip(f"no container client {docker!r}")
    work = tmp_path_factory.mktemp("containers")
    out = work / "report.json"
    code = main(["--docker", docker, "--tag", TAG, "--workdir", str(work / "rehearsal"), "--steps", str(STEPS),
                 "--kill-role", "training", "--timeout", "900", "--out", str(out)])
    assert code == 0
    return json.loads(out.read_text())


def test_the_killed_run_stopped_every_role_and_recorded_the_failure(report) -> None:
    first = report["first"]
    assert first["lost_s"] is not None
    assert set(first["exit_codes"]) == {"setup", "training", "generation-0", "environment-env0", "reward", "finalize"}
    assert first["exit_codes"]["setup"] == 0 and first["exit_codes"]["finalize"] == 0
    assert first["inspection"]["done"] is True  # finalize marks the run done, as failed
    assert first["inspection"]["final"]["status"] == "FAILED"
    assert first["inspection"]["latest"]["version"] >= 1


def test_the_resumed_run_trained_to_its_last_step_in_containers(report) -> None:
    resumed = report["resumed"]
    assert all(code == 0 for code in resumed["exit_codes"].values()), resumed["exit_codes"]
    assert resumed["run_id"] == report["first"]["run_id"]
    assert resumed["inspection"]["latest"]["version"] == STEPS
    assert resumed["inspection"]["final"]["status"] == "SUCCEEDED"
