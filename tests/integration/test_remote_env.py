"""The remote environment adapter against the reference environment server, over real HTTP on loopback."""

from __future__ import annotations

import asyncio
import socket
import threading
import time

import httpx
import pytest
import uvicorn

from asyncrl.envs import EpisodeOver, make
from asyncrl.envs.remote import RemoteEnvironment, RemoteError, create_env_app

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def server_url():
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.bind(("127.0.0.1", 0))
    port = sock.getsockname()[1]
    server = uvicorn.Server(uvicorn.Config(create_env_app(), log_level="warning", access_log=False))
    thread = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    thread.start()
    deadline = time.monotonic() + 20
    while not server.started:
        assert time.monotonic() < deadline, "environment server did not start"
        time.sleep(0.05)
    yield f"http://127.0.0.1:{port}"
    server.should_exit = True
    thread.join(timeout=10)
    sock.close()


def test_remote_episode_equals_the_local_one(server_url: str) -> None:
    actions = ["<answer>right</answer>", "down", "nonsense", "right", "down", "down", "right", "up", "left"]

    async def play(env) -> list[tuple]:
        obs, _ = await env.reset(11)
        out = [(obs,)]
        for a in actions:
            r = await env.step(a)
            out.append((r.observation, r.reward, r.terminated, r.truncated, r.info.get("success")))
            if r.done:
                break
        return out

    async def remote() -> list[tuple]:
        env = RemoteEnvironment(server_url, "sokoban", {"num_boxes": 1, "max_steps": 6}, timeout_s=10)
        try:
            return await play(env)
        finally:
            await env.aclose()

    local = asyncio.run(play(make("sokoban", num_boxes=1, max_steps=6)))
    assert asyncio.run(remote()) == local
    assert local[-1][3] is True  # truncated at max_steps: the whole protocol ran
    assert httpx.get(f"{server_url}/health").json()["sessions"] == 0  # ended sessions are closed


def test_errors_name_the_problem(server_url: str) -> None:
    async def run() -> None:
        with pytest.raises(RemoteError, match="unknown name 'nope'"):
            await RemoteEnvironment(server_url, "nope", timeout_s=5).reset(0)
        with pytest.raises(RemoteError, match="bad parameters"):
            await RemoteEnvironment(server_url, "frozenlake", {"colour": 1}, timeout_s=5).reset(0)
        env = RemoteEnvironment(server_url, "frozenlake", {"max_steps": 1}, timeout_s=5)
        await env.reset(0)
        sid = env.session_id
        r = await env.step("up")
        assert r.done and env.session_id is None
        env.session_id = sid  # a finished session is gone on the server
        with pytest.raises(RemoteError, match="unknown or finished session"):
            await env.step("up")
        await env.aclose()
        with pytest.raises(EpisodeOver):
            await RemoteEnvironment(server_url, "frozenlake", timeout_s=5).step("up")
        closed = RemoteEnvironment("http://127.0.0.1:9", "frozenlake", timeout_s=2)  # nothing listens on port 9
        with pytest.raises(RemoteError, match="ConnectError"):
            await closed.reset(0)
        await closed.aclose()

    asyncio.run(run())
    too_long = httpx.post(f"{server_url}/step", json={"session_id": "x", "action": "a" * 70_000}, timeout=5)
    assert too_long.status_code == 422
