"""The Kubeflow pipeline: the committed YAML is current, it parses into kfp's own protos, the roles run side by
side, every role task carries the cluster settings, no secret is in it; the pipeline commands fail clearly."""

import json
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from google.protobuf import json_format
from kfp.pipeline_spec import pipeline_spec_pb2

from asyncrl.cluster.pipeline_cli import DEFAULT_YAML, compile_pipeline
from asyncrl.cluster.setup import resolve_config, role_count_overrides

ROOT = Path(__file__).resolve().parents[2]
ROLES = ("generation", "training", "reward", "environment")
LAUNCHER_EXEC = "exec-training-job-launcher"  # the multi-node training task (training_nodes > 1)


@pytest.fixture(scope="module")
def docs():
    pipeline, platform = list(yaml.safe_load_all(DEFAULT_YAML.read_text()))
    return pipeline, platform


def test_committed_yaml_is_current(tmp_path):
    fresh = compile_pipeline(tmp_path / "asyncrl.yaml").read_text()
    assert fresh == DEFAULT_YAML.read_text(), "asyncrl/cluster/pipeline/asyncrl.yaml is stale: run `asyncrl pipeline compile`"


def test_yaml_parses_into_kfp_protos(docs):
    pipeline, platform = docs
    spec = json_format.ParseDict(pipeline, pipeline_spec_pb2.PipelineSpec())
    assert spec.pipeline_info.name == "asyncrl"
    json_format.ParseDict(platform, pipeline_spec_pb2.PlatformSpec())


def _tasks(pipeline):
    """Every task of every DAG, by task name, with its DAG."""
    out = {}
    for comp in pipeline["components"].values():
        for name, task in comp.get("dag", {}).get("tasks", {}).items():
            out[name] = task
    for name, task in pipeline["root"]["dag"]["tasks"].items():
        out[name] = task
    return out


def test_roles_depend_on_setup_only_and_finalize_is_the_exit_task(docs):
    pipeline, _ = docs
    tasks = _tasks(pipeline)
    role_tasks = {n: t for n, t in tasks.items() if n.startswith(("role", "training-role"))}
    assert len(role_tasks) == 4, sorted(tasks)
    for name, task in role_tasks.items():
        assert set(task.get("dependentTasks", [])) <= {"setup"}, (name, task.get("dependentTasks"))
        assert task["cachingOptions"] == {} or task["cachingOptions"].get("enableCache") is False
    for name, task in tasks.items():
        assert task.get("cachingOptions", {}).get("enableCache", False) is False, name
    finalize = pipeline["root"]["dag"]["tasks"]["finalize"]
    assert finalize["triggerPolicy"]["strategy"] == "ALL_UPSTREAM_TASKS_COMPLETED"
    assert "status" in finalize["inputs"]["parameters"]  # receives the pipeline's final status
    loops = [t for t in tasks.values() if "parameterIterator" in t]
    assert sorted(t["parameterIterator"]["items"]["inputParameter"] for t in loops) == [
        "pipelinechannel--environment_replica_ids", "pipelinechannel--generation_replica_ids"]


def test_every_role_task_has_the_cluster_settings(docs):
    pipeline, platform = docs
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    role_execs = [e for e in executors if e.startswith(("exec-role", "exec-training-role"))]
    assert len(role_execs) == 4 and "exec-setup" in executors and "exec-finalize" in executors
    for name, ex in executors.items():
        if name == LAUNCHER_EXEC:  # no secret: tests/unit/test_training_job.py checks its settings
            continue
        assert ex["secretAsEnv"][0]["secretName"] == "asyncrl-s3", name
        keys = {k["secretKey"] for k in ex["secretAsEnv"][0]["keyToEnv"]}
        assert keys == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"}
        assert ex["configMapAsEnv"][0]["configMapName"] == "asyncrl-endpoints", name
        assert {"name": "POD_IP", "fieldPath": "status.podIP"} in ex["fieldPathAsEnv"], name
        assert int(ex["activeDeadlineSeconds"]) > 0, name
        assert ex["podMetadata"]["labels"]["app.kubernetes.io/part-of"] == "asyncrl"
    gpu = [e for e in role_execs if "accelerator" in json.dumps(pipeline["deploymentSpec"]["executors"][e])]
    assert len(gpu) == 2  # generation and training
    for e in gpu:
        ex = executors[e]
        assert ex["emptyDirMounts"][0]["mountPath"] == "/dev/shm" and ex["emptyDirMounts"][0]["medium"] == "Memory"
        # node selector and tolerations: pipeline parameters (tests/unit/test_pipeline_pods.py)
        assert ex["tolerations"][0]["key"] == "nvidia.com/gpu" and ex["tolerations"][1]["tolerationJson"]
        assert "nodeSelectorJson" in ex["nodeSelector"]
    images = {pipeline["deploymentSpec"]["executors"][e]["container"]["image"] for e in role_execs}
    assert all(i.startswith("{{$.inputs.parameters[") for i in images)  # from the image parameters
    trainer = pipeline["deploymentSpec"]["executors"]["exec-training-role"]["container"]
    assert trainer["command"] == ["asyncrl-task", "torch.distributed.run"] and "asyncrl.roles.training" in trainer["args"]
    assert trainer["args"][trainer["args"].index("--nproc-per-node") + 1] == "{{$.inputs.parameters['processes']}}"


