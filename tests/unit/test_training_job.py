"""The multi-node training job objects (asyncrl/cluster/training_job.py), the launcher's decisions
(asyncrl/cluster/training_launcher.py), setup's training.num_processes = nodes x GPUs, and the pipeline's
training branches (one node: torchrun in the pod; several: the launcher task)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from kubernetes.client.rest import ApiException

from asyncrl.cluster.pipeline import definition
from asyncrl.cluster.pipeline_cli import DEFAULT_YAML
from asyncrl.cluster.rehearsal import resolve_parameters, task_commands
from asyncrl.cluster.setup import training_processes
from asyncrl.cluster.training_job import (
    Owner,
    TrainingJobSpec,
    build,
    engine_args,
    expand_env_refs,
    pytorch_job,
    role_env,
    train_job,
)
from asyncrl.cluster.training_launcher import (
    Launcher,
    LaunchError,
    choose_engine,
    dropped_fields,
    job_name,
    job_state,
)

ROOT = Path(__file__).resolve().parents[2]
RUN = "s3://asyncrl/runs/run-1"
SPEC = TrainingJobSpec(name="asyncrl-training-0123456789ab", namespace="asyncrl", image="reg/asyncrl-training:abc",
                       nodes=3, gpus_per_node=8, run_url=RUN, owner=Owner("asyncrl-xyz-system-container-impl-1",
                                                                          "0123-4567-89ab"))


def _containers(obj: dict) -> list[dict]:
    if obj["kind"] == "PyTorchJob":
        return [r["template"]["spec"]["containers"][0] for r in obj["spec"]["pytorchReplicaSpecs"].values()]
    return [obj["spec"]["trainer"]]


@pytest.mark.parametrize("engine", ["trainjob", "pytorchjob"])
def test_every_pod_runs_the_training_role_under_a_multi_node_torchrun(engine: str) -> None:
    obj = build(SPEC, engine)
    for c in _containers(obj):
        assert c["image"] == SPEC.image and c["command"] == ["asyncrl-task", "torch.distributed.run"]
        args = c["args"]
        pairs = dict(zip(args[:-1], args[1:], strict=True))
        assert pairs["--nnodes"] == "3" and pairs["--nproc-per-node"] == "8"
        assert args[args.index("-m") + 1:] == ["asyncrl.roles.training", "--run-url", RUN, "--id", "0", "--host",
                                               "0.0.0.0"]
        assert "--standalone" not in args
    # each engine's own rendezvous variables, expanded per pod by the kubelet
    variables = {"trainjob": ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
                 "pytorchjob": ("RANK", "MASTER_ADDR", "MASTER_PORT")}[engine]
    args = engine_args(SPEC, engine)
    assert [args[args.index(f) + 1] for f in ("--node-rank", "--master-addr", "--master-port")] == [
        f"$({v})" for v in variables]
    pod_env = dict(zip(variables, ("2", "job-master-0", "23456"), strict=True))
    expanded = [expand_env_refs(a, pod_env) for a in args]
    assert expanded[expanded.index("--node-rank") + 1] == "2"
    assert expanded[expanded.index("--master-addr") + 1] == "job-master-0"


def test_env_is_the_role_tasks_env_by_reference_only() -> None:
    env = {e["name"]: e for e in role_env()}
    assert env["AWS_ACCESS_KEY_ID"]["valueFrom"]["secretKeyRef"]["name"] == definition.S3_SECRET
    assert {k for k, e in env.items() if "secretKeyRef" in e.get("valueFrom", {})} == {
        *definition.S3_SECRET_KEYS, "ASYNCRL_ROLE_TOKEN", *definition.MLFLOW_AUTH_KEYS}
    assert env["ASYNCRL_ROLE_TOKEN"]["valueFrom"]["secretKeyRef"]["name"] == definition.ROLE_TOKEN_SECRET
    assert env["MLFLOW_TRACKING_PASSWORD"]["valueFrom"]["secretKeyRef"] == {
        "name": definition.MLFLOW_AUTH_SECRET, "key": "MLFLOW_TRACKING_PASSWORD", "optional": True}
    assert env["AWS_ENDPOINT_URL"]["valueFrom"]["configMapKeyRef"]["name"] == definition.ENDPOINTS_CONFIG_MAP
    assert env["POD_IP"]["valueFrom"]["fieldRef"]["fieldPath"] == "status.podIP"
    assert env["ASYNCRL_BIND_HOST"] == {"name": "ASYNCRL_BIND_HOST", "value": "0.0.0.0"}
    assert all("value" not in e for k, e in env.items() if k != "ASYNCRL_BIND_HOST")


def test_pytorchjob_pods_gpus_shm_labels_gang_and_owner() -> None:
    obj = pytorch_job(SPEC)
    replicas = obj["spec"]["pytorchReplicaSpecs"]
    assert replicas["Master"]["replicas"] == 1 and replicas["Worker"]["replicas"] == 2
    assert obj["spec"]["runPolicy"]["schedulingPolicy"] == {"minAvailable": 3}
    for r in replicas.values():
        pod = r["template"]["spec"]
        (c,) = pod["containers"]
        assert c["name"] == "pytorch" and c["resources"]["limits"]["nvidia.com/gpu"] == 8
        assert c["volumeMounts"] == [{"name": "dshm", "mountPath": "/dev/shm"}]
        assert pod["volumes"] == [{"name": "dshm", "emptyDir": {"medium": "Memory"}}]
        assert pod["tolerations"][0]["key"] == "nvidia.com/gpu" and pod["nodeSelector"]
        assert r["template"]["metadata"]["labels"] == {"app.kubernetes.io/part-of": "asyncrl",
                                                       "asyncrl/role": "training"}
    assert obj["metadata"]["ownerReferences"] == [{"apiVersion": "v1", "kind": "Pod", "name": SPEC.owner.name,
                                                   "uid": SPEC.owner.uid}]
    one = pytorch_job(TrainingJobSpec(**{**SPEC.__dict__, "nodes": 1}))
    assert list(one["spec"]["pytorchReplicaSpecs"]) == ["Master"]


def test_trainjob_runtime_nodes_patch_and_kueue_label() -> None:
    obj = train_job(TrainingJobSpec(**{**SPEC.__dict__, "kueue_queue": "gpu-queue"}))
    assert obj["spec"]["runtimeRef"]["name"] == "torch-distributed"
    trainer = obj["spec"]["trainer"]
    assert trainer["numNodes"] == 3 and trainer["resourcesPerNode"]["limits"]["nvidia.com/gpu"] == 8
    assert obj["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "gpu-queue"
    (patch,) = obj["spec"]["runtimePatches"]
    (node,) = patch["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]
    pod = node["template"]["spec"]["template"]
    assert node["name"] == "node" and pod["metadata"]["labels"]["asyncrl/role"] == "training"
    assert pod["spec"]["containers"] == [{"name": "node", "volumeMounts": [{"name": "dshm", "mountPath": "/dev/shm"}]}]
    assert pod["spec"]["volumes"][0]["emptyDir"] == {"medium": "Memory"}


@pytest.mark.parametrize(("field", "value", "expected"), [
    ("name", "Bad_Name", "name: expected a DNS-1035 label"), ("nodes", 0, "nodes: expected at least 1"),
    ("gpus_per_node", 0, "gpus_per_node: expected at least 1"), ("run_url", "/tmp/x", "run_url: expected s3://"),
    ("image", "", "image: expected"), ("namespace", "", "namespace: expected")])
def test_bad_spec_names_the_field(field: str, value: object, expected: str) -> None:
    with pytest.raises(ValueError, match=expected):
        pytorch_job(TrainingJobSpec(**{**SPEC.__dict__, field: value}))
    with pytest.raises(ValueError, match="engine: expected one of"):
        build(SPEC, "mpijob")


def test_expand_env_refs_is_kubernetes_expansion() -> None:
    env = {"A": "1", "B": "two"}
    assert expand_env_refs("$(A)-$(B)", env) == "1-two"
    assert expand_env_refs("$(C)", env) == "$(C)"  # undefined: left as written
    assert expand_env_refs("$$(A)", env) == "$(A)"  # escaped


def test_job_state_from_conditions() -> None:
    def obj(*conds: tuple[str, str]) -> dict:
        return {"status": {"conditions": [{"type": t, "status": s, "reason": "r", "message": "m"} for t, s in conds]}}

    assert not job_state({}, "pytorchjob").done
    assert not job_state(obj(("Created", "True"), ("Running", "True")), "pytorchjob").done
    assert job_state(obj(("Running", "False"), ("Succeeded", "True")), "pytorchjob").succeeded
    failed = job_state(obj(("Failed", "True")), "trainjob")
    assert failed.done and not failed.succeeded and "Failed (r): m" in failed.summary
    assert job_state(obj(("Complete", "True")), "trainjob").succeeded
    assert not job_state(obj(("Complete", "False")), "trainjob").done


def test_engine_choice_and_job_name() -> None:
    assert choose_engine("auto", ["trainjob", "pytorchjob"]) == "trainjob"
    assert choose_engine("auto", ["pytorchjob"]) == "pytorchjob"
    with pytest.raises(LaunchError, match="serves neither"):
        choose_engine("auto", [])
    with pytest.raises(LaunchError, match="--engine trainjob: the cluster does not serve"):
        choose_engine("trainjob", ["pytorchjob"])
    assert job_name("6f1c2d3e-4a5b-6c7d-8e9f-000011112222") == "asyncrl-training-6f1c2d3e4a5b"
    with pytest.raises(LaunchError, match="ASYNCRL_POD_UID"):
        job_name("")


def test_launcher_without_its_pod_identity_fails_clearly() -> None:
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cluster.training_launcher", "--nodes", "2",
                           "--gpus-per-node", "1", "--image", "i", "--run-url", RUN, "--namespace", "asyncrl"],
                          cwd=ROOT, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert proc.returncode == 2 and "ASYNCRL_POD_NAME: expected the launcher pod's name" in proc.stderr
    outside = subprocess.run(proc.args, cwd=ROOT, capture_output=True, text=True, timeout=120,
                             env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT), "ASYNCRL_POD_NAME": "p",
                                  "ASYNCRL_POD_UID": "6f1c2d3e-4a5b-6c7d-8e9f-000011112222"})
    assert outside.returncode == 2 and "expected to run in a Kubernetes pod" in outside.stderr, outside.stderr


def test_setup_sets_num_processes_to_nodes_times_gpus() -> None:
    assert training_processes(3, 8) == 24
    assert training_processes(1, 0) is None and training_processes(1, None) is None
    with pytest.raises(SystemExit, match="--training-nodes: expected at least 1"):
        training_processes(0, 8)
    with pytest.raises(SystemExit, match="needs --training-processes"):
        training_processes(2, 0)


def test_pipeline_runs_the_launcher_when_training_nodes_is_above_one() -> None:
    pipeline, platform = list(yaml.safe_load_all(DEFAULT_YAML.read_text()))
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert params["training_nodes"]["defaultValue"] == 1
    launcher = pipeline["deploymentSpec"]["executors"]["exec-training-job-launcher"]["container"]
    assert launcher["command"] == ["asyncrl-task", "asyncrl.cluster.training_launcher"]
    assert launcher["image"] == "{{$.inputs.parameters['pipelinechannel--light_image']}}"
    setup_args = pipeline["deploymentSpec"]["executors"]["exec-setup"]["container"]["args"]
    assert setup_args[setup_args.index("--training-nodes") + 1] == "{{$.inputs.parameters['training_nodes']}}"
    k8s = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]["exec-training-job-launcher"]
    assert {"name": "ASYNCRL_POD_UID", "fieldPath": "metadata.uid"} in k8s["fieldPathAsEnv"]
    assert {"name": "ASYNCRL_POD_NAME", "fieldPath": "metadata.name"} in k8s["fieldPathAsEnv"]
    assert "secretAsEnv" not in k8s and k8s["podMetadata"]["labels"]["app.kubernetes.io/part-of"] == "asyncrl"
    branches = pipeline["components"]["comp-condition-branches-3"]["dag"]["tasks"]
    conditions = sorted(" ".join(t["triggerPolicy"]["condition"].split()) for t in branches.values())
    one = "int(inputs.parameter_values['pipelinechannel--training_nodes']) == 1"
    assert conditions == [f"!({one})", one]


@pytest.mark.parametrize("nodes", [1, 2])
def test_rehearsal_takes_the_branch_training_nodes_selects(nodes: int) -> None:
    spec, platform = list(yaml.safe_load_all(DEFAULT_YAML.read_text()))
    params = resolve_parameters(spec, {"training_nodes": nodes, "training_gpus": 4})
    secrets = {"asyncrl-s3": {"AWS_ACCESS_KEY_ID": "a", "AWS_SECRET_ACCESS_KEY": "b"},
               "asyncrl-role-token": {"ASYNCRL_ROLE_TOKEN": "t"}}
    tasks = task_commands(spec, platform, params, "run-1", secrets=secrets,
                          config_maps={"asyncrl-endpoints": {"AWS_ENDPOINT_URL": "http://s3"}},
                          outputs={"exit-handler-1/setup": {"run_id": "run-1"}})
    argv = {t.executor: t.argv for t in tasks}
    if nodes == 1:
        assert "exec-training-job-launcher" not in argv
        assert argv["exec-training-role"][:3] == ["asyncrl-task", "torch.distributed.run", "--standalone"]
        return
    assert "exec-training-role" not in argv
    launcher = argv["exec-training-job-launcher"]
    assert launcher[:2] == ["asyncrl-task", "asyncrl.cluster.training_launcher"]
    pairs = dict(zip(launcher[2:-1], launcher[3:], strict=False))
    assert pairs["--nodes"] == "2" and pairs["--gpus-per-node"] == "4" and pairs["--run-url"] == "s3://asyncrl/runs/run-1"
    env = next(t.env for t in tasks if t.executor == "exec-training-job-launcher")
    assert env["ASYNCRL_POD_NAME"] and len(env["ASYNCRL_POD_UID"]) == 36 and "AWS_SECRET_ACCESS_KEY" not in env


def test_fields_the_api_server_dropped_are_found() -> None:
    sent = {"a": 1, "b": {"c": [{"d": 1}, {"e": 2}]}, "f": [1]}
    assert dropped_fields(sent, {**sent, "x": "default"}, "spec") == []
    assert dropped_fields(sent, {"a": 1, "b": {"c": [{"d": 1}, {}]}, "f": [1]}, "spec") == ["spec.b.c[1].e"]
    assert dropped_fields(sent, {"b": {}}, "spec") == ["spec.a", "spec.b.c", "spec.f"]


class _FaultyApi:
    """Injected faults: the Kubernetes API answers with `errors` (one per call), then with `then`."""

    def __init__(self, errors: list[Exception], then: dict | None = None) -> None:
        self.errors, self.then = errors, then

    def get_namespaced_custom_object(self, *args: object, **kwargs: object) -> dict:
        if self.errors:
            raise self.errors.pop(0)
        if self.then is None:
            raise ConnectionError("unreachable")
        return self.then


def _launcher(api: _FaultyApi, grace_s: float = 60.0) -> Launcher:
    return Launcher(api, "pytorchjob", "asyncrl", "asyncrl-training-0123456789ab", poll_s=0.01, api_grace_s=grace_s)


def test_wait_rides_out_api_errors_then_reads_the_end() -> None:
    failed = {"status": {"conditions": [{"type": "Failed", "status": "True", "reason": "PodFailed", "message": "x"}]}}
    state = _launcher(_FaultyApi([ConnectionError("blip"), TimeoutError("slow")], failed)).wait(30)
    assert state.done and not state.succeeded and "Failed (PodFailed): x" in state.summary


def test_wait_gives_up_on_an_unreachable_api_and_on_its_deadline() -> None:
    with pytest.raises(LaunchError, match="did not answer for 0 s"):
        _launcher(_FaultyApi([]), grace_s=0.05).wait(30)
    running = {"status": {"conditions": [{"type": "Running", "status": "True"}]}}
    with pytest.raises(LaunchError, match="not finished after --timeout-s 0"):
        _launcher(_FaultyApi([], running)).wait(0.05)
    gone = ApiException(status=404, reason="Not Found")
    with pytest.raises(LaunchError, match="deleted by someone else"):
        _launcher(_FaultyApi([gone])).wait(30)
