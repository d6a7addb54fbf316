"""Pod sizing and scheduling of the pipeline's tasks, through kfp-kubernetes: what a task's pod asks for and where
it may run. `definition.py` calls these on every task; nothing else sets resources, volumes or scheduling.

Two kinds of settings, because kfp-kubernetes takes some only as constants:
- run-time, pipeline parameters (the run form): CPU and memory requests and limits per role (`size_pod`), the node
  selector and tolerations as JSON (`schedule_pod`), the image pull secret (`pull_images_with`);
- compile-time, a `PodLayout` (`DEFAULT_LAYOUT`, or `asyncrl pipeline compile --pod-layout FILE`): the model cache
  volume (`mount_model_cache`: a generic ephemeral volume, an existing PVC, or an emptyDir; its size, class and claim
  name), the memory-backed `/dev/shm` size (`mount_shm`), and Kueue admission (`queue_pod`: the LocalQueue label,
  and a pod group for gang admission). kfp-kubernetes stores volume sizes, claim names given as constants, pod labels
  and annotations as fixed strings in the compiled YAML.

Inside a `dsl.ParallelFor`, the compiler wires into the loop's DAG inputs only the pipeline parameters a task
consumes as arguments or through kfp-kubernetes' parameter inputs, not those named by `set_cpu_limit` & co.;
`size_pod` registers them with the task (`register_pipeline_channels`), so the KFP driver can resolve them.

Every task but finalize mounts the cache at `CACHE_MOUNT` and gets `ASYNCRL_CACHE_DIR` (which replaces the config's
`cache_dir` in the pod: `asyncrl.config.with_cache_dir_from_env`) and the caches of the libraries under it.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any, Literal

from kfp import dsl, kubernetes
from kfp.dsl import pipeline_channel

CACHE_MOUNT = "/cache"
CACHE_VOLUME = "model-cache"
SHM_VOLUME = "dshm"
CACHE_ENV = {  # what the pods' processes cache, all under the cache volume
    "ASYNCRL_CACHE_DIR": f"{CACHE_MOUNT}/asyncrl",  # built and fetched models (the config's cache_dir)
    "HF_HOME": f"{CACHE_MOUNT}/huggingface",
    "VLLM_CACHE_ROOT": f"{CACHE_MOUNT}/vllm",
    "TORCH_EXTENSIONS_DIR": f"{CACHE_MOUNT}/torch_extensions",  # DeepSpeed's compiled ops
    "TRITON_CACHE_DIR": f"{CACHE_MOUNT}/triton",
}
KUEUE_QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
KUEUE_GROUP_LABEL = "kueue.x-k8s.io/pod-group-name"
KUEUE_GROUP_COUNT_ANNOTATION = "kueue.x-k8s.io/pod-group-total-count"
# one pod group per pipeline run: Argo substitutes its global variables across a template, its pod metadata included
# (KFP compiles a task's pod labels into its Argo template's metadata); not tried on a cluster here
KUEUE_GROUP_NAME = "asyncrl-{{workflow.uid}}"
CacheKind = Literal["ephemeral", "pvc", "empty_dir"]
# a Kubernetes resource quantity (k8s.io/apimachinery resource.Quantity's serialised form), as the KFP driver parses it
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")


def check_quantity(name: str, value: str) -> str:
    """A positive Kubernetes quantity such as 200Gi, 512Mi, 500m or 1.5; ValueError naming `name` otherwise."""
    if not isinstance(value, str) or not QUANTITY.match(value) or not re.search(r"[1-9]", value):
        raise ValueError(f"{name}: expected a positive Kubernetes quantity such as 200Gi or 512Mi, got {value!r}")
    return value


@dataclass(frozen=True)
class PodLayout:
    """The compile-time pod settings (kfp-kubernetes takes them only as constants).

    `cache_kind`: "ephemeral" (a generic ephemeral volume per pod, `cache_size` from `cache_storage_class` or the
    cluster's default class; deleted with the pod), "pvc" (the existing claim `cache_claim`, shared by every pod and
    kept across runs: ReadWriteMany when pods land on several nodes), or "empty_dir" (node-local disk, at most
    `cache_size`). `shm_size`: the memory-backed /dev/shm of the GPU roles (counts against their memory limit).
    `kueue_queue`: the Kueue LocalQueue of every pod (empty: no Kueue labels). `gang_pods`: > 0 puts the long-lived
    roles (generation and environment replicas, training, reward) in one Kueue pod group of that many pods, admitted
    together; it must equal the run's replicas + 2 (setup checks it)."""

    cache_kind: CacheKind = "ephemeral"
    cache_size: str = "200Gi"
    cache_storage_class: str = ""
    cache_claim: str = ""
    shm_size: str = "16Gi"
    kueue_queue: str = ""
    gang_pods: int = 0

    def __post_init__(self) -> None:
        if self.cache_kind not in ("ephemeral", "pvc", "empty_dir"):
            raise ValueError(f"cache_kind: expected one of ephemeral, pvc, empty_dir, got {self.cache_kind!r}")
        if self.cache_kind == "pvc" and not self.cache_claim:
            raise ValueError("cache_claim: expected the name of an existing PersistentVolumeClaim with cache_kind pvc")
        if self.cache_kind != "pvc" and self.cache_claim:
            raise ValueError(f"cache_claim: only with cache_kind pvc (got cache_kind {self.cache_kind!r})")
        for name in ("cache_size", "shm_size"):
            check_quantity(name, getattr(self, name))
        if self.gang_pods < 0 or (self.gang_pods and not self.kueue_queue):
            raise ValueError(f"gang_pods: expected 0, or the pod count of the run with kueue_queue set, got "
                             f"{self.gang_pods} (kueue_queue {self.kueue_queue!r})")


