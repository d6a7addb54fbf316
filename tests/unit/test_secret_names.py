"""Names that hold secrets, and the environment an environment worker process is started with."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from asyncrl.envs import worker
from asyncrl.envs.execution import EnvExecutor
from asyncrl.secret_names import is_secret_key, without_secrets

RUN_SECRETS = {"AWS_ACCESS_KEY_ID": "AKIA", "AWS_SECRET_ACCESS_KEY": "s", "AWS_SESSION_TOKEN": "t",
               "ASYNCRL_ROLE_TOKEN": "r" * 32, "MLFLOW_TRACKING_TOKEN": "m", "MLFLOW_TRACKING_PASSWORD": "p",
               "HF_TOKEN": "h"}
KEPT = {"PATH": "/usr/bin", "HOME": "/root", "AWS_ENDPOINT_URL": "http://s3", "MAX_NEW_TOKENS": "6",
        "PYTHONPATH": "/x"}


def test_secret_variables_are_recognised_and_dropped() -> None:
    assert all(is_secret_key(k) for k in RUN_SECRETS)
    assert not any(is_secret_key(k) for k in KEPT)
    assert without_secrets({**RUN_SECRETS, **KEPT}) == KEPT


def test_environment_workers_start_without_the_runs_secrets(monkeypatch: pytest.MonkeyPatch) -> None:
    for k, v in {**RUN_SECRETS, **KEPT}.items():
        monkeypatch.setenv(k, v)
    seen: dict[str, Any] = {}

    async def fake_exec(*args: Any, **kwargs: Any) -> Any:  # the fault injected: no process, just the call
        seen.update(kwargs)
        raise OSError("stop here")

    monkeypatch.setattr(asyncio, "create_subprocess_exec", fake_exec)
    with pytest.raises(OSError, match="stop here"):
        asyncio.run(worker.open_process(EnvExecutor("processes", 1, 5.0), "tool_use", {}, None, 0))
    env = seen["env"]
    assert not set(RUN_SECRETS) & set(env) and env["PATH"] == "/usr/bin" and env["AWS_ENDPOINT_URL"] == "http://s3"
