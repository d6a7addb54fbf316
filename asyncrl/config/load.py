"""Loading a `RunConfig` from YAML plus `--set section.key=value` overrides, with readable errors.

Every failure raises `ConfigError` whose message names the file or the dotted field and what was
expected; the CLI prints it and exits non-zero before any process starts:
- a YAML syntax error or a duplicate key: `FILE:LINE:COLUMN: ...` (1-based);
- a file that is missing, a folder, unreadable or not UTF-8: the file and what was expected;
- a wrong value: `section.key: expected ... (got VALUE)`; an unknown key: the key, with the closest known key of
  its section when one is close ("did you mean ..."); a wrong name (loss, task, ...): the known names;
- a check across fields: the field it blames, as `section.key: expected ...`.
Pure logic except `load_config`, which reads the one file.
"""

from __future__ import annotations

import difflib
import json
from collections.abc import Mapping
from pathlib import Path
from typing import Any, get_args

import yaml
from pydantic import BaseModel, ValidationError

from asyncrl.config.schema import RunConfig

MAX_VALUE_CHARS = 200
CACHE_DIR_ENV = "ASYNCRL_CACHE_DIR"  # replaces cache_dir in this process (`with_cache_dir_from_env`)


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


class _UniqueKeyLoader(yaml.SafeLoader):
    """SafeLoader that refuses a key given twice in one mapping (plain YAML keeps the last one silently)."""


def _construct_unique_mapping(loader: _UniqueKeyLoader, node: yaml.MappingNode, deep: bool = False) -> Any:
    seen: set[Any] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=deep)
        try:
            duplicate = key in seen
            seen.add(key)
        except TypeError:  # an unhashable key: the base constructor reports it
            continue
        if duplicate:
            mark = key_node.start_mark
            raise yaml.constructor.ConstructorError(None, None, f"duplicate key {key!r}", mark)
    return yaml.SafeLoader.construct_mapping(loader, node, deep=deep)


_UniqueKeyLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_unique_mapping)


def parse_yaml(text: str, source: str) -> Any:
    """Pure: the YAML document in `text`; `ConfigError` naming `source`, the line and the column on a syntax error
    or a duplicate key."""
    loader = _UniqueKeyLoader(text)  # a SafeLoader subclass: plain data only, no object construction
    try:
        return loader.get_single_data()
    except yaml.MarkedYAMLError as err:
        mark = err.problem_mark or err.context_mark
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark is not None else source
        what = err.problem or "syntax error"
        context = f" ({err.context}" if err.context else ""
        if context and err.context_mark is not None and err.problem_mark is not None \
                and err.context_mark.line != err.problem_mark.line:
            context += f" started at line {err.context_mark.line + 1}, column {err.context_mark.column + 1}"
        context += ")" if context else ""
        raise ConfigError(f"{where}: not valid YAML: {what}{context}") from None
    except yaml.YAMLError as err:
        raise ConfigError(f"{source}: not valid YAML: {err}") from None
    finally:
        loader.dispose()


def _section_model(loc: tuple[Any, ...]) -> type[BaseModel] | None:
    """The schema section at the dotted path `loc` (None when it is not a section)."""
    model: type[BaseModel] = RunConfig
    for key in loc:
        field = model.model_fields.get(str(key))
        if field is None:
            return None
        candidates = [field.annotation, *get_args(field.annotation)]
        model_next = next((c for c in candidates if isinstance(c, type) and issubclass(c, BaseModel)), None)
        if model_next is None:
            return None
        model = model_next
    return model


def _unknown_key_message(loc: tuple[Any, ...]) -> str:
    section = _section_model(loc[:-1])
    known = sorted(section.model_fields) if section is not None else []
    close = difflib.get_close_matches(str(loc[-1]), known, n=1, cutoff=0.6)
    hint = f"; did you mean {'.'.join([*map(str, loc[:-1]), close[0]])!r}?" if close else ""
    if close:
        return f"unknown field{hint}"
    where = ".".join(map(str, loc[:-1])) or "the top level"
    listed = f"known fields of {where}: {', '.join(known)}; " if known else ""
    return f"unknown field ({listed}see the configuration reference in README.md)"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= MAX_VALUE_CHARS else text[: MAX_VALUE_CHARS - 3] + "..."


