"""Rehearsal, the pure half: read a compiled KFP pipeline and resolve every task's exact command, args and env.

`load_compiled` parses the two YAML documents `asyncrl pipeline compile` writes (the PipelineSpec and the
kfp-kubernetes platform spec); `resolve_parameters` applies the pipeline's defaults and checked overrides;
`task_commands` walks the root DAG and every nested DAG (ExitHandler; ParallelFor expanded into one task per
item) and resolves, the way the KFP driver and launcher do, every placeholder of each executor's container:
`{{$.inputs.parameters['x']}}`, the job/task placeholders, `{{$}}` (the executor input JSON), `{"Concat": [...]}`
and `{"IfPresent": ...}` arguments; plus the task's env: the container's `env`, and from the platform spec the
secret, config-map and field-path env (`asyncrl.cluster.rehearsal_env`), from the dicts the caller passes. The
runner is `asyncrl.cluster.rehearsal_runner.rehearse`.
Task output parameters (`taskOutputParameter`, e.g. the setup task's `run_id` that every role reads) come from
`outputs` ({producer task key: {output name: value}}); with `defer_outputs`, one not known yet resolves to a
`PendingOutput` stand-in and the task that reads it lists it in `pending` (the runner resolves the pipeline again
once the producer has run and written its output file, `{outputs_dir}/{producer key}/{output name}`).

Invariants: a resolved command never contains `{{$`; an unknown placeholder, parameter, secret, secret key or
unsupported construct (artifacts, importers, a condition other than `asyncrl.cluster.rehearsal_condition`'s) is a `RehearsalError` naming the task and the field.
Nothing here starts a process or touches the network.
"""

from __future__ import annotations

import json
import re
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from asyncrl.cluster.rehearsal_condition import condition_holds
from asyncrl.cluster.rehearsal_env import PlatformEnvError, platform_env, task_resources, volume_env
from asyncrl.cluster.rehearsal_params import (
    PendingOutput,
    RehearsalError,
    load_compiled,
    param_text,
    parse_output,
    resolve_parameters,
    typed,
)

__all__ = ["JobContext", "PendingOutput", "RehearsalError", "RehearsalTask", "load_compiled", "param_text",
           "parse_output", "resolve_parameters", "task_commands"]

EXIT_STRATEGY = "ALL_UPSTREAM_TASKS_COMPLETED"
_PLACEHOLDER = re.compile(r"\{\{\$(?P<path>[^{}]*)\}\}")
_INPUT_PARAM = re.compile(r"""^\.inputs\.parameters\[['"](?P<name>[^'"]+)['"]\]$""")
_OUTPUT_PARAM = re.compile(r"""^\.outputs\.parameters\[['"](?P<name>[^'"]+)['"]\]\.output_file$""")
_OUTPUT_ARTIFACT = re.compile(r"""^\.outputs\.artifacts\[['"](?P<name>[^'"]+)['"]\]\.path$""")


@dataclass(frozen=True)
class RehearsalTask:
    """One leaf task (a container) with everything resolved.

    `key` is unique ("exit-handler-1/for-loop-2[1]/role"); `name` is the task's display name with its loop item
    ("generation-1"); `depends_on` holds keys of leaf tasks that must finish first (DAG-level dependencies are
    inherited by every task inside); `is_exit` marks the exit handler's task (runs whatever happened);
    `outputs` maps each output parameter the task's container writes to its parameterType; `pending` lists the
    task output parameters it reads that were not known yet ("<producer key>:<output>"): such a task must be
    resolved again before it starts."""

    key: str
    name: str
    executor: str
    command: tuple[str, ...]
    args: tuple[str, ...]
    env: dict[str, str]
    image: str
    inputs: dict[str, Any]
    depends_on: tuple[str, ...] = ()
    is_exit: bool = False
    loop_item: Any = None
    role: str = ""
    outputs: dict[str, str] = field(default_factory=dict)
    pending: tuple[str, ...] = ()
    resources: dict[str, str] = field(default_factory=dict)  # CPU/memory requests and limits, resolved

    @property
    def argv(self) -> list[str]:
        return [*self.command, *self.args]


