"""The configuration reference as Markdown, rendered from the schema (README.md embeds it; a test keeps it fresh)."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

from asyncrl.config.loss_params import BUILTIN_LOSSES, LossParams
from asyncrl.config.schema import RunConfig

_BOUNDS = [("ge", "≥"), ("gt", ">"), ("le", "≤"), ("lt", "<"), ("multiple_of", "multiple of"),
           ("min_length", "min length"), ("max_length", "max length")]


def _type_name(annotation: Any) -> str:
    if get_origin(annotation) is Literal:
        return "one of " + ", ".join(f"`{a}`" for a in get_args(annotation))
    text = annotation.__name__ if isinstance(annotation, type) else str(annotation)
    return text.replace("typing.", "").replace("|", "or")


def _default(field: Any) -> str:
    if field.default_factory is not None:
        value = field.default_factory()
    elif field.default is PydanticUndefined:
        return "required"
    else:
        value = field.default
    return "`" + ("\"\"" if value == "" else repr(value) if not isinstance(value, str) else value) + "`"


def _optional_section(annotation: Any) -> type[BaseModel] | None:
    """The section class of an `XConfig | None` field, else None."""
    args = [a for a in get_args(annotation) if a is not type(None)]
    if len(args) == 1 and len(get_args(annotation)) == 2 and isinstance(args[0], type) and issubclass(args[0], BaseModel):
        return args[0]
    return None


def _loss_params_rows(name: str, field: Any, prefix: str) -> list[str]:
    """The row of the `loss_params` field, then each built-in loss's parameters, marked with the loss."""
    desc = (field.description or "").replace("|", "\\|")
    rows = [f"| `{prefix}{name}` | section, by `{prefix}loss` | the loss's defaults |  | {desc} |"]
    for loss, params in BUILTIN_LOSSES.items():
        rows += [row.replace(f"| `{prefix}{name}.{key}` |", f"| `{prefix}{name}.{key}` (loss `{loss}`) |")
                 for key, row in zip(params.model_fields, _rows(params, f"{prefix}{name}."), strict=True)]
    return rows


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if ann is LossParams:
            rows += _loss_params_rows(name, field, prefix)
            continue
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, f"{prefix}{name}.")
            continue
        section = _optional_section(ann)
        if section is not None:
            desc = (field.description or "").replace("|", "\\|")
            rows.append(f"| `{prefix}{name}` | section or null | `null` (off) |  | {desc} Set it (`{{}}` for the "
                        "defaults below) to turn it on. |")
            rows += _rows(section, f"{prefix}{name}.")
            continue
        bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata for attr, symbol in _BOUNDS
                  if hasattr(m, attr)]
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type_name(ann)} | {_default(field)} | {', '.join(bounds)} | {desc} |")
    return rows


def config_reference() -> str:
    head = ["| field | type | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    return "\n".join(head + _rows(RunConfig, "")) + "\n"
