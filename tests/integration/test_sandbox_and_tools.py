"""The Python sandbox (real child processes) and the tool-use environment that uses it."""

from __future__ import annotations

import asyncio
import os
import socket
import uuid

import pytest

from asyncrl.envs import make
from asyncrl.envs.tool_use import calculate, make_problem
from asyncrl.sandbox.runner import run_python

pytestmark = pytest.mark.integration


def _run(code: str, **kw):
    return asyncio.run(run_python(code, **kw))


def test_sandbox_runs_code_with_files_in_its_folder() -> None:
    r = _run("import math, json\nopen('out.txt', 'w').write('7')\nprint(math.factorial(5), open('out.txt').read())")
    assert r.ok and r.stdout == "120 7\n"


@pytest.mark.parametrize(("code", "refused"), [
    ("import socket; socket.socket()", "socket.__new__"),
    ("import urllib.request; urllib.request.urlopen('http://127.0.0.1:9')", "socket.getaddrinfo"),
    ("print(open('/etc/hostname').read())", "outside the sandbox folder"),
    ("import subprocess; subprocess.run(['true'])", "subprocess.Popen"),
    ("import os; os.system('true')", "os.system"),
    ("import ctypes; ctypes.CDLL(None)", "ctypes.dlopen"),
    ("import os; os.chdir('..')", "os.chdir"),
    ("import gc; gc.get_objects()", "gc.get_objects"),
    ("import sys; sys.modules['__main__'].__dict__.clear(); open('/etc/hostname')", "outside the sandbox folder"),
])
def test_sandbox_refuses(code: str, refused: str) -> None:
    r = _run(code)
    assert r.exit_code != 0 and refused in r.stderr, r.stderr


def test_sandbox_cannot_write_outside_nor_reach_a_listening_port(tmp_path) -> None:
    target = f"/tmp/asyncrl-escape-{uuid.uuid4().hex}"
    assert not _run(f"open({target!r}, 'w').write('x')").ok
    assert not os.path.exists(target)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as srv:
        srv.bind(("127.0.0.1", 0))
        srv.listen()
        port = srv.getsockname()[1]
        r = _run(f"import socket; socket.create_connection(('127.0.0.1', {port}), timeout=1)")
        assert not r.ok and "not allowed" in r.stderr


def test_sandbox_is_killed_at_its_time_limit_and_bounded_in_memory() -> None:
    r = _run("while True: pass", timeout_s=1.0)
    assert r.timed_out and r.exit_code is None
    r = _run("x = bytearray(4 * 1024**3)", memory_mb=256)
    assert not r.ok and "MemoryError" in r.stderr


def test_calculator() -> None:
    assert calculate("3 * (4 + 5)") == 27 and calculate("-2 ** 3") == -8 and calculate("7 // 2 + 7 % 2") == 4
    for bad, why in [("__import__('os')", "Call is not allowed"), ("2 ** 1000", "exponent"), ("1/0", "division"),
                     ("x + 1", "Name is not allowed"), ("3 +", "not an arithmetic expression")]:
        with pytest.raises(ValueError, match=why):
            calculate(bad)


def test_problems_are_seeded_and_integral() -> None:
    assert make_problem(3) == make_problem(3)
    for seed in range(200):
        question, answer = make_problem(seed)
        assert isinstance(answer, int) and answer >= 0 and "{" not in question


def test_tool_use_episode_with_calculator_python_and_answer() -> None:
    async def episode() -> list:
        env = make("tool_use", max_turns=4)
        obs, info = await env.reset(7)
        answer = info["answer"]
        out = [await env.step("Let me think. <calculator>2 * (3 + 4)</calculator>")]
        out.append(await env.step(f"<python>print({answer} + 0)</python>"))
        out.append(await env.step(f"So the result is <answer>{answer}</answer>"))
        return out

    calc, py, ans = asyncio.run(episode())
    assert calc.observation.startswith("Result: 14") and calc.reward == 0.0 and not calc.done
    assert py.info["tool"] == "python" and not py.done
    assert (ans.reward, ans.terminated, ans.info["success"]) == (1.0, True, True)


def test_tool_use_wrong_answer_format_penalty_and_turn_limit() -> None:
    async def run() -> tuple:
        env = make("tool_use", max_turns=2, format_penalty=-0.3, allow_python=False)
        await env.reset(1)
        bad = await env.step("no tags here")
        py = await env.step("<python>print(1)</python>")  # python is off: a format error, and the last turn
        env2 = make("tool_use")
        _, info = await env2.reset(2)
        wrong = await env2.step(f"<answer>{info['answer'] + 1}</answer>")
        return bad, py, wrong

    bad, py, wrong = asyncio.run(run())
    assert (bad.reward, bad.info["invalid_action"], bad.done) == (-0.3, True, False)
    assert (py.reward, py.truncated, py.info["success"]) == (-0.3, True, False)
    assert (wrong.reward, wrong.terminated, wrong.info["success"]) == (0.0, True, False)
