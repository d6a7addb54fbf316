"""The training role on N nodes x G GPUs: the Kubernetes objects the cluster's distributed-training engine runs.

Pure: builds plain dicts, starts nothing, talks to no API (the launcher, `asyncrl.cluster.training_launcher`,
creates and awaits them). Two engines, chosen by which CRD the cluster serves:

- a Kubeflow Trainer `TrainJob` (`trainer.kubeflow.org/v1alpha1`, runtime `torch-distributed`): one JobSet
  replicated job `node` of N pods; the torch plugin sets `PET_NNODES`, `PET_NPROC_PER_NODE`, `PET_NODE_RANK`,
  `PET_MASTER_ADDR` and `PET_MASTER_PORT` in the `node` container;
- a `PyTorchJob` (`kubeflow.org/v1`, the training operator): one `Master` pod and N-1 `Worker` pods; the operator
  sets `MASTER_ADDR`, `MASTER_PORT`, `WORLD_SIZE` (pods) and `RANK` (the pod's index: 0 for the master).

Every pod runs the same command line, the one the single-node pipeline task runs with the rendezvous of its node
spelled out (`training_args`): `torchrun --nnodes N --nproc-per-node G --node-rank $(R) --master-addr $(A)
--master-port $(P) -m asyncrl.roles.training --run-url <run> --id 0 --host 0.0.0.0`, where `$(R)`, `$(A)`, `$(P)`
are Kubernetes variable references (expanded by the kubelet from the container's env, which the engine filled in;
`expand_env_refs` does the same for the local rehearsal). Rank 0 (node 0, local rank 0) leads as in one pod: it
reads S3, advertises its `POD_IP` and joins the generation servers' weight group.

Each pod gets the env of a pipeline role task (`asyncrl.cluster.pipeline.definition._common`): the S3 keys, the
role token and the optional MLflow login from their secrets (references, never values), the S3 endpoint from the
config map, `POD_IP` from the pod's status and `ASYNCRL_BIND_HOST=0.0.0.0`; the role labels (the network policies
admit only labelled pods); G GPUs, the GPU toleration and node selector; a memory-backed `/dev/shm`.

Lifetime: the object's ownerReference is the launcher's pod (its name and uid from the downward API): deleting the
pipeline run deletes its Argo workflow, which deletes the workflow's pods, which deletes the job and its pods
(Kubernetes garbage collection). Gang scheduling: `PyTorchJob.spec.runPolicy.schedulingPolicy.minAvailable = N`
(honoured where the operator runs with a gang scheduler: Volcano or scheduler-plugins); for a `TrainJob` the
runtime's `podGroupPolicy` decides; with a Kueue queue name both carry `kueue.x-k8s.io/queue-name`, and Kueue
admits all N pods at once or none.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL = "trainer.kubeflow.org", "v1alpha1", "trainjobs"
PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL = "kubeflow.org", "v1", "pytorchjobs"
ENGINES = ("trainjob", "pytorchjob")
TORCH_RUNTIME = "torch-distributed"  # the Trainer's ClusterTrainingRuntime for torchrun
TRAINJOB_NODE = "node"  # the torch runtime's replicated job and container
PYTORCHJOB_CONTAINER = "pytorch"  # the container name the training operator requires
PATCH_MANAGER = "asyncrl.cluster/training-launcher"  # owner of our runtime patch in a TrainJob
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

# the rendezvous variables each engine sets in every pod: (node rank, master address, master port)
RENDEZVOUS_ENV = {"trainjob": ("PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"),
                  "pytorchjob": ("RANK", "MASTER_ADDR", "MASTER_PORT")}

# the cluster settings of a role task (asyncrl/cluster/pipeline/definition.py, kept equal by tests/unit)
S3_SECRET = "asyncrl-s3"
S3_SECRET_KEYS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")
ROLE_TOKEN_SECRET, ROLE_TOKEN_KEY = "asyncrl-role-token", "ASYNCRL_ROLE_TOKEN"
MLFLOW_AUTH_SECRET = "asyncrl-mlflow-auth"
MLFLOW_AUTH_KEYS = ("MLFLOW_TRACKING_USERNAME", "MLFLOW_TRACKING_PASSWORD")
ENDPOINTS_CONFIG_MAP, ENDPOINT_KEY = "asyncrl-endpoints", "AWS_ENDPOINT_URL"
GPU_RESOURCE = "nvidia.com/gpu"
GPU_NODE_LABEL = "nvidia.com/gpu.present"
ROLE_LABELS = {"app.kubernetes.io/part-of": "asyncrl", "asyncrl/role": "training"}

_NAME = re.compile(r"^[a-z]([-a-z0-9]{0,61}[a-z0-9])?$")  # DNS-1035 label: what JobSet and Services accept
_ENV_REF = re.compile(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)")


@dataclass(frozen=True)
class Owner:
    """The object whose deletion deletes the job: the launcher's pod."""

    name: str
    uid: str
    api_version: str = "v1"
    kind: str = "Pod"


