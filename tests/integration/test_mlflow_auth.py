"""MLflow's login as the manifests deploy it: `mlflow server --app-name basic-auth` with the `mlflow-auth-config`
ConfigMap's ini and the admin taken from the environment (the secret asyncrl-mlflow-auth on a cluster). A real
server on a free port: /health answers without a login (the probes), the API refuses requests without one, and a
client with MLFLOW_TRACKING_USERNAME / MLFLOW_TRACKING_PASSWORD (what the pipeline maps into every task) logs a
run."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
import yaml

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory):
    d = tmp_path_factory.mktemp("mlflow-auth")
    docs = list(yaml.safe_load_all((ROOT / "manifests/base/mlflow.yaml").read_text()))
    ini = next(x for x in docs if x["kind"] == "ConfigMap" and x["metadata"]["name"] == "mlflow-auth-config")
    text = ini["data"]["basic_auth.ini"]
    assert "sqlite:////tmp/mlflow-auth/basic_auth.db" in text
    (d / "basic_auth.ini").write_text(text.replace("sqlite:////tmp/mlflow-auth/basic_auth.db",
                                                   f"sqlite:///{d}/basic_auth.db"))
    port, password = _free_port(), os.urandom(12).hex()
    env = {**os.environ, "MLFLOW_AUTH_CONFIG_PATH": str(d / "basic_auth.ini"), "MLFLOW_AUTH_ADMIN_USERNAME": "asyncrl",
           "MLFLOW_AUTH_ADMIN_PASSWORD": password, "MLFLOW_FLASK_SERVER_SECRET_KEY": os.urandom(16).hex()}
    with open(d / "server.log", "w") as log:
        proc = subprocess.Popen([sys.executable, "-m", "mlflow", "server", "--app-name", "basic-auth", "--host",
                                 "127.0.0.1", "--port", str(port), "--workers", "1", "--backend-store-uri",
                                 f"sqlite:///{d}/mlflow.db"], env=env, stdout=subprocess.DEVNULL, stderr=log,
                                start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (d / "server.log").read_text()[-3000:]
            time.sleep(0.5)
        yield url, password
    finally:
        os.killpg(proc.pid, 9)
        proc.wait(timeout=30)


def test_api_needs_the_login_and_health_does_not(server: tuple[str, str]) -> None:
    url, password = server
    search = f"{url}/api/2.0/mlflow/experiments/search?max_results=1"
    assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    assert httpx.get(search, timeout=10).status_code == 401
    assert httpx.get(search, auth=("asyncrl", "wrong"), timeout=10).status_code == 401
    assert httpx.get(search, auth=("asyncrl", password), timeout=10).status_code == 200


def test_a_client_with_the_tasks_variables_logs_a_run(server: tuple[str, str], tmp_path: Path) -> None:
    url, password = server
    code = (f"import mlflow\nmlflow.set_tracking_uri({url!r})\nwith mlflow.start_run() as r:\n"
            "    mlflow.log_metric('reward/accuracy', 0.5, step=1)\nprint(r.info.run_id)")
    env = {**os.environ, "MLFLOW_TRACKING_USERNAME": "asyncrl", "MLFLOW_TRACKING_PASSWORD": password}
    r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120,
                       cwd=tmp_path)
    assert r.returncode == 0, r.stderr[-2000:]
    run_id = r.stdout.strip().splitlines()[-1]
    got = httpx.get(f"{url}/api/2.0/mlflow/runs/get", params={"run_id": run_id}, auth=("asyncrl", password),
                    timeout=10).json()
    assert got["run"]["data"]["metrics"][0]["value"] == 0.5
