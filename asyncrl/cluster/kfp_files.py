"""The Kubeflow files at the repository's top, generated from asyncrl/cluster/pipeline/ (never edited by hand):

    pipelines/asyncrl.yaml        the compiled pipeline to upload (byte for byte the package's own asyncrl.yaml)
    pipelines/asyncrl-kueue.yaml  the same pipeline for manifests/kueue/queues.yaml: every pod in the LocalQueue
                                  `asyncrl`, the long-lived roles one Kueue pod group (sized for the default replicas)
    components/<step>.yaml        one KFP component spec per task of the pipeline (setup, each role, finalize)

`asyncrl pipeline export --out-dir .` (`make kfp-files`) writes them; tests/unit/test_kfp_files.py fails when the
committed ones differ. This module owns which files there are and how each is built; the pipeline itself, its
components and the pod layout stay in asyncrl/cluster/pipeline/. Every file uses the committed image flags (no
registry, tag `dev`), so nothing depends on the git revision and a rerun writes the same bytes.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.cluster.pipeline.images import COMMITTED_REGISTRY, COMMITTED_TAG, image_refs

PIPELINES_DIR = "pipelines"
COMPONENTS_DIR = "components"
KUEUE_QUEUE = "asyncrl"  # the LocalQueue of manifests/kueue/queues.yaml
EXPORT_COMMAND = "make kfp-files"  # = `asyncrl pipeline export --out-dir .`
# the role steps' description (kfp reads `Args:` as the inputs' descriptions); the module is written into the command
ROLE_DOC = """The {name} role, `asyncrl-task {module}`, as the asyncrl pipeline runs it ({where}).

A long-lived server of the run at s3://<bucket>/<prefix>/<run_id>, bound to all interfaces and advertising the pod
IP; it exits by itself when the run is done or a peer is gone past its deadline. The pipeline adds the S3 secret,
role token, endpoints, resources and pod settings (asyncrl/cluster/pipeline/definition.py).

Args:
    bucket: The S3 bucket of the run's folder.
    prefix: The prefix of the run's folder, s3://<bucket>/<prefix>/<run_id>/.
    run_id: The run's id, setup's output `run_id`.
    role_id: This replica's id ({ids}).{extra}
"""
GPUS_ARG = """
    gpus: GPUs of the pod; not read by the command: the pipeline's GPU limit refers to this input."""


@dataclass(frozen=True)
class RoleStep:
    """A role task of the pipeline: `components.role` with its module written in."""

    module: str
    image: str  # the image parameter it runs in (generation_image, light_image)
    where: str
    ids: str
    keep_gpus: bool = False


@dataclass(frozen=True)
class Step:
    """Any other task: one of asyncrl.cluster.pipeline.components as it is, in `image`."""

    component: str  # its name in asyncrl.cluster.pipeline.components
    image: str  # the image parameter it runs in


# components/<name>.yaml -> the pipeline task it is, in the order a run starts them
STEPS: dict[str, RoleStep | Step] = {
    "setup": Step("setup", "light_image"),
    "generation": RoleStep("asyncrl.roles.generation", "generation_image",
                           "one task per generation_replica_ids entry, generation_gpus GPUs each", '"0".."N-1"',
                           keep_gpus=True),
    "training": Step("training_role", "training_image"),
    "training-launcher": Step("training_job_launcher", "light_image"),
    "reward": RoleStep("asyncrl.roles.reward", "light_image", "one task", '"0"'),
    "environment": RoleStep("asyncrl.roles.environment", "light_image",
                            "one task per environment_replica_ids entry", '"env0".."envM-1"'),
    "finalize": Step("finalize", "light_image"),
}


def committed_images() -> dict[str, str]:
    """The image parameters of the committed files: asyncrl-<name>:dev (`make images TAG=dev` builds them)."""
    return image_refs(COMMITTED_REGISTRY, COMMITTED_TAG)


def kueue_layout() -> Any:
    """The layout of pipelines/asyncrl-kueue.yaml: the LocalQueue `asyncrl`, and a pod group of the default run's
    long-lived pods (its generation and environment replicas, training, reward), as setup checks it."""
    from asyncrl.cluster.pipeline import pods
    from asyncrl.cluster.pipeline.definition import asyncrl_pipeline

    defaults = inspect.signature(asyncrl_pipeline.pipeline_func).parameters
    replicas = len(defaults["generation_replica_ids"].default) + len(defaults["environment_replica_ids"].default)
    return pods.PodLayout(kueue_queue=KUEUE_QUEUE, gang_pods=replicas + 2)