@dataclass(frozen=True)
class TrainingJobSpec:
    """What a multi-node training job needs; `check()` names the first bad field."""

    name: str
    namespace: str
    image: str
    nodes: int
    gpus_per_node: int
    run_url: str
    owner: Owner | None = None
    kueue_queue: str = ""

    def check(self) -> None:
        if not _NAME.match(self.name):
            raise ValueError(f"name: expected a DNS-1035 label (lower case letters, digits, '-', at most 63 "
                             f"characters, starting with a letter), got {self.name!r}")
        if not self.namespace:
            raise ValueError("namespace: expected the namespace to create the job in, got ''")
        if not self.image:
            raise ValueError("image: expected the training image reference, got ''")
        if self.nodes < 1:
            raise ValueError(f"nodes: expected at least 1 node, got {self.nodes}")
        if self.gpus_per_node < 1:
            raise ValueError(f"gpus_per_node: expected at least 1 GPU (one training rank) per node, got "
                             f"{self.gpus_per_node}")
        if not self.run_url.startswith("s3://"):
            raise ValueError(f"run_url: expected s3://bucket/prefix/run_id, got {self.run_url!r}")

    @property
    def world_size(self) -> int:
        """= `training.num_processes`, which the setup step writes as nodes x GPUs."""
        return self.nodes * self.gpus_per_node


def training_args(nodes: int, gpus_per_node: int, run_url: str, node_rank: str, master_addr: str,
                  master_port: str) -> list[str]:
    """torchrun's arguments for one node: the multi-node form of the pipeline's single-node training task."""
    return ["--nnodes", str(nodes), "--nproc-per-node", str(gpus_per_node), "--node-rank", node_rank,
            "--master-addr", master_addr, "--master-port", master_port,
            "-m", "asyncrl.roles.training", "--run-url", run_url, "--id", "0", "--host", "0.0.0.0"]


def engine_args(spec: TrainingJobSpec, engine: str) -> list[str]:
    """The arguments a pod of `engine` runs, with the engine's rendezvous variables as `$(VAR)` references."""
    rank, addr, port = (f"$({v})" for v in RENDEZVOUS_ENV[_engine(engine)])
    return training_args(spec.nodes, spec.gpus_per_node, spec.run_url, rank, addr, port)


def expand_env_refs(text: str, env: Mapping[str, str]) -> str:
    """Kubernetes' expansion of `$(VAR)` in a container's command and args: a defined variable is replaced, an
    undefined reference stays as written, `$$` is a literal `$`."""
    def one(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return _ENV_REF.sub(one, text)


def role_env() -> list[dict[str, Any]]:
    """The env of a pipeline role task, as Kubernetes EnvVar objects (secret and config-map references only)."""
    env: list[dict[str, Any]] = [
        {"name": k, "valueFrom": {"secretKeyRef": {"name": S3_SECRET, "key": k}}} for k in S3_SECRET_KEYS]
    env.append({"name": ROLE_TOKEN_KEY, "valueFrom": {"secretKeyRef": {"name": ROLE_TOKEN_SECRET,
                                                                         "key": ROLE_TOKEN_KEY}}})
    env += [{"name": k, "valueFrom": {"secretKeyRef": {"name": MLFLOW_AUTH_SECRET, "key": k, "optional": True}}}
            for k in MLFLOW_AUTH_KEYS]
    env.append({"name": ENDPOINT_KEY, "valueFrom": {"configMapKeyRef": {"name": ENDPOINTS_CONFIG_MAP,
                                                                         "key": ENDPOINT_KEY}}})
    env.append({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}})
    env.append({"name": "ASYNCRL_BIND_HOST", "value": "0.0.0.0"})
    return env


def _engine(engine: str) -> str:
    if engine not in ENGINES:
        raise ValueError(f"engine: expected one of {list(ENGINES)}, got {engine!r}")
    return engine


def _metadata(spec: TrainingJobSpec) -> dict[str, Any]:
    labels = dict(ROLE_LABELS)
    if spec.kueue_queue:
        labels[KUEUE_QUEUE_LABEL] = spec.kueue_queue
    meta: dict[str, Any] = {"name": spec.name, "namespace": spec.namespace, "labels": labels}
    if spec.owner is not None:
        # no blockOwnerDeletion: it would need update rights on pods/finalizers, and nothing waits on it
        meta["ownerReferences"] = [{"apiVersion": spec.owner.api_version, "kind": spec.owner.kind,
                                    "name": spec.owner.name, "uid": spec.owner.uid}]
    return meta