@dataclass(frozen=True)
class JobContext:
    """What the KFP backend knows about the run: its id and name, the final status given to the exit task, where
    the executor writes its output metadata, the pod IP, the secrets and config maps of the namespace, the task
    output parameters known so far (by producer task key) and whether an unknown one is deferred or an error."""

    run_id: str
    pipeline_name: str = "pipeline"
    final_state: str = "SUCCEEDED"
    final_error: dict[str, Any] = field(default_factory=dict)
    outputs_dir: str = "/tmp/kfp_outputs"
    pod_ip: str = "127.0.0.1"
    secrets: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    config_maps: Mapping[str, Mapping[str, str]] = field(default_factory=dict)
    outputs: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    defer_outputs: bool = False
    volumes: Mapping[str, str] | None = None  # a disk volume's mount path -> its local folder (None: as in the pod)


# ---- placeholders -------------------------------------------------------------------------------------
class _Resolver:
    """Resolves the placeholders of one task against its inputs and the job."""

    def __init__(self, task: str, inputs: Mapping[str, Any], job: JobContext, executor_input: str = "") -> None:
        self.task, self.inputs, self.job, self.executor_input = task, inputs, job, executor_input

    def one(self, path: str) -> str:
        if path == "":
            if not self.executor_input:
                raise RehearsalError(f"task {self.task}: `{{{{$}}}}` (the executor input) where none is built")
            return self.executor_input
        m = _INPUT_PARAM.match(path)
        if m:
            name = m["name"]
            if name not in self.inputs or self.inputs[name] is None:
                raise RehearsalError(f"task {self.task}: placeholder {{{{${path}}}}}: input {name!r} has no value; "
                                     f"inputs are {sorted(self.inputs)}")
            return param_text(self.inputs[name])
        m = _OUTPUT_PARAM.match(path) or _OUTPUT_ARTIFACT.match(path)  # an output artifact's file, e.g. Markdown
        if m:
            return f"{self.job.outputs_dir}/{self.task}/{m['name']}"
        fixed = {
            ".pipeline_job_uuid": self.job.run_id,
            ".pipeline_job_name": f"{self.job.pipeline_name}-{self.job.run_id}",
            ".pipeline_job_resource_name": f"{self.job.pipeline_name}-{self.job.run_id}",
            ".pipeline_task_name": self.task,
            ".pipeline_task_uuid": str(uuid.uuid5(uuid.NAMESPACE_URL, f"{self.job.run_id}/{self.task}")),
            ".outputs.output_file": f"{self.job.outputs_dir}/{self.task}/output_metadata.json",
        }
        if path in fixed:
            return fixed[path]
        raise RehearsalError(f"task {self.task}: unknown placeholder {{{{${path}}}}}")

    def text(self, s: str) -> str:
        return _PLACEHOLDER.sub(lambda m: self.one(m["path"]), s)

    def element(self, item: Any, where: str) -> list[str]:
        """One command-line element: a string (maybe a serialised Concat/IfPresent) or such a struct."""
        if isinstance(item, str):
            struct = _as_struct(item)
            return [self.text(item)] if struct is None else self.element(struct, where)
        if isinstance(item, dict) and set(item) == {"Concat"}:
            return ["".join(part for x in item["Concat"] for part in self.element(x, where))]
        if isinstance(item, dict) and set(item) == {"IfPresent"}:
            spec = item["IfPresent"]
            name = spec.get("InputName")
            branch = spec.get("Then") if self.inputs.get(name) is not None else spec.get("Else")
            branch = [] if branch is None else branch if isinstance(branch, list) else [branch]
            return [s for x in branch for s in self.element(x, where)]
        raise RehearsalError(f"task {self.task}: {where}: unsupported command-line element {item!r}")


