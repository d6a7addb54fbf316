"""Objects a run's config names by import path, "package.module:attribute": a user's environment class (`env.name`)
and a user's reward function (`task.reward`).

`import_object(path, what)` imports the module and walks the attribute (nested names with dots); it calls nothing
the path names. Every error is a ValueError that names `what`, the path and the problem: a malformed path, a module
that cannot be imported (with the fix: install it, or put its folder on PYTHONPATH), a module that raised while
importing, a missing attribute. The caller checks what kind of object it got.
"""

from __future__ import annotations

import importlib
import re
from types import ModuleType
from typing import Any

IMPORT_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z_]\w*(\.[A-Za-z_]\w*)*$")


def is_import_path(name: str) -> bool:
    """Whether `name` is meant as an import path ("package.module:attribute") rather than a built-in name."""
    return ":" in name


def import_module_of(path: str, what: str, form: str = "an import path 'package.module:attribute'"
                     ) -> tuple[ModuleType, str]:
    """The module of `path`, imported now, and the attribute part of the path; ValueError naming `what` and `path`
    otherwise. (A loss's module registers the loss when imported: `training.loss` needs only this.)"""
    if not IMPORT_PATH.match(path):
        raise ValueError(f"{what} {path!r}: expected {form}")
    module_name, _, attribute = path.partition(":")
    try:
        return importlib.import_module(module_name), attribute
    except ImportError as e:
        raise ValueError(f"{what} {path!r}: cannot import module {module_name!r} ({e}); install it in the "
                         f"run's Python environment or put its folder on PYTHONPATH") from e
    except Exception as e:  # the module itself failed while being imported
        raise ValueError(f"{what} {path!r}: importing module {module_name!r} raised {type(e).__name__}: {e}") from e


def import_object(path: str, what: str, form: str = "an import path 'package.module:attribute'") -> Any:
    """The object `path` names (imported now); ValueError naming `what` and `path` otherwise (a malformed path:
    "expected `form`")."""
    target: Any
    target, attribute = import_module_of(path, what, form)
    for part in attribute.split("."):
        if not hasattr(target, part):
            raise ValueError(f"{what} {path!r}: module {target.__name__!r} has no attribute {attribute!r}")
        target = getattr(target, part)
    return target