DEFAULT_LAYOUT = PodLayout()
_layout = DEFAULT_LAYOUT  # the layout the pipeline body reads while it is being built (`current_layout`)


def current_layout() -> PodLayout:
    """The layout of the pipeline being built: DEFAULT_LAYOUT, or the one `with_layout` builds it with."""
    return _layout


@contextmanager
def _using(layout: PodLayout) -> Iterator[None]:
    global _layout
    previous, _layout = _layout, layout
    try:
        yield
    finally:
        _layout = previous


def with_layout(pipeline: Any, layout: PodLayout) -> Any:
    """`pipeline` (a `@dsl.pipeline` GraphComponent) built again with `layout`: `@dsl.pipeline` runs the body once,
    at import, with DEFAULT_LAYOUT; this runs it again on a copy of its spec, the original untouched."""
    from kfp.dsl.graph_component import GraphComponent

    with _using(layout):
        return GraphComponent(copy.deepcopy(pipeline.component_spec), pipeline.pipeline_func,
                              pipeline_config=pipeline.pipeline_config)


def load_layout(path: Path) -> PodLayout:
    """A `PodLayout` from a YAML mapping of its fields; ValueError naming the file and the field."""
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as err:
        raise ValueError(f"{path}: expected a readable YAML pod layout: {err}") from None
    if not isinstance(data, dict):
        raise ValueError(f"{path}: expected a mapping of pod layout fields, got {type(data).__name__}")
    known = {f.name: f.type for f in fields(PodLayout)}
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"{path}: unknown pod layout field(s) {unknown}; expected some of {sorted(known)}")
    for key, value in data.items():
        want = int if key == "gang_pods" else str
        if not isinstance(value, want) or isinstance(value, bool):
            raise ValueError(f"{path}: {key}: expected {want.__name__}, got {value!r}")
    try:
        return PodLayout(**data)
    except ValueError as err:
        raise ValueError(f"{path}: {err}") from None


# ---- run-time settings (pipeline parameters) ---------------------------------------------------------------
def size_pod(task: dsl.PipelineTask, cpu_request: Any, cpu_limit: Any, memory_request: Any,
             memory_limit: Any) -> dsl.PipelineTask:
    """CPU and memory requests and limits (pipeline parameters or constants), wired into a loop's inputs too."""
    task.set_cpu_request(cpu_request).set_cpu_limit(cpu_limit)
    task.set_memory_request(memory_request).set_memory_limit(memory_limit)
    channels = [v for v in (cpu_request, cpu_limit, memory_request, memory_limit)
                if isinstance(v, pipeline_channel.PipelineParameterChannel)]
    task.register_pipeline_channels(channels)
    return task