def _as_struct(s: str) -> dict[str, Any] | None:
    """The struct of a serialised `{"Concat": ...}` / `{"IfPresent": ...}` argument, else None."""
    if not s.startswith(('{"Concat"', '{"IfPresent"')):
        return None
    try:
        doc = json.loads(s)
    except json.JSONDecodeError:
        return None
    return doc if isinstance(doc, dict) and len(doc) == 1 else None


# ---- the DAG walk -------------------------------------------------------------------------------------
def _task_inputs(task_name: str, task: dict[str, Any], scope: Mapping[str, Any], job: JobContext,
                 prefix: str) -> dict[str, Any]:
    """A task's input parameters from its DAG scope: component inputs, task outputs, the final status, then the
    runtime constants (whose placeholders may name the other inputs, as `base_image` does)."""
    params = task.get("inputs", {}).get("parameters", {})
    if task.get("inputs", {}).get("artifacts"):
        raise RehearsalError(f"task {task_name}: inputs.artifacts: artifacts are not supported by the rehearsal")
    out: dict[str, Any] = {}
    constants: dict[str, Any] = {}
    for name, src in params.items():
        if "parameterExpressionSelector" in src:
            raise RehearsalError(f"task {task_name}: input {name}: parameterExpressionSelector is not supported")
        if "componentInputParameter" in src:
            ref = src["componentInputParameter"]
            if ref not in scope:
                raise RehearsalError(f"task {task_name}: input {name}: componentInputParameter {ref!r} is not in "
                                     f"the enclosing DAG's inputs")
            out[name] = scope[ref]  # None: an optional pipeline parameter left out (absent from the leaf)
        elif "runtimeValue" in src:
            constants[name] = src["runtimeValue"].get("constant")
        elif "taskOutputParameter" in src:
            ref = src["taskOutputParameter"]
            producer, key = f"{prefix}{ref.get('producerTask')}", ref.get("outputParameterKey")
            if key in job.outputs.get(producer, {}):
                out[name] = job.outputs[producer][key]
            elif job.defer_outputs:
                out[name] = PendingOutput(producer, key)
            else:
                raise RehearsalError(f"task {task_name}: input {name}: output {key!r} of task {producer!r} is not "
                                     f"known (outputs given: {sorted(job.outputs)})")
        elif "taskFinalStatus" in src:
            out[name] = {"state": job.final_state, "pipelineJobResourceName": f"{job.pipeline_name}-{job.run_id}",
                         "pipelineTaskName": src["taskFinalStatus"].get("producerTask", ""),
                         "error": dict(job.final_error)}
        else:
            raise RehearsalError(f"task {task_name}: input {name}: unsupported source {sorted(src)}")
    resolver = _Resolver(task_name, out, job)
    for name, value in constants.items():
        out[name] = resolver.text(value) if isinstance(value, str) else value
    return out


def _sibling_order(tasks: dict[str, Any], where: str) -> list[str]:
    """Sibling tasks in dependency order (dependentTasks first); a cycle or unknown name is an error."""
    order: list[str] = []
    state: dict[str, int] = {}

    def visit(name: str, chain: tuple[str, ...]) -> None:
        if state.get(name) == 2:
            return
        if state.get(name) == 1:
            raise RehearsalError(f"{where}: dependency cycle {' -> '.join((*chain, name))}")
        if name not in tasks:
            raise RehearsalError(f"{where}: task {chain[-1]} depends on unknown task {name!r}")
        state[name] = 1
        deps = list(tasks[name].get("dependentTasks", []))
        final = tasks[name].get("inputs", {}).get("parameters", {})
        deps += [p["taskFinalStatus"]["producerTask"] for p in final.values() if "taskFinalStatus" in p]
        for dep in deps:
            visit(dep, (*chain, name))
        state[name] = 2
        order.append(name)

    for name in sorted(tasks):
        visit(name, ())
    return order