def test_no_secret_in_the_pipeline(docs):
    text = DEFAULT_YAML.read_text()
    params = docs[0]["root"]["inputDefinitions"]["parameters"]
    assert not [p for p in params if any(w in p.lower() for w in ("secret", "password", "token", "key"))]
    assert "AWS_SECRET_ACCESS_KEY:" not in text.replace("secretKey: AWS_SECRET_ACCESS_KEY", "")
    for word in ("aws_secret_access_key=", "password=", "BEGIN PRIVATE KEY"):
        assert word.lower() not in text.lower()


FORM_CONFIG_FIELDS = ("model_path", "env_name", "loss", "async_ratio", "steps", "prompts_per_step",
                      "samples_per_prompt", "mlflow_experiment")


def test_run_form_every_parameter_described_config_fields_left_empty(docs):
    """The KFP UI's run form: every parameter has a description (the pipeline docstring's `Args:`); the config
    fields have no default (empty: the config's value), the pod-shaping and infrastructure ones have one."""
    params = docs[0]["root"]["inputDefinitions"]["parameters"]
    assert len(params) >= 22
    for name, spec in params.items():
        assert len(spec.get("description", "")) > 15, name
    for name in FORM_CONFIG_FIELDS:
        assert params[name]["isOptional"] is True and "defaultValue" not in params[name], name
    for name in ("generation_replica_ids", "environment_replica_ids", "generation_gpus", "training_gpus",
                 "generation_image", "training_image", "light_image", "s3_bucket", "s3_prefix", "mlflow_uri",
                 "config_yaml", "overrides", "tags", "resume_run_id"):
        assert "defaultValue" in params[name], name


def test_setup_resolves_config_and_replica_counts():
    cfg = resolve_config("rollout:\n  async_ratio: 2\n", ["training.steps=7"], "run-123")
    assert cfg.run_id == "run-123" and cfg.rollout.async_ratio == 2 and cfg.training.steps == 7
    assert role_count_overrides('["0", "1"]', '["env0", "env1"]') == ["generation.num_servers=2",
                                                                      "rollout.num_writers=2"]
    with pytest.raises(SystemExit, match=r"expected replica ids \['0', '1'\]"):
        role_count_overrides('["0", "2"]', "")
    with pytest.raises(SystemExit, match="rollout.num_writers"):
        role_count_overrides("", '["a"]')


def _cli(*args, env=None):
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120, env=env)


def test_only_a_401_or_403_answer_is_a_credentials_error():
    from asyncrl.cluster.pipeline_api import ApiError, rejected_credentials

    class Answer(Exception):  # kfp's ApiException carries the HTTP status
        def __init__(self, status: int) -> None:
            super().__init__(f"({status})")
            self.status = status

    def failed(text: str, cause: BaseException | None = None) -> ApiError:
        err = ApiError(f"connect: the Kubeflow Pipelines API at http://127.0.0.1:54403 failed: {text}")
        err.__cause__ = cause
        return err

    refused = "HTTPConnectionPool(host='127.0.0.1', port=54403): Max retries exceeded (Connection refused)"
    assert not rejected_credentials(failed(refused))  # the port has "403" in it: the CI failure of 2026-12-03
    assert rejected_credentials(failed("(401)", Answer(401)))
    assert rejected_credentials(failed("(403) Reason: Forbidden"))
    assert not rejected_credentials(failed("(500) Reason: Internal Server Error", Answer(500)))


def test_upload_to_an_unreachable_host_fails_clearly():
    with socket.socket() as s:  # a free port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _cli("upload", "--host", f"http://127.0.0.1:{port}")
    assert proc.returncode == 2
    assert f"cannot reach the Kubeflow Pipelines API at http://127.0.0.1:{port}" in proc.stderr


def test_a_host_that_never_answers_fails_at_the_api_deadline():
    import time

    with socket.socket() as s:  # accepts connections (the kernel's backlog) but never reads or answers
        s.bind(("127.0.0.1", 0))
        s.listen(8)
        port = s.getsockname()[1]
        t0 = time.monotonic()
        proc = _cli("upload", "--host", f"http://127.0.0.1:{port}", "--api-timeout", "2")
        waited = time.monotonic() - t0
    assert proc.returncode == 2, proc.stderr
    assert f"connect: no answer from the Kubeflow Pipelines API at http://127.0.0.1:{port} within 2s" in proc.stderr
    assert waited < 60, waited  # without the deadline the kfp client waits forever