def schedule_pod(task: dsl.PipelineTask, node_selector: Any, tolerations: Any) -> dsl.PipelineTask:
    """The node selector (a JSON object of labels) and tolerations (a JSON list of Kubernetes tolerations)."""
    kubernetes.add_node_selector_json(task, node_selector)
    kubernetes.add_toleration_json(task, tolerations)
    return task


def pull_images_with(task: dsl.PipelineTask, secret: Any) -> dsl.PipelineTask:
    """The image pull secret (a pipeline parameter; a secret that does not exist only makes the kubelet warn)."""
    return kubernetes.set_image_pull_secrets(task, [secret])


# ---- compile-time settings (PodLayout) ---------------------------------------------------------------------
def mount_model_cache(task: dsl.PipelineTask, layout: PodLayout) -> dsl.PipelineTask:
    """The cache volume at CACHE_MOUNT, and the env that points every cache of the pod into it."""
    if layout.cache_kind == "pvc":
        kubernetes.mount_pvc(task, pvc_name=layout.cache_claim, mount_path=CACHE_MOUNT)
    elif layout.cache_kind == "ephemeral":
        kubernetes.add_ephemeral_volume(task, volume_name=CACHE_VOLUME, mount_path=CACHE_MOUNT,
                                        access_modes=["ReadWriteOnce"], size=layout.cache_size,
                                        storage_class_name=layout.cache_storage_class or None)
    else:
        kubernetes.empty_dir_mount(task, volume_name=CACHE_VOLUME, mount_path=CACHE_MOUNT,
                                   size_limit=layout.cache_size)
    for name, value in CACHE_ENV.items():
        task.set_env_variable(name, value)
    return task


def mount_shm(task: dsl.PipelineTask, layout: PodLayout) -> dsl.PipelineTask:
    """A memory-backed /dev/shm of `layout.shm_size` (NCCL, vLLM's and DataLoader's shared memory)."""
    return kubernetes.empty_dir_mount(task, volume_name=SHM_VOLUME, mount_path="/dev/shm", medium="Memory",
                                      size_limit=layout.shm_size)


def queue_pod(task: dsl.PipelineTask, layout: PodLayout, gang: bool) -> dsl.PipelineTask:
    """Kueue: the LocalQueue label when `layout.kueue_queue` is set; with `gang` and `layout.gang_pods`, the pod
    group label and total-count annotation that make Kueue admit the group's pods together."""
    if not layout.kueue_queue:
        return task
    kubernetes.add_pod_label(task, label_key=KUEUE_QUEUE_LABEL, label_value=layout.kueue_queue)
    if gang and layout.gang_pods:
        kubernetes.add_pod_label(task, label_key=KUEUE_GROUP_LABEL, label_value=KUEUE_GROUP_NAME)
        kubernetes.add_pod_annotation(task, annotation_key=KUEUE_GROUP_COUNT_ANNOTATION,
                                      annotation_value=str(layout.gang_pods))
    return task


# ---- one call per task -------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Size:
    """A role's CPU and memory requests and limits (pipeline parameters)."""

    cpu_request: Any
    cpu_limit: Any
    memory_request: Any
    memory_limit: Any


@dataclass(frozen=True)
class Nodes:
    """Where a pod may run and how it pulls its image (pipeline parameters)."""

    node_selector: Any
    tolerations: Any
    pull_secret: Any


def place(task: dsl.PipelineTask, size: Size, nodes: Nodes, *, cache: bool, gang: bool) -> dsl.PipelineTask:
    """Everything this module sets on one task: its size, its nodes and pull secret, the model cache (`cache`),
    Kueue's queue and, for the long-lived roles (`gang`), the pod group; the compile-time part from
    `current_layout()`."""
    layout = current_layout()
    size_pod(task, size.cpu_request, size.cpu_limit, size.memory_request, size.memory_limit)
    schedule_pod(task, nodes.node_selector, nodes.tolerations)
    pull_images_with(task, nodes.pull_secret)
    if cache:
        mount_model_cache(task, layout)
    return queue_pod(task, layout, gang)