class _Walker:
    def __init__(self, spec: dict[str, Any], platform: dict[str, Any], job: JobContext) -> None:
        self.spec, self.job = spec, job
        self.executors = spec["deploymentSpec"].get("executors", {})
        self.k8s = platform.get("platforms", {}).get("kubernetes", {}).get("deploymentSpec", {}).get("executors", {})
        self.names: dict[str, int] = {}

    def dag(self, dag: dict[str, Any], scope: Mapping[str, Any], inherited: tuple[str, ...], prefix: str,
            loop_item: Any, is_exit: bool) -> list[RehearsalTask]:
        tasks = dag.get("tasks", {})
        leaves: dict[str, list[RehearsalTask]] = {}
        for name in _sibling_order(tasks, prefix or "root"):
            t = tasks[name]
            key = f"{prefix}{name}"
            deps = set(inherited)
            for dep in t.get("dependentTasks", []):
                deps.update(x.key for x in leaves[dep])
            exit_here = is_exit or t.get("triggerPolicy", {}).get("strategy") == EXIT_STRATEGY
            if exit_here:
                for p in t.get("inputs", {}).get("parameters", {}).values():
                    if "taskFinalStatus" in p:
                        deps.update(x.key for x in leaves[p["taskFinalStatus"]["producerTask"]])
            inputs = _task_inputs(key, t, scope, self.job, prefix)
            condition = t.get("triggerPolicy", {}).get("condition")
            if condition and not condition_holds(key, condition, inputs):
                leaves[name] = []  # a dsl.If/dsl.Else branch not taken: none of its tasks run
                continue
            comp_name = t.get("componentRef", {}).get("name", "")
            comp = self.spec["components"].get(comp_name)
            if comp is None:
                raise RehearsalError(f"task {key}: componentRef {comp_name!r} is not in components")
            if "dag" in comp:
                leaves[name] = self.nested(key, t, comp, inputs, tuple(sorted(deps)), loop_item, exit_here)
            else:
                display = t.get("taskInfo", {}).get("name", name)
                leaves[name] = [self.leaf(key, display, comp, inputs, tuple(sorted(deps)), loop_item, exit_here)]
        return [x for name in tasks for x in leaves[name]]

    def nested(self, key: str, t: dict[str, Any], comp: dict[str, Any], inputs: dict[str, Any],
               deps: tuple[str, ...], loop_item: Any, is_exit: bool) -> list[RehearsalTask]:
        it = t.get("parameterIterator")
        if it is None:
            if "artifactIterator" in t:
                raise RehearsalError(f"task {key}: artifactIterator is not supported")
            return self.dag(comp["dag"], inputs, deps, f"{key}/", loop_item, is_exit)
        items_src = it.get("items", {})
        if "inputParameter" in items_src:
            items = inputs.get(items_src["inputParameter"])
        elif "raw" in items_src:
            items = json.loads(items_src["raw"])
        else:
            raise RehearsalError(f"task {key}: parameterIterator.items: expected inputParameter or raw")
        if not isinstance(items, list):
            raise RehearsalError(f"task {key}: ParallelFor over {items_src}: expected a list, got {items!r}")
        out = []
        for i, item in enumerate(items):
            scope = {**inputs, it["itemInput"]: item}
            out += self.dag(comp["dag"], scope, deps, f"{key}[{i}]/", item, is_exit)
        return out

    def leaf(self, key: str, display: str, comp: dict[str, Any], inputs: dict[str, Any], deps: tuple[str, ...],
             loop_item: Any, is_exit: bool) -> RehearsalTask:
        label = comp.get("executorLabel", "")
        executor = self.executors.get(label, {})
        container = executor.get("container")
        if container is None:
            raise RehearsalError(f"task {key}: executor {label!r}: only container executors are supported")
        declared = comp.get("inputDefinitions", {}).get("parameters", {})
        # the driver passes every task input, not only the declared ones; an optional one left out is absent
        values = {k: v for k, v in inputs.items() if v is not None}
        for k, d in declared.items():
            if k not in values and "defaultValue" in d:
                values[k] = typed(f"{key}.{k}", d["parameterType"], d["defaultValue"])
            elif k not in values and not d.get("isOptional", False):
                raise RehearsalError(f"task {key}: input {k}: required by component and not given")
        executor_input = json.dumps({
            "inputs": {"parameterValues": values},
            "outputs": {"outputFile": f"{self.job.outputs_dir}/{key}/output_metadata.json"},
        })
        r = _Resolver(key, inputs, self.job, executor_input)
        command = tuple(s for i, x in enumerate(container.get("command", [])) for s in r.element(x, f"command[{i}]"))
        args = tuple(s for i, x in enumerate(container.get("args", [])) for s in r.element(x, f"args[{i}]"))
        env = {e["name"]: r.text(str(e.get("value", ""))) for e in container.get("env", [])}
        try:
            env.update(platform_env(key, self.k8s.get(label, {}), inputs, pod_ip=self.job.pod_ip,
                                    secrets=self.job.secrets, config_maps=self.job.config_maps))
            if self.job.volumes is not None:
                env = volume_env(key, self.k8s.get(label, {}), env, self.job.volumes)
            resources = task_resources(key, container.get("resources", {}), r.text)
        except PlatformEnvError as err:
            raise RehearsalError(str(err)) from None
        left = [s for s in (*command, *args, *env.values()) if s != executor_input and "{{$" in s]
        if left:
            raise RehearsalError(f"task {key}: unresolved placeholder left in {left[0][:200]!r}")
        name = display if loop_item is None else f"{display}-{param_text(loop_item)}"
        n = self.names[name] = self.names.get(name, 0) + 1
        labels = self.k8s.get(label, {}).get("podMetadata", {}).get("labels", {})
        role = labels.get("asyncrl/role", display)
        return RehearsalTask(key=key, name=name if n == 1 else f"{name}-{n}", executor=label, command=command,
                             args=args, env=env, image=r.text(container.get("image", "")), inputs=values,
                             depends_on=deps, is_exit=is_exit, loop_item=loop_item, role=role,
                             outputs={k: d["parameterType"] for k, d in
                                      comp.get("outputDefinitions", {}).get("parameters", {}).items()},
                             pending=tuple(sorted({v.ref for v in inputs.values() if isinstance(v, PendingOutput)})),
                             resources=resources)

