"""Secrets never land in artifacts: the compiled pipeline YAML holds no secret value and gets the role token only
through the Kubernetes secret `asyncrl-role-token` (secretAsEnv); the config has no secret-looking field; the
params a run logs to MLflow (real sqlite store) hold neither the role token nor the S3 keys."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from asyncrl.config import load_config
from asyncrl.local.launcher import EmbeddedRun
from asyncrl.rpc.auth import TOKEN_ENV
from asyncrl.tracking.mlflow_tracker import Tracker, embedded_tracking_uri, flatten_params, is_secret_key

ROOT = Path(__file__).resolve().parents[2]
PIPELINE_YAML = ROOT / "asyncrl" / "cluster" / "pipeline" / "asyncrl.yaml"
ROLE_TOKEN_SECRET = "asyncrl-role-token"
SECRET_ENV = (TOKEN_ENV, "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


def _docs(path: Path = PIPELINE_YAML) -> tuple[dict[str, Any], dict[str, Any]]:
    pipeline, platform = list(yaml.safe_load_all(path.read_text()))
    return pipeline, platform


def _executors(platform: dict[str, Any]) -> dict[str, Any]:
    return platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]


def check_no_secret_values(path: Path) -> None:
    """No secret-named env var gets a literal value, no parameter is secret-looking, no token-shaped literal."""
    pipeline, _ = _docs(path)
    for name, ex in pipeline["deploymentSpec"]["executors"].items():
        container = ex.get("container", {})
        for env in container.get("env", []):
            assert env["name"] not in SECRET_ENV, f"{name}: {env['name']} set as a literal env value"
        argv = " ".join(map(str, container.get("command", []) + container.get("args", [])))
        assert TOKEN_ENV not in argv and "AWS_SECRET_ACCESS_KEY" not in argv, f"{name}: a secret in argv"
    params = pipeline["root"]["inputDefinitions"]["parameters"]
    assert not [p for p in params if is_secret_key(p)], params
    text = path.read_text()
    # a generated token (secrets.token_urlsafe(32): 43 url-safe characters) or a 40-char S3 secret key
    shaped = [s for s in re.findall(r"(?<![A-Za-z0-9_-])[A-Za-z0-9_+/=-]{40,}(?![A-Za-z0-9_-])", text)
              if not s.startswith("pipelinechannel--")]
    assert not shaped, f"token-shaped literals in {path.name}: {shaped[:3]}"


def check_role_token_mapping(path: Path) -> None:
    """Every task (the four roles, setup and finalize) gets ASYNCRL_ROLE_TOKEN from the secret, and only so; the
    multi-node training launcher gets no secret."""
    pipeline, platform = _docs(path)
    executors = _executors(platform)
    assert set(executors) == set(pipeline["deploymentSpec"]["executors"]), "a task without platform env"
    for name, ex in executors.items():
        if name == "exec-training-job-launcher":  # the multi-node training task: no secret at all (its job's
            assert not ex.get("secretAsEnv"), name  # pods map theirs: tests/unit/test_training_job.py)
            continue
        entries = [e for e in ex.get("secretAsEnv", []) if e.get("secretName") == ROLE_TOKEN_SECRET]
        assert len(entries) == 1, f"{name}: expected one secretAsEnv of {ROLE_TOKEN_SECRET}, got {entries}"
        assert entries[0]["keyToEnv"] == [{"secretKey": TOKEN_ENV, "envVar": TOKEN_ENV}], name
        assert not entries[0].get("optional", False), f"{name}: the role token must not be optional"
        others = [e for e in ex.get("secretAsEnv", []) if e is not entries[0]]
        assert all(k["envVar"] != TOKEN_ENV for e in others for k in e["keyToEnv"]), name
        assert all(c.get("configMapKey") != TOKEN_ENV and c.get("envVar") != TOKEN_ENV
                   for m in ex.get("configMapAsEnv", []) for c in m.get("keyToEnv", [])), name


def test_compiled_pipeline_holds_no_secret_value() -> None:
    check_no_secret_values(PIPELINE_YAML)


def test_compiled_pipeline_maps_the_role_token_only_from_its_secret() -> None:
    # DEPENDS ON asyncrl/cluster/pipeline/definition.py `_common` (use_secret_as_env of asyncrl-role-token) and
    # the compiled asyncrl/cluster/pipeline/asyncrl.yaml.
    check_role_token_mapping(PIPELINE_YAML)


def test_the_checks_fail_on_a_bad_pipeline(tmp_path: Path) -> None:
    pipeline, platform = _docs()
    ex_name = next(iter(pipeline["deploymentSpec"]["executors"]))
    pipeline["deploymentSpec"]["executors"][ex_name]["container"].setdefault("env", []).append(
        {"name": TOKEN_ENV, "value": "x" * 43})
    bad = tmp_path / "bad.yaml"
    bad.write_text(yaml.safe_dump_all([pipeline, platform]))
    with pytest.raises(AssertionError, match="literal env value"):
        check_no_secret_values(bad)
    pipeline["deploymentSpec"]["executors"][ex_name]["container"]["env"].pop()
    pipeline["deploymentSpec"]["executors"][ex_name]["container"]["args"] = ["--x", "Ab3_" * 11]
    bad.write_text(yaml.safe_dump_all([pipeline, platform]))
    with pytest.raises(AssertionError, match="token-shaped"):
        check_no_secret_values(bad)
    for ex in _executors(platform).values():  # a mapping without the role token
        ex["secretAsEnv"] = [e for e in ex.get("secretAsEnv", []) if e.get("secretName") != ROLE_TOKEN_SECRET]
    bad.write_text(yaml.safe_dump_all([pipeline, platform]))
    with pytest.raises(AssertionError, match=ROLE_TOKEN_SECRET):
        check_role_token_mapping(bad)


def _keys(doc: Any, prefix: str = "") -> list[str]:
    if not isinstance(doc, dict):
        return []
    out = []
    for k, v in doc.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        out += [key, *_keys(v, key)]
    return out


def test_the_config_has_no_secret_field() -> None:
    """The token and S3 keys are not config fields at all (so they cannot reach params, config.json or YAML)."""
    cfg = load_config(None, [])
    secret_like = [k for k in _keys(cfg.model_dump(mode="json")) if is_secret_key(k)]
    assert secret_like == [], secret_like


def test_a_runs_logged_params_hold_no_secret(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_key, s3_secret = "AKIA" + "Q" * 16, "s" * 40
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", s3_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", s3_secret)
    cfg = load_config(None, [f"runs_dir={tmp_path}", "env.name=remote", "env.params.url=http://env:8000",
                             "env.params.env=sokoban", "env.params.api_key=user-put-a-key-here",
                             "env.params.token=user-put-a-token-here"])
    run = EmbeddedRun(cfg)  # what the launcher logs: flatten_params of the resolved config
    monkeypatch.setenv(TOKEN_ENV, run.role_token)
    params = flatten_params(run.cfg.model_dump(mode="json"))
    assert "env.params.url" in params and "env.params.api_key" not in params and "env.params.token" not in params
    tracker = Tracker.create(embedded_tracking_uri(tmp_path), "secrets-test", run.cfg.run_id, params=params)
    logged = tracker.client.get_run(tracker.run_id).data.params
    tracker.finish()
    assert logged == params and len(logged) > 50
    text = "\n".join(f"{k}={v}" for k, v in logged.items())
    for secret in (run.role_token, s3_key, s3_secret, "user-put-a-key-here", "user-put-a-token-here"):
        assert secret not in text
    assert run.role_token not in run.cfg.model_dump_json()  # it travels in the roles' environment only


def test_only_the_environment_tasks_get_the_sandbox_token() -> None:
    """The tool sandbox pool's token goes to the tasks that call the pool, and to no other (manifests/sandbox/)."""
    _, platform = _docs()
    executors = platform["platforms"]["kubernetes"]["deploymentSpec"]["executors"]
    holders = {ex["podMetadata"]["labels"]["asyncrl/role"] for ex in executors.values()
               if any(s.get("secretName") == "asyncrl-sandbox-token" for s in ex.get("secretAsEnv", []))}
    assert holders == {"environment"}
