"""`asyncrl.run.create.check_cluster_config` (called by `asyncrl.cluster.setup`): on a cluster, a tool-use run that
may call <python> names the sandbox pool; every other run passes."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.config import ConfigError, RunConfig
from asyncrl.run.create import check_cluster_config


def _cfg(env: dict[str, Any] | None) -> RunConfig:
    return RunConfig.model_validate({"env": env} if env is not None else {})


def test_tool_use_with_python_needs_the_sandbox_url() -> None:
    with pytest.raises(ConfigError, match=r"env\.params\.sandbox_url: expected the tool sandbox service's URL"):
        check_cluster_config(_cfg({"name": "tool_use"}))


@pytest.mark.parametrize("env", [
    None,
    {"name": "frozenlake"},
    {"name": "tool_use", "params": {"allow_python": False}},
    {"name": "tool_use", "params": {"sandbox_url": "http://asyncrl-sandbox.asyncrl-sandbox.svc.cluster.local:8080"}},
])
def test_other_runs_pass(env: dict[str, Any] | None) -> None:
    check_cluster_config(_cfg(env))
