"""The pipeline's one configuration precedence rule, applied by the `setup` step. Pure: no I/O.

    built-in defaults  <  config_yaml  <  the run form's config fields  <  the `overrides` list

A config field of the run form (`steps`, `loss`, ...) is an optional pipeline parameter: left empty it passes
nothing (the setup component's `dsl.IfPresentPlaceholder`), so the configuration's own value stands; filled in, it
wins over `config_yaml`, and `overrides` win over both. The parameters that shape the DAG or the pods (the replica
ids, the training GPUs) or say where the run lives (bucket, prefix, MLflow URI) are authoritative: the pods are
what they are, so a configuration (YAML or overrides) that sets such a field to another value is refused
(`PrecedenceError`, naming the field and both values) instead of being silently replaced. Every difference applied
to the configuration's value is returned as a line for setup's log.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from asyncrl.config import ConfigError, RunConfig
from asyncrl.config.load import apply_override, config_from_dict, parse_yaml

_MISSING = object()


class PrecedenceError(ConfigError):
    """The configuration contradicts an authoritative pipeline parameter; the message names both values."""


@dataclass(frozen=True)
class Authoritative:
    """A config field a pipeline parameter decides: `field` must be `value` (`parameter` shown as `shown`)."""

    field: str
    value: Any
    parameter: str
    shown: str


@dataclass
class ResolvedConfig:
    """The validated configuration and the differences applied to what the configuration said, one line each."""

    cfg: RunConfig
    changes: list[str] = field(default_factory=list)


def _lookup(data: dict[str, Any], dotted: str) -> Any:
    node: Any = data
    for key in dotted.split("."):
        if not isinstance(node, dict) or key not in node:
            return _MISSING
        node = node[key]
    return node


def _default(dotted: str) -> Any:
    value = _lookup(RunConfig().model_dump(mode="json"), dotted)
    return None if value is _MISSING else value


def _shown(value: Any) -> str:
    return json.dumps(value) if not isinstance(value, str) else repr(value)


def _same(a: Any, b: Any) -> bool:
    """YAML may write `2` or `"2"`; the schema reads both as 2."""
    return a == b or str(a) == str(b)


def _apply(data: dict[str, Any], assignment: str, source: str, changes: list[str]) -> None:
    dotted = assignment.split("=", 1)[0].strip()
    before = _lookup(data, dotted)
    before = _default(dotted) if before is _MISSING else before
    apply_override(data, assignment)
    after = _lookup(data, dotted)
    if not _same(before, after):
        changes.append(f"{dotted}: {_shown(before)} -> {_shown(after)} ({source})")


def resolve_run_config(config_yaml: str, form: list[str], overrides: list[str],
                       authoritative: list[Authoritative], forced: list[str], run_id: str) -> ResolvedConfig:
    """The run's configuration: `config_yaml` (empty: defaults), then `form` (`section.key=value` from the run
    form's fields that were given), then `overrides`; then each `authoritative` field, which the configuration may
    leave out or set to the same value (else `PrecedenceError`); then `forced` (set by the cluster, e.g. the S3
    endpoint) and the run id. ConfigError names the bad field."""
    loaded = parse_yaml(config_yaml, "config_yaml") if config_yaml.strip() else {}
    if loaded is None:
        loaded = {}
    if not isinstance(loaded, dict):
        raise ConfigError(f"config_yaml: expected a mapping of sections at the top level, got "
                          f"{type(loaded).__name__}")
    data: dict[str, Any] = loaded
    changes: list[str] = []
    for item in form:
        _apply(data, item, "form field", changes)
    for item in overrides:
        _apply(data, item, "overrides", changes)
    for a in authoritative:
        said = _lookup(data, a.field)
        if said is not _MISSING and not _same(said, a.value):
            raise PrecedenceError(
                f"{a.field}: the configuration (config_yaml or overrides) says {_shown(said)}, but the pipeline "
                f"parameter {a.parameter} = {a.shown} makes it {_shown(a.value)}; the parameter shapes the pods, so "
                f"it is not overridden: make them agree (set {a.parameter}, or drop {a.field} from the "
                f"configuration, or set it to {_shown(a.value)})")
        _apply(data, f"{a.field}={a.value}" if not isinstance(a.value, str) else f"{a.field}={json.dumps(a.value)}",
               f"pipeline parameter {a.parameter}", changes)
    for item in forced:
        _apply(data, item, "cluster", changes)
    data["run_id"] = run_id
    return ResolvedConfig(config_from_dict(data, "config_yaml + pipeline parameters"), changes)