def _shm_volume() -> dict[str, Any]:
    return {"name": "dshm", "emptyDir": {"medium": "Memory"}}


def _shm_mount() -> dict[str, Any]:
    return {"name": "dshm", "mountPath": "/dev/shm"}


def _gpu_scheduling() -> dict[str, Any]:
    return {"tolerations": [{"key": GPU_RESOURCE, "operator": "Exists", "effect": "NoSchedule"}],
            "nodeSelector": {GPU_NODE_LABEL: "true"}}


def pytorch_job(spec: TrainingJobSpec) -> dict[str, Any]:
    """The `PyTorchJob`: a Master and N-1 Workers, each one pod of G ranks; gang of N pods; no restarts (a failed
    trainer resumes from its checkpoint in a new pipeline run, never half a world)."""
    spec.check()

    def replicas(n: int) -> dict[str, Any]:
        container = {"name": PYTORCHJOB_CONTAINER, "image": spec.image, "command": ["asyncrl-task", "torch.distributed.run"],
                     "args": engine_args(spec, "pytorchjob"), "env": role_env(),
                     "resources": {"limits": {GPU_RESOURCE: spec.gpus_per_node}},
                     "volumeMounts": [_shm_mount()]}
        pod = {"containers": [container], "volumes": [_shm_volume()], "restartPolicy": "Never",
               **_gpu_scheduling()}
        return {"replicas": n, "restartPolicy": "Never",
                "template": {"metadata": {"labels": dict(ROLE_LABELS)}, "spec": pod}}

    replica_specs = {"Master": replicas(1)}
    if spec.nodes > 1:
        replica_specs["Worker"] = replicas(spec.nodes - 1)
    return {"apiVersion": f"{PYTORCHJOB_GROUP}/{PYTORCHJOB_VERSION}", "kind": "PyTorchJob",
            "metadata": _metadata(spec),
            "spec": {"runPolicy": {"backoffLimit": 0, "cleanPodPolicy": "None",
                                   "schedulingPolicy": {"minAvailable": spec.nodes}},
                     "pytorchReplicaSpecs": replica_specs}}


def train_job(spec: TrainingJobSpec) -> dict[str, Any]:
    """The `TrainJob` on the `torch-distributed` runtime: N nodes of G GPUs; the image, command, env and GPUs
    through `spec.trainer`, the labels, `/dev/shm` and GPU scheduling of the `node` pods through a runtime patch."""
    spec.check()
    pod_patch = {"containers": [{"name": TRAINJOB_NODE, "volumeMounts": [_shm_mount()]}],
                 "volumes": [_shm_volume()], **_gpu_scheduling()}
    node_patch = {"name": TRAINJOB_NODE,
                  "template": {"spec": {"template": {"metadata": {"labels": dict(ROLE_LABELS)},
                                                     "spec": pod_patch}}}}
    return {"apiVersion": f"{TRAINJOB_GROUP}/{TRAINJOB_VERSION}", "kind": "TrainJob",
            "metadata": _metadata(spec),
            "spec": {"runtimeRef": {"name": TORCH_RUNTIME, "apiGroup": TRAINJOB_GROUP,
                                    "kind": "ClusterTrainingRuntime"},
                     "trainer": {"image": spec.image, "command": ["asyncrl-task", "torch.distributed.run"], "args": engine_args(spec, "trainjob"),
                                 "env": role_env(), "numNodes": spec.nodes, "numProcPerNode": spec.gpus_per_node,
                                 "resourcesPerNode": {"limits": {GPU_RESOURCE: spec.gpus_per_node}}},
                     "runtimePatches": [{"manager": PATCH_MANAGER, "trainingRuntimeSpec": {
                         "template": {"spec": {"replicatedJobs": [node_patch]}}}}]}}


def build(spec: TrainingJobSpec, engine: str) -> dict[str, Any]:
    """The job object of `engine` ("trainjob" or "pytorchjob")."""
    return train_job(spec) if _engine(engine) == "trainjob" else pytorch_job(spec)


def api_of(engine: str) -> tuple[str, str, str]:
    """(group, version, plural) of `engine`'s custom resource."""
    if _engine(engine) == "trainjob":
        return TRAINJOB_GROUP, TRAINJOB_VERSION, TRAINJOB_PLURAL
    return PYTORCHJOB_GROUP, PYTORCHJOB_VERSION, PYTORCHJOB_PLURAL
