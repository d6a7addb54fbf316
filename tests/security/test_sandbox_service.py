"""The sandbox service (`python -m asyncrl.sandbox.server`) as a real process: tool calls through `ToolUse` with
`sandbox_url`, its bearer token and bad input answered with a clear 4xx, a busy pool answering 503 after its queue
wait, and the secrets of the environment it was started with out of every program's reach."""

from __future__ import annotations

import asyncio
import base64
import os
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from test_escapes import CANARY, PROBES, TIMEOUT_S, bystander, host_dir, leaked, listener  # noqa: F401 - fixtures

from asyncrl.envs.tool_use import ToolUse
from asyncrl.sandbox.client import RemoteSandbox, SandboxServiceError

pytestmark = pytest.mark.integration

TOKEN = "t-" + uuid.uuid4().hex


def _start(*args: str) -> tuple[subprocess.Popen, str]:
    env = {**os.environ, "ASYNCRL_SANDBOX_TOKEN": TOKEN, "AWS_SECRET_ACCESS_KEY": CANARY, "ASYNCRL_ROLE_TOKEN": CANARY,
           "MLFLOW_TRACKING_PASSWORD": CANARY}
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.sandbox.server", "--port", "0", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, stdin=subprocess.DEVNULL)
    assert proc.stdout is not None
    deadline = time.monotonic() + 30
    for line in proc.stdout:
        if "listening on" in line:
            return proc, f"http://127.0.0.1:{line.rsplit(':', 1)[1].strip()}"
        if time.monotonic() > deadline:
            break
    proc.kill()
    raise AssertionError(f"the sandbox service did not start: {proc.stdout.read()}")


def _stop(proc: subprocess.Popen) -> None:
    proc.terminate()
    try:
        proc.wait(10)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait(10)


@pytest.fixture(scope="module")
def service() -> Iterator[str]:
    proc, url = _start()
    try:
        yield url
    finally:
        _stop(proc)


def _step(url: str, code: str) -> str:
    async def go() -> str:
        env = ToolUse(sandbox_url=url, python_timeout_s=TIMEOUT_S)
        await env.reset(0)
        return (await env.step(f"<python>{code}</python>")).observation

    os.environ["ASYNCRL_SANDBOX_TOKEN"] = TOKEN
    try:
        return asyncio.run(go())
    finally:
        os.environ.pop("ASYNCRL_SANDBOX_TOKEN", None)


def test_tool_call_through_the_service(service: str) -> None:
    assert _step(service, "print(6 * 7)").startswith("42\n")
    assert "time limit exceeded" in _step(service, "while True: pass")


def test_programs_see_no_secret_of_the_service(service: str) -> None:
    probe = ("import os\nparts = [repr(dict(os.environ))]\n"
             "for p in ['/proc/self/environ', '/proc/1/environ', '/proc/2/environ']:\n"
             "    try: parts.append(open(p, 'rb').read().decode(errors='replace'))\n"
             "    except Exception as e: parts.append(type(e).__name__)\n"
             "print('|'.join(parts))")
    out = _step(service, probe)
    encoded = base64.b64encode(CANARY.encode()).decode()
    assert CANARY not in out and encoded not in out and CANARY.encode().hex() not in out, out


@pytest.mark.parametrize("name", sorted(PROBES))
def test_probe_through_the_service_is_contained(name: str, service: str, host_dir: Path,  # noqa: F811
                                                listener, bystander) -> None:  # noqa: F811
    """The red-team probes of test_escapes, through the service: nothing outside changes, no secret of the
    service's environment appears, the call returns within its timeout + 2 s."""
    code = PROBES[name].format(host=host_dir, port=listener.getsockname()[1], victim=bystander.pid)
    before = set(os.listdir(host_dir))
    t0 = time.monotonic()
    obs = _step(service, code)
    assert "ESCAPED" not in obs and not leaked(obs), obs
    assert time.monotonic() - t0 <= TIMEOUT_S + 2.0
    assert set(os.listdir(host_dir)) == before and (host_dir / "answer.txt").read_text() == CANARY
    assert bystander.poll() is None, "a process outside the sandbox was killed"
    with pytest.raises(TimeoutError):
        listener.accept()


def test_token_and_bad_input_get_a_clear_4xx(service: str) -> None:
    with httpx.Client(timeout=10) as c:
        assert c.post(f"{service}/run", json={"code": "print(1)"}).status_code == 401
        r = c.post(f"{service}/run", json={"code": "print(1)"}, headers={"Authorization": "Bearer wrong-token-xxxxxxxx"})
        assert r.status_code == 403
        auth = {"Authorization": f"Bearer {TOKEN}"}
        r = c.post(f"{service}/run", json={"code": "print(1)", "timeout_s": 0}, headers=auth)
        assert r.status_code == 422 and "timeout_s" in r.text
        r = c.post(f"{service}/run", json={"code": "print(1)", "mode": "root"}, headers=auth)
        assert r.status_code == 422 and "mode" in r.text
        r = c.post(f"{service}/run", json={"code": "x" * 100_001}, headers=auth)
        assert r.status_code == 422 and "code" in r.text
        r = c.post(f"{service}/run", content=b"{" + b" " * (2 << 20) + b"}", headers={**auth, "content-type": "application/json"})
        assert r.status_code == 413
        r = c.post(f"{service}/run", json={"code": "print('still serving')"}, headers=auth)
        assert r.status_code == 200 and r.json()["stdout"] == "still serving\n"
        health = c.get(f"{service}/health", headers=auth).json()
        assert health["runs"] >= 1 and health["isolation"]["uid"] == 65534


def test_a_busy_pool_answers_503_after_its_queue_wait() -> None:
    proc, url = _start("--max-concurrent", "1", "--max-queue-s", "0.5")
    try:
        async def go() -> list[object]:
            sandbox = RemoteSandbox(url, token=TOKEN)
            try:
                slow = asyncio.create_task(sandbox.run("import time\ntime.sleep(2)\nprint('slow done')", timeout_s=5))
                await asyncio.sleep(0.3)
                second = await asyncio.gather(sandbox.run("print(1)"), return_exceptions=True)
                return [await slow, *second]
            finally:
                await sandbox.aclose()

        slow, second = asyncio.run(go())
        assert getattr(slow, "stdout", None) == "slow done\n"
        assert isinstance(second, SandboxServiceError) and "503" in str(second) and "slots" in str(second)
    finally:
        _stop(proc)


def test_the_service_refuses_to_start_without_its_token() -> None:
    env = {k: v for k, v in os.environ.items() if k != "ASYNCRL_SANDBOX_TOKEN"}
    r = subprocess.run([sys.executable, "-m", "asyncrl.sandbox.server", "--port", "0"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0 and "ASYNCRL_SANDBOX_TOKEN" in r.stderr
