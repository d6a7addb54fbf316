"""The roles' environment the embedded launcher builds (`EmbeddedRun.child_env`): the run's folder as a marker, vLLM's
cache shared by runs under `cache_dir` (unless the user set one), no torch.distributed launcher variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from asyncrl.config import RunConfig
from asyncrl.local.launcher import EmbeddedRun, ExternalS3


@pytest.fixture
def s3(monkeypatch: pytest.MonkeyPatch) -> ExternalS3:
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "id")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "secret")
    return ExternalS3("http://127.0.0.1:1", "us-east-1")


def _run(tmp_path: Path) -> EmbeddedRun:
    cfg = RunConfig(run_id="env-test", runs_dir=str(tmp_path / "runs"), cache_dir=str(tmp_path / "cache"))
    return EmbeddedRun(cfg)


def test_vllm_cache_is_shared_by_runs_and_the_run_folder_is_named(tmp_path: Path, s3: ExternalS3,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("VLLM_CACHE_ROOT", raising=False)
    monkeypatch.setenv("MASTER_PORT", "12345")
    env = _run(tmp_path).child_env(s3)
    assert env["VLLM_CACHE_ROOT"] == str((tmp_path / "cache").resolve() / "vllm")
    assert env["ASYNCRL_RUN_DIR"] == str((tmp_path / "runs" / "env-test").resolve())
    assert "MASTER_PORT" not in env and env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:1"


def test_a_vllm_cache_the_user_set_is_kept(tmp_path: Path, s3: ExternalS3, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("VLLM_CACHE_ROOT", str(tmp_path / "mine"))
    assert _run(tmp_path).child_env(s3)["VLLM_CACHE_ROOT"] == str(tmp_path / "mine")
