"""Role servers require the run's bearer token: a real reward role process against the session's SeaweedFS server
answers 401 without the token, 403 with a wrong one, 200 with it, 413 to a 16 MiB body (declared or chunked);
role and server processes started without ASYNCRL_ROLE_TOKEN (or ASYNCRL_ENV_TOKEN) exit non-zero naming it."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from asyncrl.config import load_config
from asyncrl.roles.context import wait_for_rendezvous
from asyncrl.roles.liveness import Heartbeat
from asyncrl.rpc.auth import ENV_SERVER_TOKEN_ENV, TOKEN_ENV, auth_headers, new_token
from asyncrl.storage.run_layout import RunPaths

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BODY = {"task": "arithmetic", "prompt": "1+1=", "response": "2", "metadata": {"answer": "2"}}


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, ENV_SERVER_TOKEN_ENV)}
    return {**env, **extra}


def test_reward_role_requires_the_token_and_limits_bodies(s3_server, s3_store, tmp_path: Path) -> None:
    run_id, token = "auth-run", new_token()
    paths = RunPaths("runs", run_id)
    cfg = load_config(None, [f"run_id={run_id}", "timeouts.heartbeat_s=0.5", "timeouts.rendezvous_s=60"])
    s3_store.put_bytes(paths.config(), cfg.model_dump_json().encode())
    trainer = Heartbeat(s3_store, paths, "training", "0", interval_s=0.5)
    trainer.start()
    log = tmp_path / "reward.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.roles.reward", "--run-url", f"s3://{s3_store.bucket}/runs/{run_id}",
         "--id", "0"], cwd=ROOT, env=_env(AWS_ENDPOINT_URL=s3_server.endpoint_url, **{TOKEN_ENV: token}),
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        doc = wait_for_rendezvous(s3_store, paths, "reward", 1, timeout_s=60)[0]
        url = f"http://{doc['host']}:{doc['port']}"
        with httpx.Client(timeout=30) as c:
            r = c.post(f"{url}/score", json=BODY)
            assert r.status_code == 401 and TOKEN_ENV in r.text
            assert c.get(f"{url}/health").status_code == 401
            assert c.post(f"{url}/score", json=BODY, headers={"Authorization": "Bearer wrong"}).status_code == 403
            assert c.get(f"{url}/health", headers=auth_headers(new_token())).status_code == 403
            ok = c.post(f"{url}/score", json=BODY, headers=auth_headers(token))
            assert ok.status_code == 200 and ok.json()["reward"] == 1.0
            assert c.get(f"{url}/health", headers=auth_headers(token)).json()["scored"] == 1
            big = b"x" * (16 << 20)
            r = c.post(f"{url}/score", content=big, headers={**auth_headers(token), "Content-Type": "application/json"})
            assert r.status_code == 413 and "Content-Length" in r.text

            def chunks() -> Iterator[bytes]:
                for _ in range(16):
                    yield b"y" * (1 << 20)

            r = c.post(f"{url}/score", content=chunks(), headers=auth_headers(token))
            assert r.status_code == 413 and "streamed" in r.text
            # still serving after the refusals
            assert c.post(f"{url}/score", json=BODY, headers=auth_headers(token)).status_code == 200
        s3_store.put_json(paths.done(), {"time": time.time()})
        assert proc.wait(timeout=30) == 0, log.read_text()
        text = log.read_text()
        assert token not in text and "wrong bearer token" in text
    finally:
        trainer.stop()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@pytest.mark.parametrize(("argv", "var"), [
    (["-m", "asyncrl.roles.reward", "--run-url", "s3://b/runs/r", "--id", "0"], TOKEN_ENV),
    (["-m", "asyncrl.generation.server", "--model", "/nonexistent"], TOKEN_ENV),
    (["-m", "asyncrl.envs.remote", "--port", "0"], ENV_SERVER_TOKEN_ENV),
])
def test_servers_without_the_token_exit_naming_the_variable(argv: list[str], var: str) -> None:
    r = subprocess.run([sys.executable, *argv], cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and f"{var} is not set" in r.stderr, (r.returncode, r.stderr[-2000:])
    assert "Traceback" not in r.stderr
