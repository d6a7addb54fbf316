"""The configuration reference as Markdown, rendered from the schema (README.md embeds it; a test keeps it fresh)."""

from __future__ import annotations

from typing import Any, Literal, get_args, get_origin

from pydantic import BaseModel
from pydantic_core import PydanticUndefined

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


def _rows(model: type[BaseModel], prefix: str) -> list[str]:
    rows: list[str] = []
    for name, field in model.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            rows += _rows(ann, f"{prefix}{name}.")
            continue
        bounds = [f"{symbol} {getattr(m, attr)}" for m in field.metadata for attr, symbol in _BOUNDS
                  if hasattr(m, attr)]
        desc = (field.description or "").replace("|", "\\|")
        rows.append(f"| `{prefix}{name}` | {_type_name(ann)} | {_default(field)} | {', '.join(bounds)} | {desc} |")
    return rows


def config_reference() -> str:
    head = ["| field | type | default | bounds | meaning |", "| --- | --- | --- | --- | --- |"]
    return "\n".join(head + _rows(RunConfig, "")) + "\n"