def _with_image(spec: Any, image: str) -> Any:
    from kfp import dsl

    return dsl.ContainerSpec(image=image, command=spec.command, args=spec.args)


def _container_step(base: Any, name: str, image: str, doc: str, bound: dict[str, Any],
                    dropped: tuple[str, ...] = ()) -> Any:
    """`base` (a container component) as its own component `name`: `bound` inputs written in, `dropped` ones
    (which have defaults) left out, the image set. kfp calls the function with one placeholder per input."""
    from kfp import dsl

    signature = inspect.signature(base.pipeline_func)
    kept = [p for n, p in signature.parameters.items() if n not in bound and n not in dropped]

    def step(*inputs: Any) -> Any:
        return _with_image(base.pipeline_func(**bound, **dict(zip([p.name for p in kept], inputs, strict=True))),
                           image)

    step.__signature__ = signature.replace(parameters=kept)  # type: ignore[attr-defined]
    step.__name__ = step.__qualname__ = name.replace("-", "_")
    step.__doc__ = doc
    return dsl.container_component(step)


def _role_component(name: str, step: RoleStep, images: dict[str, str]) -> Any:
    from asyncrl.cluster.pipeline import components

    doc = ROLE_DOC.format(name=name, module=step.module, where=step.where, ids=step.ids,
                          extra=GPUS_ARG if step.keep_gpus else "")
    return _container_step(components.role, name, images[step.image], doc, {"module": step.module},
                           () if step.keep_gpus else ("gpus",))


def _plain_component(name: str, step: Step, images: dict[str, str]) -> Any:
    from kfp import dsl

    from asyncrl.cluster.pipeline import components

    base = getattr(components, step.component)
    if hasattr(base, "python_func"):  # finalize: a Python component, rebuilt on its own image
        return dsl.component(base.python_func, base_image=images[step.image], install_kfp_package=False)
    return _container_step(base, name, images[step.image], inspect.getdoc(base.pipeline_func) or "", {})


def compile_layout(out: Path, layout: Any = None, registry: str = COMMITTED_REGISTRY,
                   tag: str = COMMITTED_TAG) -> Path:
    """`asyncrl.cluster.pipeline_cli.compile_pipeline` with a `pods.PodLayout` itself (None: the default layout, the committed YAML's)."""
    from kfp import compiler

    from asyncrl.cluster.pipeline import pods
    from asyncrl.cluster.pipeline.definition import asyncrl_pipeline

    pipeline = asyncrl_pipeline if layout is None else pods.with_layout(asyncrl_pipeline, layout)
    out.parent.mkdir(parents=True, exist_ok=True)
    compiler.Compiler().compile(pipeline, str(out), pipeline_parameters=image_refs(registry, tag))
    return out


def component_for(name: str) -> Any:
    """The KFP component of components/<name>.yaml."""
    step, images = STEPS[name], committed_images()
    build: Callable[..., Any] = _role_component if isinstance(step, RoleStep) else _plain_component
    return build(name, step, images)


def pipeline_files(out_dir: Path) -> list[Path]:
    """pipelines/asyncrl.yaml (as `asyncrl pipeline compile` writes the package's) and its Kueue variant."""
    pipelines = out_dir / PIPELINES_DIR
    return [compile_layout(pipelines / "asyncrl.yaml"), compile_layout(pipelines / "asyncrl-kueue.yaml",
                                                                       kueue_layout())]


def component_files(out_dir: Path) -> list[Path]:
    """components/<step>.yaml, one per task of the pipeline."""
    from kfp import compiler

    out = out_dir / COMPONENTS_DIR
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / f"{name}.yaml" for name in STEPS]
    for path in paths:
        compiler.Compiler().compile(component_for(path.stem), str(path))
    return paths


def export(out_dir: Path) -> list[Path]:
    """Write pipelines/ and components/ under `out_dir` (the repository root for the committed ones)."""
    return pipeline_files(out_dir) + component_files(out_dir)
