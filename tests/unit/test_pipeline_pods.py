"""Pod sizing and scheduling in the compiled pipeline (asyncrl/cluster/pipeline/pods.py): every role's CPU/memory
requests and limits from its own pipeline parameters (wired into the ParallelFor loops), the model cache volume and
the env that points the caches into it, the sized /dev/shm of the GPU roles, node selector / tolerations / image
pull secret as parameters, Kueue's queue label and pod group in a layout that asks for them; the compile-time
layout's checks; and the rehearsal resolving all of it (resources, the cache volume's local folder)."""

from pathlib import Path

import pytest
import yaml
from kfp import compiler

from asyncrl.cluster.pipeline import pods
from asyncrl.cluster.pipeline_cli import DEFAULT_YAML
from asyncrl.cluster.rehearsal import RehearsalError, load_compiled, resolve_parameters, task_commands

SECRETS = {"asyncrl-s3": {"AWS_ACCESS_KEY_ID": "AKTEST", "AWS_SECRET_ACCESS_KEY": "sekrit"},
           "asyncrl-role-token": {"ASYNCRL_ROLE_TOKEN": "role-token-for-the-test"}}
CONFIG_MAPS = {"asyncrl-endpoints": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9999"}}
# executor -> (the role whose parameters size it, its node class, is it a long-lived role)
EXECUTORS = {"exec-role": ("generation", "gpu", True), "exec-training-role": ("training", "gpu", True),
             "exec-role-2": ("reward", "cpu", True), "exec-role-3": ("environment", "cpu", True),
             "exec-setup": ("setup", "cpu", False), "exec-finalize": ("setup", "cpu", False)}
RESOURCE_FIELDS = {"resourceCpuRequest": "cpu_request", "resourceCpuLimit": "cpu_limit",
                   "resourceMemoryRequest": "memory_request", "resourceMemoryLimit": "memory_limit"}


def _docs(path: Path) -> tuple[dict, dict]:
    pipeline, platform = list(yaml.safe_load_all(path.read_text()))
    return pipeline, platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


@pytest.fixture(scope="module")
def docs():
    return _docs(DEFAULT_YAML)


def test_every_task_is_sized_by_its_roles_parameters(docs):
    pipeline, _ = docs
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    for executor, (role, _, _) in EXECUTORS.items():
        resources = pipeline["deploymentSpec"]["executors"][executor]["container"]["resources"]
        for field, suffix in RESOURCE_FIELDS.items():
            name = f"{role}_{suffix}"
            assert resources[field] == f"{{{{$.inputs.parameters['pipelinechannel--{name}']}}}}", (executor, field)
            assert pods.check_quantity(name, params[name]["defaultValue"])  # a default the driver can parse


def test_resource_parameters_reach_the_loops(docs):
    """A loop's DAG must declare every parameter its task's resources name, else the KFP driver fails the task."""
    pipeline, _ = docs
    loops = {c["dag"]["tasks"][t]["taskInfo"]["name"]: c for c in pipeline["components"].values() if "dag" in c
             for t in c["dag"]["tasks"]}
    for role in ("generation", "environment"):
        declared = loops[role]["inputDefinitions"]["parameters"]
        for suffix in RESOURCE_FIELDS.values():
            assert f"pipelinechannel--{role}_{suffix}" in declared, (role, suffix)


def test_cache_volume_shm_and_scheduling(docs):
    pipeline, executors = docs
    for executor, (_, nodes, _) in EXECUTORS.items():
        ex = executors[executor]
        env = {e["name"]: e["value"] for e in pipeline["deploymentSpec"]["executors"][executor]["container"]
               .get("env", [])}
        if executor == "exec-finalize":
            assert "genericEphemeralVolume" not in ex and "ASYNCRL_CACHE_DIR" not in env
        else:
            assert ex["genericEphemeralVolume"] == [{"accessModes": ["ReadWriteOnce"], "defaultStorageClass": True,
                                                     "mountPath": "/cache", "size": "200Gi",
                                                     "volumeName": "model-cache"}], executor
            assert {k: env[k] for k in pods.CACHE_ENV} == pods.CACHE_ENV
        shm = [m for m in ex.get("emptyDirMounts", []) if m["mountPath"] == "/dev/shm"]
        assert shm == ([{"medium": "Memory", "mountPath": "/dev/shm", "sizeLimit": "16Gi", "volumeName": "dshm"}]
                       if nodes == "gpu" else []), executor
        if nodes == "gpu":  # the GPU taint is always tolerated; the parameter adds more
            assert ex["tolerations"][0] == {"effect": "NoSchedule", "key": "nvidia.com/gpu", "operator": "Exists"}
        refs = {"nodeSelector": ex["nodeSelector"]["nodeSelectorJson"]["componentInputParameter"],
                "tolerations": ex["tolerations"][-1]["tolerationJson"]["componentInputParameter"],
                "pull": ex["imagePullSecret"][0]["secretNameParameter"]["componentInputParameter"]}
        assert {k: v.removeprefix("pipelinechannel--") for k, v in refs.items()} == {
            "nodeSelector": f"{nodes}_node_selector", "tolerations": f"{nodes}_tolerations",
            "pull": "registry_login"}, executor
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert params["gpu_node_selector"]["defaultValue"] == {"nvidia.com/gpu.present": "true"}
    assert params["gpu_tolerations"]["defaultValue"] == []
    assert params["cpu_node_selector"]["defaultValue"] == {} and params["cpu_tolerations"]["defaultValue"] == []


def test_no_kueue_metadata_by_default(docs):
    _, executors = docs
    for ex in executors.values():
        assert not [k for k in {**ex["podMetadata"].get("labels", {}), **ex["podMetadata"].get("annotations", {})}
                    if k.startswith("kueue.x-k8s.io/")]


def _compile(layout: pods.PodLayout, tmp_path: Path) -> tuple[dict, dict]:
    from asyncrl.cluster.pipeline.definition import asyncrl_pipeline

    out = tmp_path / "asyncrl.yaml"
    compiler.Compiler().compile(pods.with_layout(asyncrl_pipeline, layout), str(out))
    return _docs(out)


def test_kueue_queue_and_gang_of_the_long_lived_roles(tmp_path):
    _, executors = _compile(pods.PodLayout(kueue_queue="team-a", gang_pods=4), tmp_path)
    for executor, (_, _, long_lived) in EXECUTORS.items():
        meta = executors[executor]["podMetadata"]
        assert meta["labels"][pods.KUEUE_QUEUE_LABEL] == "team-a", executor
        if long_lived:
            assert meta["labels"][pods.KUEUE_GROUP_LABEL] == "asyncrl-{{workflow.uid}}"
            assert meta["annotations"][pods.KUEUE_GROUP_COUNT_ANNOTATION] == "4"
        else:  # setup runs before the roles and finalize after them: never in their group
            assert pods.KUEUE_GROUP_LABEL not in meta["labels"] and "annotations" not in meta
    # the default layout was not changed by building another
    assert pods.current_layout() == pods.DEFAULT_LAYOUT


def test_pvc_and_empty_dir_caches(tmp_path):
    _, executors = _compile(pods.PodLayout(cache_kind="pvc", cache_claim="model-cache", shm_size="32Gi"), tmp_path)
    ex = executors["exec-role"]
    assert "genericEphemeralVolume" not in ex
    assert ex["pvcMount"][0]["mountPath"] == "/cache"
    assert ex["pvcMount"][0]["pvcNameParameter"]["runtimeValue"]["constant"] == "model-cache"
    assert [m["sizeLimit"] for m in ex["emptyDirMounts"] if m["mountPath"] == "/dev/shm"] == ["32Gi"]
    _, executors = _compile(pods.PodLayout(cache_kind="empty_dir", cache_size="50Gi"), tmp_path)
    assert {"mountPath": "/cache", "sizeLimit": "50Gi", "volumeName": "model-cache"} in \
        executors["exec-training-role"]["emptyDirMounts"]


@pytest.mark.parametrize("fields, message", [
    ({"cache_kind": "nfs"}, "cache_kind: expected one of ephemeral, pvc, empty_dir, got 'nfs'"),
    ({"cache_kind": "pvc"}, "cache_claim: expected the name of an existing PersistentVolumeClaim"),
    ({"cache_claim": "x"}, "cache_claim: only with cache_kind pvc"),
    ({"shm_size": "lots"}, "shm_size: expected a positive Kubernetes quantity such as 200Gi or 512Mi, got 'lots'"),
    ({"cache_size": "0"}, "cache_size: expected a positive Kubernetes quantity"),
    ({"gang_pods": 4}, "gang_pods: expected 0, or the pod count of the run with kueue_queue set"),
])
def test_layout_refuses_what_kubernetes_would(fields, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        pods.PodLayout(**fields)


def test_layout_file_errors_name_the_file_and_field(tmp_path):
    good = tmp_path / "layout.yaml"
    good.write_text("cache_kind: pvc\ncache_claim: shared-models\nkueue_queue: q\ngang_pods: 4\n")
    assert pods.load_layout(good) == pods.PodLayout(cache_kind="pvc", cache_claim="shared-models", kueue_queue="q",
                                                    gang_pods=4)
    for text, message in (("cache_sise: 1Gi\n", "unknown pod layout field(s) ['cache_sise']"),
                          ("gang_pods: '4'\n", "gang_pods: expected int, got '4'"),
                          ("- a\n", "expected a mapping of pod layout fields, got list"),
                          ("shm_size: 1x\n", "shm_size: expected a positive Kubernetes quantity")):
        bad = tmp_path / "bad.yaml"
        bad.write_text(text)
        with pytest.raises(ValueError, match=str(bad)) as err:
            pods.load_layout(bad)
        assert message in str(err.value)


# ---- the rehearsal reads all of it --------------------------------------------------------------------------
def _tasks(volumes=None, **overrides):
    spec, platform = load_compiled(DEFAULT_YAML)
    params = resolve_parameters(spec, {"steps": 2, **overrides})
    return {t.name: t for t in task_commands(spec, platform, params, "run-1", secrets=SECRETS,
                                             config_maps=CONFIG_MAPS, outputs={"exit-handler-1/setup":
                                                                               {"run_id": "run-1"}},
                                             volumes=volumes)}


def test_rehearsal_resolves_resources_and_the_cache_volume(tmp_path):
    tasks = _tasks(volumes={"/cache": str(tmp_path)}, generation_cpu_limit="12", generation_gpus=2)
    gen = tasks["generation-0"]
    assert gen.resources == {"resourceCpuRequest": "8", "resourceCpuLimit": "12", "resourceMemoryRequest": "64Gi",
                             "resourceMemoryLimit": "64Gi"}
    assert gen.env["ASYNCRL_CACHE_DIR"] == f"{tmp_path}/asyncrl" and gen.env["HF_HOME"] == f"{tmp_path}/huggingface"
    assert tasks["setup"].env["ASYNCRL_CACHE_DIR"] == f"{tmp_path}/asyncrl"
    argv = tasks["setup"].argv
    # a replica's GPUs are its engine's tensor parallelism (authoritative: asyncrl.cluster.setup)
    assert argv[argv.index("--generation-gpus") + 1] == "2"
    assert argv[argv.index("--gang-pods") + 1] == "0"  # the default layout has no Kueue pod group
    assert _tasks()["generation-0"].env["ASYNCRL_CACHE_DIR"] == "/cache/asyncrl"  # no local folders: as in the pod


def test_rehearsal_refuses_a_bad_quantity_and_an_unmapped_volume(tmp_path):
    with pytest.raises(RehearsalError, match=r"resources.resourceMemoryLimit: expected a Kubernetes quantity such as "
                                             r"2, 500m or 8Gi, got '8 GB'"):
        _tasks(reward_memory_limit="8 GB")
    with pytest.raises(RehearsalError, match=r"the volume mounted at '/cache' has no local folder"):
        _tasks(volumes={})


def test_setup_refuses_replicas_that_do_not_fill_the_compiled_pod_group():
    from asyncrl.cluster.setup import check_gang_size

    check_gang_size(0, '["0"]', '["env0"]')  # no group: nothing to check
    check_gang_size(5, '["0", "1"]', '["env0"]')  # 2 + 1 + training + reward
    with pytest.raises(SystemExit, match=r"compiled with a Kueue pod group of 4 pods, but this run has 2 generation "
                                         r"\+ 1 environment replicas \+ training \+ reward = 5; give 2 replicas"):
        check_gang_size(4, '["0", "1"]', '["env0"]')
