"""Roles exit by themselves: real role processes against a real SeaweedFS server, the trainer's heartbeat written
by the test. The reward role exits 0 at the run's `done` marker, 1 when the trainer's heartbeat stops advancing
for `timeouts.peer_s` or says "failed"; the environment role exits 1 on a failed trainer even while it is still
waiting for generation servers. Each role's own heartbeat carries its state and figures."""

import os
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from asyncrl.config import load_config
from asyncrl.roles.context import wait_for_rendezvous
from asyncrl.roles.liveness import Heartbeat
from asyncrl.rpc.auth import TOKEN_ENV, auth_headers, new_token
from asyncrl.storage.run_layout import RunPaths

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
TOKEN = new_token()  # the roles' bearer token (ASYNCRL_ROLE_TOKEN)


def _start_run(store, run_id: str) -> RunPaths:
    paths = RunPaths("runs", run_id)
    cfg = load_config(None, [f"run_id={run_id}", "timeouts.heartbeat_s=0.5", "timeouts.peer_s=3",
                             "timeouts.rendezvous_s=60"])
    store.put_bytes(paths.config(), cfg.model_dump_json().encode())
    return paths


def _role(module: str, store, endpoint: str, run_id: str, log: Path, role_id: str = "0") -> subprocess.Popen:
    env = {**os.environ, "AWS_ENDPOINT_URL": endpoint, TOKEN_ENV: TOKEN}
    return subprocess.Popen([sys.executable, "-m", module, "--run-url", f"s3://{store.bucket}/runs/{run_id}",
                             "--id", role_id], cwd=ROOT, env=env, stdout=log.open("w"), stderr=subprocess.STDOUT)


def _wait_exit(proc: subprocess.Popen, timeout_s: float) -> int:
    try:
        return proc.wait(timeout=timeout_s)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_reward_role_exits_at_done_and_reports_its_figures(s3_server, s3_store, tmp_path):
    paths = _start_run(s3_store, "done-run")
    trainer = Heartbeat(s3_store, paths, "training", "0", interval_s=0.5)
    trainer.start()
    proc = _role("asyncrl.roles.reward", s3_store, s3_server.endpoint_url, "done-run", tmp_path / "reward.log")
    try:
        doc = wait_for_rendezvous(s3_store, paths, "reward", 1, timeout_s=60)[0]
        r = httpx.post(f"http://{doc['host']}:{doc['port']}/score", timeout=10, headers=auth_headers(TOKEN),
                       json={"task": "arithmetic", "prompt": "1+1=", "response": "2", "metadata": {"answer": "2"}})
        assert r.status_code == 200 and r.json()["reward"] == 1.0
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the figures reach the heartbeat within a beat or two
            beat = s3_store.get_json(paths.heartbeat("reward", "0"))
            if beat and beat["metrics"].get("scored") == 1.0:
                break
            time.sleep(0.3)
        assert beat["state"] == "running" and beat["metrics"]["scored"] == 1.0, beat
        s3_store.put_json(paths.done(), {"time": time.time()})
        t0 = time.monotonic()
        assert _wait_exit(proc, 30) == 0, (tmp_path / "reward.log").read_text()
        assert time.monotonic() - t0 < 10
        assert s3_store.get_json(paths.heartbeat("reward", "0"))["state"] == "finished"
    finally:
        trainer.stop()
        if proc.poll() is None:
            proc.kill()


def test_reward_role_exits_when_the_trainer_heartbeat_stops(s3_server, s3_store, tmp_path):
    paths = _start_run(s3_store, "gone-run")
    trainer = Heartbeat(s3_store, paths, "training", "0", interval_s=0.5)
    trainer.start()
    proc = _role("asyncrl.roles.reward", s3_store, s3_server.endpoint_url, "gone-run", tmp_path / "reward.log")
    try:
        wait_for_rendezvous(s3_store, paths, "reward", 1, timeout_s=60)
        time.sleep(4)  # longer than peer_s: a beating trainer keeps the role alive
        assert proc.poll() is None, (tmp_path / "reward.log").read_text()
        trainer._stop.set()  # the trainer vanishes (killed): no final state written
        trainer._thread.join()
        t0 = time.monotonic()
        assert _wait_exit(proc, 30) == 1
        waited = time.monotonic() - t0
        assert 2.5 < waited < 12, waited
        log = (tmp_path / "reward.log").read_text()
        assert "the trainer is gone: heartbeat stuck at seq" in log, log
    finally:
        if proc.poll() is None:
            proc.kill()


def test_environment_role_exits_when_the_trainer_failed(s3_server, s3_store, tmp_path):
    paths = _start_run(s3_store, "failed-run")
    trainer = Heartbeat(s3_store, paths, "training", "0", interval_s=0.5)
    trainer.start()
    # no generation server ever publishes: the writer is still waiting for its peers
    proc = _role("asyncrl.roles.environment", s3_store, s3_server.endpoint_url, "failed-run",
                 tmp_path / "env.log", role_id="env0")
    try:
        time.sleep(3)
        assert proc.poll() is None, (tmp_path / "env.log").read_text()
        trainer.stop("failed", "RuntimeError: CUDA out of memory")
        assert _wait_exit(proc, 30) == 1
        log = (tmp_path / "env.log").read_text()
        assert "the trainer failed: RuntimeError: CUDA out of memory" in log, log
        assert s3_store.get_json(paths.heartbeat("environment", "env0"))["state"] in ("finished", "failed")
    finally:
        if proc.poll() is None:
            proc.kill()


def test_heartbeat_records_a_failure_with_its_error(s3_store):
    paths = RunPaths("runs", "hb-run")
    with pytest.raises(RuntimeError, match="boom"), Heartbeat(s3_store, paths, "training", "0", interval_s=0.2):
        time.sleep(0.5)
        raise RuntimeError("boom")
    doc = s3_store.get_json(paths.heartbeat("training", "0"))
    assert doc["state"] == "failed" and doc["error"] == "RuntimeError: boom" and doc["seq"] >= 2
    with Heartbeat(s3_store, paths, "reward", "0", interval_s=0.2):
        pass
    assert s3_store.get_json(paths.heartbeat("reward", "0"))["state"] == "finished"
