"""The rehearsal evaluates the dsl.If/dsl.Else conditions KFP compiles (asyncrl/cluster/rehearsal_condition.py)."""

from __future__ import annotations

import pytest

from asyncrl.cluster.rehearsal_condition import condition_holds
from asyncrl.cluster.rehearsal_params import PendingOutput, RehearsalError

ONE = "int(inputs.parameter_values['pipelinechannel--training_nodes']) == 1"


@pytest.mark.parametrize(("condition", "nodes", "holds"), [
    (ONE, 1, True), (ONE, 2, False), (f"!({ONE})", 2, True), (f"!({ONE})", 1, False),
    ("int(inputs.parameter_values['pipelinechannel--training_nodes']) >= 2", 3, True),
    ("int(inputs.parameter_values['pipelinechannel--training_nodes'])\n  == 1", "1", True)])
def test_compiled_conditions(condition: str, nodes: object, holds: bool) -> None:
    assert condition_holds("t", condition, {"pipelinechannel--training_nodes": nodes}) is holds


def test_string_comparison() -> None:
    cond = "inputs.parameter_values['pipelinechannel--engine'] == 'trainjob'"
    assert condition_holds("t", cond, {"pipelinechannel--engine": "trainjob"})
    assert not condition_holds("t", cond, {"pipelinechannel--engine": "pytorchjob"})


@pytest.mark.parametrize(("condition", "inputs", "message"), [
    ("inputs.parameter_values['a'] in ['x']", {"a": "x"}, "only `\\[!\\(\\]int"),
    (ONE, {}, "names input 'pipelinechannel--training_nodes', which the task lacks"),
    (ONE, {"pipelinechannel--training_nodes": "two"}, "is not an integer"),
    (ONE, {"pipelinechannel--training_nodes": PendingOutput("p", "o")}, "on a task output is not supported")])
def test_unsupported_or_bad_conditions_name_the_task(condition: str, inputs: dict, message: str) -> None:
    with pytest.raises(RehearsalError, match=f"task branch-7: .*{message}"):
        condition_holds("branch-7", condition, inputs)