def _blamed_field(msg: str) -> str | None:
    """The dotted field a cross-field message starts with (`a.b: expected ...`), else None."""
    head, sep, _ = msg.partition(": ")
    if sep and head and all(part.isidentifier() for part in head.split(".")):
        return head
    return None


def format_validation_error(err: ValidationError, source: str) -> str:
    """Pure: one line per error, each naming the dotted field, what was expected and what was given."""
    lines = [f"invalid configuration ({source}):"]
    for e in err.errors():
        loc = tuple(e["loc"])
        field = ".".join(str(p) for p in loc)
        msg = e["msg"].removeprefix("Value error, ").removeprefix("Assertion failed, ")
        got = e.get("input")
        got_s = "" if isinstance(got, dict) else f" (got {_short(got)})"
        if e["type"] == "extra_forbidden":
            msg, got_s = _unknown_key_message(loc), ""
        elif e["type"] == "literal_error":
            close = difflib.get_close_matches(str(got), [a.strip("'") for a in
                                                         e.get("ctx", {}).get("expected", "").replace(" or ", ", ")
                                                         .split(", ")], n=1, cutoff=0.6)
            got_s += f"; did you mean {close[0]!r}?" if close else ""
        elif e["type"] in ("model_type", "model_attributes_type", "dict_type"):
            msg = "expected a section: a mapping of its fields (key: value lines under it)"
        elif e["type"] == "value_error":
            blamed = _blamed_field(msg)
            if blamed is not None:  # a model validator's message names its own field
                got_s = ""
                if not blamed.startswith(field):
                    msg = f"{field}.{msg}" if field else msg
                lines.append(f"  {msg}")
                continue
        lines.append(f"  {field or 'configuration'}: {msg}{got_s}")
    return "\n".join(lines)


def config_from_dict(data: dict[str, Any], source: str = "<dict>") -> RunConfig:
    try:
        return RunConfig.model_validate(data)
    except ValidationError as err:
        raise ConfigError(format_validation_error(err, source)) from None


def load_config(path: str | Path | None, overrides: list[str] | tuple[str, ...] = ()) -> RunConfig:
    """Read YAML at `path` (None: all defaults), apply overrides, validate everything."""
    data: dict[str, Any] = {}
    source = "defaults"
    if path is not None:
        p = Path(path)
        source = str(p)
        if p.is_dir():
            raise ConfigError(f"{p}: is a folder, expected a YAML configuration file")
        if not p.is_file():
            raise ConfigError(f"{p}: no such configuration file")
        try:
            text = p.read_text(encoding="utf-8")
        except UnicodeDecodeError as err:
            raise ConfigError(f"{p}: expected a UTF-8 YAML text file, byte {err.start} is not UTF-8") from None
        except OSError as err:
            raise ConfigError(f"{p}: cannot read the configuration file: {err.strerror or err}") from None
        loaded = parse_yaml(text, str(p))
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


def with_cache_dir_from_env(cfg: RunConfig, environ: Mapping[str, str]) -> RunConfig:
    """`cfg` with `cache_dir` from ASYNCRL_CACHE_DIR when that is set (the pipeline sets it in every pod to its cache
    volume: where a process keeps built and fetched models is its machine's, not the run's); else `cfg` itself."""
    value = environ.get(CACHE_DIR_ENV, "")
    if not value:
        return cfg
    if not Path(value).is_absolute():
        raise ConfigError(f"{CACHE_DIR_ENV}: expected an absolute folder (the pod's cache volume), got {value!r}")
    return cfg.model_copy(update={"cache_dir": value})


def config_from_json(text: str, source: str) -> RunConfig:
    """Parse the resolved config that the launcher wrote to S3 (`config.json`)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError as err:
        raise ConfigError(f"{source}: not valid JSON: {err}") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{source}: expected a JSON object")
    return config_from_dict(data, source)
