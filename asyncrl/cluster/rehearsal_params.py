"""Rehearsal, its inputs: the compiled pipeline's YAML, its typed parameters, and task output parameters.

Pure except `load_compiled` (reads one file). Used by `asyncrl.cluster.rehearsal` (which re-exports these names).
A task output parameter that is not known yet (its producer has not run) is a `PendingOutput`: a `str` whose text
names the producer and the output, so a task that reads one is resolved but marked pending, and resolved again once
the producer's output file is read (`parse_output`).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml


class RehearsalError(ValueError):
    """A pipeline the rehearsal cannot resolve; the message names the task and the field."""


class PendingOutput(str):
    """The stand-in value of output `output` of task `producer` (a task key) before that task has run."""

    producer: str
    output: str

    def __new__(cls, producer: str, output: str) -> PendingOutput:
        obj = super().__new__(cls, f"<pending output {output} of {producer}>")
        obj.producer, obj.output = producer, output
        return obj

    @property
    def ref(self) -> str:
        return f"{self.producer}:{self.output}"


def parse_output(task: str, name: str, kind: str, text: str) -> Any:
    """The value of output parameter `name` of `task` from the text its container wrote to the output file, as the
    KFP launcher reads it: a STRING as it is, any other type as JSON checked against `kind`."""
    if kind == "STRING":
        return text
    try:
        value = json.loads(text)
    except json.JSONDecodeError as err:
        raise RehearsalError(f"task {task}: output {name}: expected a JSON {kind} value, got {text[:80]!r}") from err
    return typed(f"{task}.{name}", kind, value)


# ---- the YAML and its parameters ----------------------------------------------------------------------
def load_compiled(path: Path | str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(pipeline_spec, platform_spec) of a compiled pipeline; the platform spec is {} when absent."""
    path = Path(path)
    try:
        docs = list(yaml.safe_load_all(path.read_text()))
    except (OSError, yaml.YAMLError) as err:
        raise RehearsalError(f"{path}: expected a compiled KFP pipeline YAML: {err}") from err
    docs = [d for d in docs if d is not None]
    if not docs or len(docs) > 2 or not all(isinstance(d, dict) for d in docs):
        raise RehearsalError(f"{path}: expected one or two YAML mappings (pipeline spec, platform spec), got "
                             f"{len(docs)} document(s)")
    spec, platform = docs[0], (docs[1] if len(docs) == 2 else {})
    for key in ("root", "components", "deploymentSpec"):
        if key not in spec:
            raise RehearsalError(f"{path}: the pipeline spec has no `{key}`: not a compiled KFP v2 pipeline")
    if platform and "platforms" not in platform:
        raise RehearsalError(f"{path}: the second document has no `platforms`: expected the platform spec")
    return spec, platform


def typed(name: str, kind: str, value: Any) -> Any:
    """`value` checked against a KFP parameterType (integral floats from YAML defaults become ints)."""
    ok: bool
    if kind == "NUMBER_INTEGER":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool)
    elif kind == "NUMBER_DOUBLE":
        ok = isinstance(value, int | float) and not isinstance(value, bool)
    elif kind == "STRING":
        ok = isinstance(value, str)
    elif kind == "BOOLEAN":
        ok = isinstance(value, bool)
    elif kind == "LIST":
        ok = isinstance(value, list)
    elif kind == "STRUCT":
        ok = isinstance(value, dict)
    else:
        raise RehearsalError(f"parameter {name}: unsupported parameterType {kind}")
    if not ok:
        raise RehearsalError(f"parameter {name}: expected a {kind} value, got {value!r}")
    return value


def resolve_parameters(spec: dict[str, Any], overrides: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """The pipeline's input parameters: declared defaults, replaced by `overrides` (each name must be declared
    and its value of the declared type); an optional one without a default or a value is None (left out); a
    required parameter without a value is an error."""
    declared = spec["root"].get("inputDefinitions", {}).get("parameters", {})
    overrides = dict(overrides or {})
    unknown = sorted(set(overrides) - set(declared))
    if unknown:
        raise RehearsalError(f"parameter {unknown[0]}: not a parameter of this pipeline; expected one of "
                             f"{sorted(declared)}")
    out: dict[str, Any] = {}
    for name, d in declared.items():
        if name in overrides:
            out[name] = typed(name, d["parameterType"], overrides[name])
        elif "defaultValue" in d:
            out[name] = typed(name, d["parameterType"], d["defaultValue"])
        elif d.get("isOptional", False):
            out[name] = None  # left out: a task input it feeds is absent (an IfPresent placeholder passes nothing)
        else:
            raise RehearsalError(f"parameter {name}: required (no default), give a value")
    return out


def param_text(value: Any) -> str:
    """A parameter as the KFP launcher writes it into a command line: strings as they are, integral numbers
    without a fraction, booleans lowercase, lists and structs as compact JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float) and value.is_integer():
        return str(int(value))
    if isinstance(value, int | float):
        return repr(value)
    return json.dumps(value, separators=(",", ":"))