def task_commands(spec: dict[str, Any], platform: dict[str, Any], params: Mapping[str, Any], run_id: str, *,
                  secrets: Mapping[str, Mapping[str, str]] | None = None,
                  config_maps: Mapping[str, Mapping[str, str]] | None = None, final_state: str = "SUCCEEDED",
                  outputs_dir: str = "/tmp/kfp_outputs", pod_ip: str = "127.0.0.1",
                  outputs: Mapping[str, Mapping[str, Any]] | None = None,
                  defer_outputs: bool = False, volumes: Mapping[str, str] | None = None) -> list[RehearsalTask]:
    """Every leaf task of the pipeline, resolved; `params` are the resolved pipeline parameters
    (`resolve_parameters`), `run_id` stands for the KFP run id, `final_state` is the status the exit task gets,
    `outputs` the task output parameters known (by producer task key, e.g. "exit-handler-1/setup"); an unknown one
    is an error, or with `defer_outputs` a `PendingOutput` listed in the reading task's `pending`; `volumes` maps
    each disk volume's mount path to a local folder (env values under it move there; None: left as in the pod)."""
    job = JobContext(run_id=run_id, pipeline_name=spec.get("pipelineInfo", {}).get("name", "pipeline"),
                     final_state=final_state, outputs_dir=outputs_dir, pod_ip=pod_ip, secrets=secrets or {},
                     config_maps=config_maps or {}, outputs=outputs or {}, defer_outputs=defer_outputs,
                     volumes=volumes)
    walker = _Walker(spec, platform, job)
    return walker.dag(spec["root"]["dag"], dict(params), (), "", None, False)
