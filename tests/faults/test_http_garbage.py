"""Garbage to every HTTP route of the run's servers: each answer is a 4xx (never a 5xx, never a hang) and the
server still serves a real request afterwards (issue 7, fault "send garbage to every HTTP endpoint").

Servers: the reward role (a real process against the session's SeaweedFS server, with the run's token), the
reference environment server (a real process with its own token), and the session's generation server over a real
vLLM engine (shared with test_generation_server.py; it runs with `--insecure-no-token`, so the token cases run on
the other two, which share the same middleware). The routes come from each FastAPI app, so a new route is covered
without editing this file. Every call has a deadline.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from asyncrl.config import load_config
from asyncrl.envs.remote import create_env_app
from asyncrl.generation.server import create_app as generation_app
from asyncrl.roles.context import wait_for_rendezvous
from asyncrl.roles.liveness import Heartbeat
from asyncrl.roles.reward import create_app as reward_app
from asyncrl.rpc.auth import ENV_SERVER_TOKEN_ENV, TOKEN_ENV, new_token
from asyncrl.storage.run_layout import RunPaths
from tests.helpers.generation_server import MAX_MODEL_LEN, shared_generation_server
from tests.helpers.tiny_random_model import VOCAB_SIZE

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
BODY_TIMEOUT_S = 2.0  # the reward and environment servers answer 408 to a body not complete within this
CALL_TIMEOUT_S = 30.0
JSON = {"Content-Type": "application/json"}
VOCAB = VOCAB_SIZE  # of the tiny random model of the session generation server


@dataclass
class Target:
    name: str
    url: str
    token: str | None
    routes: list[tuple[str, str]]  # (method, path)

    def headers(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        auth = {"Authorization": f"Bearer {self.token}"} if self.token else {}
        return {**auth, **(extra or {})}


def _routes(app: Any) -> list[tuple[str, str]]:
    out = [(m, r.path) for r in app.routes for m in sorted(getattr(r, "methods", None) or ()) if m != "HEAD"]
    assert out, "no routes found"
    return out


class _NoEngine:
    """Only to build the generation app in this process and list its routes; requests go to the real server."""


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in (TOKEN_ENV, ENV_SERVER_TOKEN_ENV)}
    return {**env, **extra}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@pytest.fixture(scope="module")
def reward(s3_server, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    from asyncrl.storage.s3 import S3Store

    store = S3Store(s3_server.endpoint_url, f"garbage-{uuid.uuid4().hex[:12]}", timeout_s=15.0)
    store.ensure_bucket()
    run_id, token = "garbage-run", new_token()
    paths = RunPaths("runs", run_id)
    cfg = load_config(None, [f"run_id={run_id}", "timeouts.heartbeat_s=0.5", "timeouts.rendezvous_s=60",
                             f"timeouts.http_s={BODY_TIMEOUT_S}"])
    store.put_bytes(paths.config(), cfg.model_dump_json().encode())
    trainer = Heartbeat(store, paths, "training", "0", interval_s=0.5)
    trainer.start()
    log = tmp_path_factory.mktemp("reward") / "reward.log"
    proc = subprocess.Popen(
        [sys.executable, "-m", "asyncrl.roles.reward", "--run-url", f"s3://{store.bucket}/runs/{run_id}", "--id", "0",
         "--log-level", "WARNING"], cwd=ROOT, env=_env(AWS_ENDPOINT_URL=s3_server.endpoint_url, **{TOKEN_ENV: token}),
        stdout=log.open("w"), stderr=subprocess.STDOUT)
    try:
        doc = wait_for_rendezvous(store, paths, "reward", 1, timeout_s=60)[0]
        yield Target("reward", f"http://{doc['host']}:{doc['port']}", token, _routes(reward_app(token=None)))
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        trainer.stop()
        proc.kill()
        proc.wait(timeout=30)
        store.close()


@pytest.fixture(scope="module")
def environment(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Target]:
    token = new_token()
    log = tmp_path_factory.mktemp("env") / "env.log"
    for _attempt in range(3):  # a free port can be taken between the look and the bind: try another
        port = _free_port()
        proc = subprocess.Popen(
            [sys.executable, "-m", "asyncrl.envs.remote", "--port", str(port), "--body-timeout-s", str(BODY_TIMEOUT_S)],
            cwd=ROOT, env=_env(**{ENV_SERVER_TOKEN_ENV: token}), stdout=log.open("w"), stderr=subprocess.STDOUT)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 30
        while proc.poll() is None and time.monotonic() < deadline:
            try:
                if httpx.get(f"{url}/health", headers={"Authorization": f"Bearer {token}"}, timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                time.sleep(0.1)
        else:
            proc.kill()
            proc.wait(timeout=10)
            continue
        break
    else:
        pytest.fail(f"the environment server did not start: {log.read_text()[-3000:]}")
    try:
        yield Target("environment", url, token, _routes(create_env_app()))
        assert proc.poll() is None, log.read_text()[-3000:]
    finally:
        proc.kill()
        proc.wait(timeout=30)


@pytest.fixture(scope="module")
def generation() -> Target:
    server, _ = shared_generation_server()
    httpx.post(f"{server.url}/generate", json={"request_id": "garbage-warmup", "prompt_token_ids": [1], "max_tokens": 1},
               timeout=300)
    return Target("generation", server.url, None, _routes(generation_app(_NoEngine(), None)))  # type: ignore[arg-type]


def _deep(n: int) -> bytes:
    return b"[" * n + b"]" * n


GARBAGE: dict[str, tuple[bytes, dict[str, str]]] = {
    "empty body": (b"", JSON),
    "invalid JSON": (b'{"request_id": "x", ', JSON),
    "JSON list": (b"[1, 2, 3]", JSON),
    "JSON string": (b'"hello"', JSON),
    "JSON null": (b"null", JSON),
    "wrong fields": (b'{"x": 1, "y": [true, null]}', JSON),
    "NaN and infinity": (b'{"prompt_token_ids": [NaN], "max_tokens": Infinity, "seed": -Infinity}', JSON),
    "deep nesting": (_deep(200_000), JSON),
    "deep but parseable": (b'{"metadata": ' + _deep(900) + b', "params": ' + _deep(900) + b"}", JSON),
    "random bytes": (bytes(range(256)) * 64, JSON),
    "random bytes, no content type": (bytes(reversed(range(256))) * 64, {}),
    "form data": (b"a=1&b=2", {"Content-Type": "application/x-www-form-urlencoded"}),
}


def _is_get(method: str) -> bool:
    return method == "GET"


def _check(r: httpx.Response, method: str, path: str, case: str) -> None:
    # a GET route ignores its body: any answer but a 5xx is right; a POST route must refuse garbage with a 4xx
    ok = r.status_code < 500 if _is_get(method) else 400 <= r.status_code < 500
    assert ok, f"{method} {path} ({case}): HTTP {r.status_code}: {r.text[:300]}"


def _send_all_garbage(t: Target, c: httpx.Client) -> None:
    for method, path in t.routes:
        url = f"{t.url}{path}"
        if t.token:
            r = c.request(method, url, json={"x": 1})
            assert r.status_code == 401, (method, path, r.status_code)
            r = c.request(method, url, json={"x": 1}, headers={"Authorization": "Bearer " + "w" * 43})
            assert r.status_code == 403, (method, path, r.status_code)
            r = c.request(method, url, content=b"\xff\x00", headers={"Authorization": b"\xff garbage"})
            assert r.status_code == 403, (method, path, r.status_code)
        for case, (body, headers) in GARBAGE.items():
            _check(c.request(method, url, content=body, headers=t.headers(headers)), method, path, case)
        huge = c.request(method, url, content=b"x" * ((8 << 20) + 1), headers=t.headers(JSON))
        assert huge.status_code == 413, (method, path, huge.status_code)

        def chunks() -> Iterator[bytes]:
            for _ in range(9):
                yield b"[" * (1 << 20)

        streamed = c.request(method, url, content=chunks(), headers=t.headers(JSON))
        assert streamed.status_code == 413, (method, path, streamed.status_code)
        wrong = "DELETE" if method != "DELETE" else "PATCH"
        assert c.request(wrong, url, headers=t.headers()).status_code in (404, 405), (wrong, path)
    r = c.get(f"{t.url}/no/such/route", headers=t.headers())
    assert r.status_code == 404, r.status_code


def _partial_body(t: Target, method: str, path: str, wait_s: float) -> bytes:
    """Send the headers and 10 of 1,000 announced body bytes, then stall; what the server answers within `wait_s`
    (b"" when nothing: the client gives up and closes, the server must not care)."""
    host, port = t.url.removeprefix("http://").split(":")
    auth = f"Authorization: Bearer {t.token}\r\n" if t.token else ""
    head = (f"{method} {path} HTTP/1.1\r\nHost: {host}\r\n{auth}Content-Type: application/json\r\n"
            f"Content-Length: 1000\r\n\r\n").encode()
    with socket.create_connection((host, int(port)), timeout=wait_s) as s:
        s.sendall(head + b'{"request_')
        s.settimeout(wait_s)
        answer = b""
        try:
            while chunk := s.recv(4096):  # until the server closes the connection (it does after a 408)
                answer += chunk
        except TimeoutError:
            pass
        return answer


def _check_partial_bodies(t: Target, expect_408: bool) -> None:
    from concurrent.futures import ThreadPoolExecutor

    wait = BODY_TIMEOUT_S + 5 if expect_408 else 1.0
    with ThreadPoolExecutor(max_workers=len(t.routes)) as pool:
        answers = list(pool.map(lambda mp: _partial_body(t, *mp, wait), t.routes))
    for (method, path), answer in zip(t.routes, answers, strict=True):
        if expect_408:
            assert answer.startswith(b"HTTP/1.1 408"), (method, path, answer[:200])
            assert b"not received in full" in answer
        else:  # the deadline is the default 60 s: no answer yet, and the server is not blocked (checked next)
            assert answer == b"" or answer.startswith(b"HTTP/1.1 4"), (method, path, answer[:200])


def test_reward_role_survives_garbage(reward: Target) -> None:
    with httpx.Client(timeout=CALL_TIMEOUT_S) as c:
        _send_all_garbage(reward, c)
        bad = c.post(f"{reward.url}/score", headers=reward.headers(),
                     json={"task": "arithmetic", "prompt": 1, "response": None, "metadata": {"answer": 2}})
        assert bad.status_code == 422 and {"prompt", "response"} <= {e["loc"][-1] for e in bad.json()["detail"]}
        _check_partial_bodies(reward, expect_408=True)
        ok = c.post(f"{reward.url}/score", headers=reward.headers(),
                    json={"task": "arithmetic", "prompt": "1+1=", "response": "2", "metadata": {"answer": "2"}})
        assert ok.status_code == 200 and ok.json()["reward"] == 1.0, ok.text


def test_environment_server_survives_garbage(environment: Target) -> None:
    t = environment
    with httpx.Client(timeout=CALL_TIMEOUT_S) as c:
        _send_all_garbage(t, c)
        for body, field in [({"env": "frozenlake", "seed": "1"}, "seed"), ({"env": "frozenlake", "seed": 2**64}, "seed"),
                            ({"env": "frozenlake", "seed": 1, "extra": 1}, "extra")]:
            r = c.post(f"{t.url}/reset", json=body, headers=t.headers())
            assert r.status_code == 422 and field in [str(e["loc"][-1]) for e in r.json()["detail"]], r.text
        r = c.post(f"{t.url}/reset", json={"env": "frozenlake", "params": {"size": 4.5}, "seed": 1}, headers=t.headers())
        assert r.status_code == 400 and "frozenlake" in r.json()["detail"], r.text
        r = c.post(f"{t.url}/reset", json={"env": "nope", "seed": 1}, headers=t.headers())
        assert r.status_code == 400 and "unknown name 'nope'" in r.json()["detail"], r.text
        _check_partial_bodies(t, expect_408=True)
        ok = c.post(f"{t.url}/reset", json={"env": "frozenlake", "seed": 3}, headers=t.headers())
        assert ok.status_code == 200, ok.text
        step = c.post(f"{t.url}/step", json={"session_id": ok.json()["session_id"], "action": "\x00\ufffd" * 100},
                      headers=t.headers())
        assert step.status_code == 200, step.text


# Invalid sampling parameters and requests the model cannot take: each is refused before it reaches the engine
# (an out-of-vocabulary id would crash vLLM's engine, which checks ids only when it has a tokenizer).
_BASE = {"request_id": "bad", "prompt_token_ids": [1, 2], "max_tokens": 2}
BAD_GENERATE: list[tuple[dict[str, Any], int, str]] = [
    ({"temperature": -0.5}, 422, "temperature"),
    ({"top_p": 0.0}, 422, "top_p"),
    ({"top_p": 1.01}, 422, "top_p"),
    ({"max_tokens": 0}, 422, "max_tokens"),
    ({"max_tokens": MAX_MODEL_LEN + 1}, 422, "max_tokens"),
    ({"seed": -1}, 422, "seed"),
    ({"seed": 2**64}, 422, "seed"),
    ({"seed": 1.5}, 422, "seed"),
    ({"max_tokens": "3"}, 422, "max_tokens"),
    ({"prompt_token_ids": [1, True]}, 422, "prompt_token_ids"),
    ({"prompt_token_ids": [1, -1]}, 422, "prompt_token_ids"),
    ({"prompt_token_ids": [1, VOCAB]}, 422, "prompt_token_ids"),
    ({"prompt_token_ids": [10**12]}, 422, "prompt_token_ids"),
    ({"stop_token_ids": [VOCAB + 5], "min_tokens": 1}, 422, "stop_token_ids"),
    ({"temperature": "hot"}, 422, "temperature"),
    ({"unknown_knob": 1}, 422, "unknown_knob"),
    ({"prompt_token_ids": [1] * MAX_MODEL_LEN, "max_tokens": 1}, 400, f"at most max_model_len - 1 = {MAX_MODEL_LEN - 1}"),
    ({"prompt_token_ids": [1] * 10, "max_tokens": MAX_MODEL_LEN - 5}, 400, f"max_model_len {MAX_MODEL_LEN}"),
]


def test_generation_server_survives_garbage(generation: Target) -> None:
    t = generation
    with httpx.Client(timeout=CALL_TIMEOUT_S) as c:
        _send_all_garbage(t, c)
        for change, status, needle in BAD_GENERATE:
            r = c.post(f"{t.url}/generate", json={**_BASE, **change})
            assert r.status_code == status, (change, r.status_code, r.text[:300])
            if status == 422:
                assert needle in [str(p) for e in r.json()["detail"] for p in e["loc"]], (change, r.text[:300])
            else:
                assert needle in r.json()["detail"], (change, r.text[:300])
        _check_partial_bodies(t, expect_408=False)
        ok = c.post(f"{t.url}/generate", json={"request_id": "after-garbage", "prompt_token_ids": [3, 4],
                                                "max_tokens": 3, "seed": 1, "stop_token_ids": [VOCAB - 1]})
        assert ok.status_code == 200 and len(ok.json()["token_ids"]) >= 1, ok.text
        assert c.get(f"{t.url}/health").json()["status"] == "ok"
