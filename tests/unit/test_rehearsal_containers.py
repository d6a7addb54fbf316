"""The container rehearsal's pure parts: a task's `docker run` line (its image, the container command as the
entrypoint, args after it, the env from a private file and never the command line, the pod's mounts), and which
modules each compiled task starts in which image (asyncrl.cluster.image_check). No Docker daemon is needed."""

from __future__ import annotations

import stat
import sys
from pathlib import Path

import pytest

from asyncrl.cluster.image_check import image_refs, modules_of, tasks_by_image
from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.rehearsal import RehearsalTask
from asyncrl.cluster.rehearsal_containers import LABEL, ContainerError, Containers


def task(env: dict[str, str] | None = None) -> RehearsalTask:
    return RehearsalTask(key="exit-handler-1/role", name="reward", executor="exec-role-2",
                         command=("asyncrl-task", "asyncrl.roles.reward"), args=("--run-url", "s3://b/p/r", "--id", "0"),
                         env=env if env is not None else {"AWS_SECRET_ACCESS_KEY": "s3cr3t-value", "POD_IP": "127.0.0.1"},
                         image="asyncrl-light:t-cpu", inputs={})


def test_docker_run_line_of_a_task(tmp_path) -> None:
    c = Containers(docker=sys.executable, mounts={str(tmp_path / "cache"): "/cache"}, prefix="asyncrl-rh-x")
    try:
        argv = c.argv(task())
        assert argv[:2] == [sys.executable, "run"]
        assert argv[argv.index("--name") + 1] == "asyncrl-rh-x-reward"
        assert argv[argv.index("--label") + 1] == f"{LABEL}=asyncrl-rh-x"
        assert argv[argv.index("--network") + 1] == "host"
        assert argv[argv.index("-v") + 1] == f"{tmp_path / 'cache'}:/cache"
        cut = argv.index("--entrypoint")
        assert argv[cut + 1:] == ["asyncrl-task", "asyncrl-light:t-cpu", "asyncrl.roles.reward", "--run-url",
                                  "s3://b/p/r", "--id", "0"]
        assert not any("s3cr3t-value" in a for a in argv)  # the secret is in the env file only
        env_file = Path(argv[argv.index("--env-file") + 1])
        assert stat.S_IMODE(env_file.stat().st_mode) == 0o600
        assert env_file.read_text().splitlines() == ["AWS_SECRET_ACCESS_KEY=s3cr3t-value", "POD_IP=127.0.0.1"]
    finally:
        c.remove_all()


def test_an_env_value_with_a_newline_is_refused_naming_it() -> None:
    c = Containers(docker=sys.executable)
    try:
        with pytest.raises(ContainerError, match="task reward: env CONFIG holds a newline"):
            c.argv(task({"CONFIG": "a: 1\nb: 2"}))
    finally:
        c.remove_all()


def test_a_missing_client_is_a_clear_error() -> None:
    with pytest.raises(ContainerError, match="'asyncrl-no-such-docker' is not on PATH"):
        Containers(docker="asyncrl-no-such-docker")


def test_modules_of_task_commands() -> None:
    assert modules_of(["asyncrl-task", "asyncrl.cluster.setup", "--bucket", "b"]) == ["asyncrl.cluster.setup"]
    assert modules_of(["asyncrl-task", "torch.distributed.run", "--standalone", "-m", "asyncrl.roles.training",
                       "--id", "0"]) == ["torch.distributed.run", "asyncrl.roles.training"]
    assert modules_of(["sh", "-ec", "python3 -m kfp.dsl.executor_main --component_module_path x"]) == [
        "kfp.dsl.executor_main"]
    with pytest.raises(ValueError, match="unrecognised task command"):
        modules_of(["python3", "-c", "print(1)"])


def test_every_task_of_the_committed_pipeline_has_its_image_and_modules() -> None:
    by_image = tasks_by_image(COMPILED, image_refs("reg.example/team", "t1"))
    assert set(by_image) == {"reg.example/team/asyncrl-generation:t1", "reg.example/team/asyncrl-training:t1",
                             "reg.example/team/asyncrl-light:t1"}
    flat = {name: mods for tasks in by_image.values() for name, mods in tasks}
    assert flat["training"] == ["torch.distributed.run", "asyncrl.roles.training"]
    assert flat["generation-0"] == ["asyncrl.roles.generation"]
    assert flat["setup"] == ["asyncrl.cluster.setup"] and flat["finalize"] == ["kfp.dsl.executor_main"]
    assert {name for name, _ in by_image["reg.example/team/asyncrl-light:t1"]} == {
        "environment-env0", "reward", "setup", "finalize"}


def test_pod_volumes_from_the_platform_spec(tmp_path) -> None:
    executors = {"exec-role": {"emptyDirMounts": [{"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "16Gi"}],
                               "genericEphemeralVolume": [{"mountPath": "/cache", "volumeName": "cache"}]},
                 "exec-odd": {"pvcMount": [{"mountPath": "/data"}]}}
    c = Containers(docker=sys.executable, volumes={"/cache": str(tmp_path / "cache")}, executors=executors)
    try:
        gen = RehearsalTask(key="g", name="generation-0", executor="exec-role", command=("asyncrl-task", "m"),
                            args=(), env={}, image="i", inputs={})
        assert c.pod_volumes(gen) == ["--shm-size", str(16 * 2**30), "-v", f"{tmp_path / 'cache'}:/cache"]
        assert c.pod_volumes(task()) == []  # an executor without volumes
        odd = RehearsalTask(key="o", name="odd", executor="exec-odd", command=("x",), args=(), env={}, image="i",
                            inputs={})
        with pytest.raises(ContainerError, match="task odd: its pod mounts /data, which the rehearsal has no folder"):
            c.pod_volumes(odd)
    finally:
        c.remove_all()
