"""Rehearsal: the `dsl.If`/`dsl.Else` conditions of a compiled pipeline, evaluated as the KFP driver would.

KFP compiles `dsl.If(param == 1)` into a CEL `triggerPolicy.condition` on the branch's DAG task, such as
`int(inputs.parameter_values['pipelinechannel--training_nodes']) == 1`, and its `dsl.Else` into the negation
`!(...)`. The rehearsal supports exactly that form: an optional `!( )` around `int(...)` or a plain
`inputs.parameter_values['x']` compared (==, !=, <, <=, >, >=) with an integer or a quoted string literal. Anything
else is a `RehearsalError` naming the task, so an unsupported condition never silently runs or skips a branch.
"""

from __future__ import annotations

import operator
import re
from collections.abc import Callable, Mapping
from typing import Any

from asyncrl.cluster.rehearsal_params import PendingOutput, RehearsalError

_COMPARE = re.compile(
    r"""^(?P<cast>int\()?inputs\.parameter_values\['(?P<name>[^']+)'\](?(cast)\))\s*(?P<op>==|!=|<=|>=|<|>)\s*"""
    r"""(?P<value>-?\d+|'[^']*'|"[^"]*")$""")
_OPS: dict[str, Callable[[Any, Any], bool]] = {"==": operator.eq, "!=": operator.ne, "<": operator.lt,
                                                "<=": operator.le, ">": operator.gt, ">=": operator.ge}


def condition_holds(task: str, condition: str, inputs: Mapping[str, Any]) -> bool:
    """Whether the branch task `task` runs, given its resolved input parameters."""
    text = " ".join(condition.split())
    negate = text.startswith("!(") and text.endswith(")")
    body = text[2:-1].strip() if negate else text
    m = _COMPARE.match(body)
    if m is None:
        raise RehearsalError(f"task {task}: triggerPolicy.condition {condition!r}: only `[!(]int(inputs."
                             f"parameter_values['x']) OP literal[)]` is supported by the rehearsal")
    name, literal = m.group("name"), m.group("value")
    if name not in inputs:
        raise RehearsalError(f"task {task}: triggerPolicy.condition names input {name!r}, which the task lacks")
    value = inputs[name]
    if isinstance(value, PendingOutput):
        raise RehearsalError(f"task {task}: triggerPolicy.condition on a task output is not supported")
    if m.group("cast"):
        try:
            left: Any = int(value)
        except (TypeError, ValueError):
            raise RehearsalError(f"task {task}: triggerPolicy.condition: input {name!r} = {value!r} is not an "
                                 f"integer") from None
    else:
        left = value
    right: Any = int(literal) if literal[0] not in "'\"" else literal[1:-1]
    try:
        holds = _OPS[m.group("op")](left, right)
    except TypeError:
        raise RehearsalError(f"task {task}: triggerPolicy.condition compares {left!r} with {right!r}") from None
    return (not holds) if negate else bool(holds)
