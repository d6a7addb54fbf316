"""Loading a `RunConfig` from YAML plus `--set section.key=value` overrides, with readable errors.

Every failure raises `ConfigError` whose message names the file or the dotted field and what was
expected; the CLI prints it and exits non-zero before any process starts.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from asyncrl.config.schema import RunConfig


class ConfigError(ValueError):
    """A configuration file or value is wrong; the message says where and what was expected."""


def _parse_value(raw: str) -> Any:
    """Parse an override value as YAML (so `3`, `0.5`, `true`, `[1, 2]`, `null` get their types)."""
    try:
        return yaml.safe_load(raw)
    except yaml.YAMLError:
        return raw


def apply_override(data: dict[str, Any], assignment: str) -> None:
    """Apply one `a.b.c=value` assignment to a nested dict in place."""
    if "=" not in assignment:
        raise ConfigError(f"--set {assignment!r}: expected section.key=value")
    dotted, raw = assignment.split("=", 1)
    keys = dotted.strip().split(".")
    if not all(keys):
        raise ConfigError(f"--set {assignment!r}: expected a dotted field name such as training.lr")
    node = data
    for i, key in enumerate(keys[:-1]):
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise ConfigError(f"--set {assignment!r}: {'.'.join(keys[: i + 1])} is not a section")
        node = child
    node[keys[-1]] = _parse_value(raw)


def _format_validation_error(err: ValidationError, source: str) -> str:
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        field = ".".join(str(p) for p in e["loc"]) or "<root>"
        msg = e["msg"].removeprefix("Value error, ")
        if e["type"] == "extra_forbidden":
            msg = "unknown field (check the spelling; see the configuration reference in README.md)"
        got = e.get("input")
        got_s = "" if isinstance(got, dict) or e["type"] == "extra_forbidden" else f" (got {got!r})"
        lines.append(f"  {field}: {msg}{got_s}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(_format_validation_error(err, source)) from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read YAML at `path` (None: all defaults), apply overrides, validate everything."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if not p.is_file():
            raise ConfigError(f"{p}: no such configuration file")
        try:
            loaded = yaml.safe_load(p.read_text())
        except yaml.YAMLError as err:
            raise ConfigError(f"{p}: not valid YAML: {err}") from None
        if loaded is None:
            loaded = {}
        if not isinstance(loaded, dict):
            raise ConfigError(f"{p}: expected a mapping of sections at the top level, got {type(loaded).__name__}")
        data = loaded
    for assignment in overrides:
        apply_override(data, assignment)
    if overrides:
        source += " with --set " + " ".join(overrides)
    return config_from_dict(data, source)


def config_from_json(text: str, source: str) -> RunConfig:
    """Parse the resolved config that the launcher wrote to S3 (`config.json`)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    return config_from_dict(data, source)