def test_run_refuses_unknown_parameters_and_bad_configs(tmp_path):
    proc = _cli("run", "--host", "http://127.0.0.1:9", "--param", "nope=1")
    assert proc.returncode == 2 and "--param 'nope=1': expected NAME=VALUE with NAME one of" in proc.stderr
    bad = tmp_path / "bad.yaml"
    bad.write_text("rollout:\n  async_ratio: -1\n")
    proc = _cli("run", "--host", "http://127.0.0.1:9", "--config", str(bad))
    assert proc.returncode == 2 and "async_ratio" in proc.stderr


def test_every_dag_input_a_task_reads_is_declared_by_its_dag(docs):
    """KFP's driver fails a task whose componentInputParameter its enclosing DAG does not declare ("parent DAG does
    not have input parameter"); the compiler does not catch it (e.g. a GPU limit naming a pipeline parameter inside
    a ParallelFor), so check every DAG of the compiled pipeline."""
    pipeline, _ = docs
    dags = {"root": pipeline["root"], **{n: c for n, c in pipeline["components"].items() if "dag" in c}}
    for dag_name, comp in dags.items():
        declared = set(comp.get("inputDefinitions", {}).get("parameters", {}))
        for task_name, task in comp["dag"]["tasks"].items():
            for pname, spec in task.get("inputs", {}).get("parameters", {}).items():
                source = spec.get("componentInputParameter")
                if source is not None:
                    assert source in declared, (dag_name, task_name, pname, source)


def test_roles_drive_the_run_id_setup_outputs(docs):
    """Every role reads its run id from setup's output `run_id` (directly, or through its ParallelFor DAG, which
    declares it); a resumed pipeline run therefore drives the old run. Finalize, an exit task, may not read it: it
    gets `resume_run_id` and the KFP run id."""
    pipeline, _ = docs
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert {k: v for k, v in params["resume_run_id"].items() if k != "description"} == {
        "defaultValue": "", "isOptional": True, "parameterType": "STRING"}
    assert pipeline["components"]["comp-setup"]["outputDefinitions"]["parameters"] == {
        "run_id": {"parameterType": "STRING"}}
    from_setup = {"taskOutputParameter": {"outputParameterKey": "run_id", "producerTask": "setup"}}
    handler = pipeline["components"]["comp-exit-handler-1"]["dag"]["tasks"]
    role_tasks = _tasks(pipeline)
    seen = 0
    for name, task in handler.items():
        params_in = task["inputs"]["parameters"]
        if name.startswith("for-loop"):
            assert params_in["pipelinechannel--setup-run_id"] == from_setup, name
            comp = pipeline["components"][task["componentRef"]["name"]]
            (inner,) = comp["dag"]["tasks"].values()
            assert inner["inputs"]["parameters"]["run_id"] == {"componentInputParameter":
                                                               "pipelinechannel--setup-run_id"}
            seen += 1
        elif name.startswith("condition-branches"):  # training: one node (dsl.If) or several (dsl.Else)
            assert params_in["pipelinechannel--setup-run_id"] == from_setup, name
            branches = pipeline["components"][task["componentRef"]["name"]]["dag"]["tasks"].values()
            inner_tasks = [t for b in branches
                           for t in pipeline["components"][b["componentRef"]["name"]]["dag"]["tasks"].values()]
            assert sorted(t["componentRef"]["name"] for t in inner_tasks) == ["comp-training-job-launcher",
                                                                          "comp-training-role"]
            for inner in inner_tasks:
                assert inner["inputs"]["parameters"]["run_id"] == {"componentInputParameter":
                                                                   "pipelinechannel--setup-run_id"}
            seen += 1
        elif name != "setup":
            assert params_in["run_id"] == from_setup, name
            seen += 1
    assert seen == 4 and len([n for n in role_tasks if n.startswith(("role", "training-role"))]) == 4
    for ex in ("exec-role", "exec-role-2", "exec-role-3", "exec-training-role"):
        args = pipeline["deploymentSpec"]["executors"][ex]["container"]["args"]
        url = args[args.index("--run-url") + 1]
        assert "{{$.inputs.parameters['run_id']}}" in url and "pipeline_job_uuid" not in url, ex
    finalize = pipeline["root"]["dag"]["tasks"]["finalize"]["inputs"]["parameters"]
    assert finalize["resume_run_id"] == {"componentInputParameter": "resume_run_id"}
    assert finalize["run_id"] == {"runtimeValue": {"constant": "{{$.pipeline_job_uuid}}"}}


def test_only_the_generation_task_is_retried_as_often_as_the_launcher_restarts_it(docs):
    """A lost generation pod comes back (the run goes on without it meanwhile); any other role's failure ends the
    run: retrying a trainer or a writer would need a resume, which setup does (resume_run_id)."""
    from asyncrl.config import RunConfig

    pipeline, _ = docs
    retried = {t["taskInfo"]["name"]: t["retryPolicy"] for t in _tasks(pipeline).values() if "retryPolicy" in t}
    assert list(retried) == ["generation"], retried
    assert retried["generation"]["maxRetryCount"] == RunConfig().generation.max_restarts == 3
