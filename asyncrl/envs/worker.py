"""Environment worker processes: the JSON-lines protocol, both sides.

Parent side (`open_process`, `ProcessHandle`): `EnvExecutor` in "processes" mode starts one worker per environment
instance as `python -m asyncrl.envs.worker` in its own session (process group), so it can SIGKILL the worker and
everything it started at a deadline; replies longer than `max_reply_bytes` are garbage.
Child side (`serve`, `main`): one request line -> one reply line, in order:
- `{"op": "make", "name", "params", "injection": {...} | null, "injection_key"}` -> `{"ok": true}`;
- `{"op": "reset", "seed"}` -> `{"ok": true, "observation", "info"}`;
- `{"op": "step", "action"}` -> `{"ok": true, "observation", "reward", "terminated", "truncated", "info"}`;
- any failure -> `{"ok": false, "kind", "error"}` with kind "raised" (the environment raised), "garbage" (it
  returned something that is not the protocol's shape, or values JSON cannot carry), "config" (unknown environment
  or bad parameters: a ValueError from `make`) or "protocol" (a malformed request).
Values are sent as the environment returned them (NaN included), unconverted: the parent validates them. Nothing is
ever pickled. The environment runs with injection applied here, with blocking hangs, so an injected hang really holds
this process. stdout carries only the protocol (anything the environment prints goes to stderr). The worker ends at
EOF on stdin, and on its own when its parent dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from typing import IO, TYPE_CHECKING, Any

from asyncrl.envs.base import StepResult
from asyncrl.envs.handle import EnvFault, EnvHandle, HandleOwner, within_deadline
from asyncrl.secret_names import without_secrets

if TYPE_CHECKING:
    from asyncrl.envs.injection import EnvInjectionConfig  # pydantic: imported at run time only when needed

log = logging.getLogger(__name__)
_PARENT_POLL_S = 1.0
_CLOSE_TIMEOUT_S = 5.0


# ---- parent side

class ProcessHandle(EnvHandle):
    """Parent side: an `EnvHandle` whose environment lives in a worker process (see the module docstring)."""

    def __init__(self, executor: HandleOwner, name: str, proc: asyncio.subprocess.Process) -> None:
        super().__init__(executor, name)
        self.proc, self.pid = proc, proc.pid
        self._killed = False

    async def request(self, doc: dict[str, Any], timeout_s: float, what: str) -> dict[str, Any]:
        """The worker's reply to `doc`; kills the worker on a deadline miss, an over-long reply or its death."""
        assert self.proc.stdin is not None and self.proc.stdout is not None
        if self.proc.returncode is not None or self._killed:
            raise EnvFault("crashed", f"{what}: worker process {self.pid} is gone (exit {self.proc.returncode})")

        async def exchange() -> bytes:
            assert self.proc.stdin is not None and self.proc.stdout is not None
            self.proc.stdin.write((json.dumps(doc) + "\n").encode())
            await self.proc.stdin.drain()
            return await self.proc.stdout.readline()

        try:
            line = await within_deadline(exchange(), timeout_s, what)
        except asyncio.CancelledError:  # a half-done exchange would desynchronise the protocol: end the worker
            self._kill_now()
            raise
        except EnvFault:
            await self._kill()
            raise
        except ValueError:  # the reply line is longer than the stream limit
            await self._kill()
            raise EnvFault("garbage", f"{what}: reply longer than {self._ex.max_reply_bytes} bytes") from None
        except (ConnectionError, BrokenPipeError) as e:
            await self._kill()
            raise EnvFault("crashed", f"{what}: worker process {self.pid} is gone ({type(e).__name__})") from None
        if not line.endswith(b"\n"):
            await self._kill()
            raise EnvFault("crashed", f"{what}: worker process {self.pid} died before answering")
        if len(line) > self._ex.max_reply_bytes:
            await self._kill()
            raise EnvFault("garbage", f"{what}: reply longer than {self._ex.max_reply_bytes} bytes")
        try:
            reply = json.loads(line)
        except ValueError:
            await self._kill()
            raise EnvFault("garbage", f"{what}: the worker's reply is not JSON") from None
        if not isinstance(reply, dict) or not isinstance(reply.get("ok"), bool):
            await self._kill()
            raise EnvFault("garbage", f"{what}: the worker's reply is not a protocol object")
        if not reply["ok"]:
            kind, error = reply.get("kind"), str(reply.get("error"))
            if kind == "config":
                raise ValueError(f"environment {self.name!r}: {error}")
            raise EnvFault(kind if kind in ("raised", "garbage") else "crashed", f"{what}: {error}")
        return reply

    async def _invoke(self, op: str, arg: Any, timeout_s: float) -> Any:
        what = f"{self.name}.{op}"
        if op == "reset":
            reply = await self.request({"op": "reset", "seed": arg}, timeout_s, what)
            return reply.get("observation"), reply.get("info")
        reply = await self.request({"op": "step", "action": arg}, timeout_s, what)
        return StepResult(reply.get("observation"), reply.get("reward"), reply.get("terminated"),  # type: ignore[arg-type]
                          reply.get("truncated"), reply.get("info"))  # type: ignore[arg-type]

    def _kill_now(self) -> None:
        """SIGKILL the worker's process group (asyncio's child watcher reaps the worker)."""
        if self.proc.returncode is None and not self._killed:
            self._killed = True
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self._ex.stats["processes_killed"] += 1

    async def _kill(self) -> None:
        """SIGKILL the worker's process group and wait for the worker to be reaped (bounded)."""
        self._kill_now()
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.proc.wait(), _CLOSE_TIMEOUT_S)

    async def _close(self) -> None:
        if self.proc.returncode is None and self.proc.stdin is not None and self._broken is None:
            self.proc.stdin.close()  # EOF: the worker closes its environment and exits
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self.proc.wait(), 1.0)
        await self._kill()


async def open_process(executor: HandleOwner, name: str, params: dict[str, Any],
                       injection: EnvInjectionConfig | None, injection_key: int) -> ProcessHandle:
    """Start a worker for `executor` and create environment `name` in it (killed again if that fails)."""
    proc = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "asyncrl.envs.worker", stdin=asyncio.subprocess.PIPE,
        stdout=asyncio.subprocess.PIPE, start_new_session=True, limit=executor.max_reply_bytes + 1,
        env=without_secrets(os.environ))  # an environment never needs the run's S3 keys, role token or MLflow login
    executor.stats["processes_started"] += 1
    handle = ProcessHandle(executor, name, proc)
    doc = {"op": "make", "name": name, "params": params, "injection_key": injection_key,
           "injection": None if injection is None else injection.model_dump()}
    try:
        await handle.request(doc, executor.open_timeout_s, f"{name}: open")
    except BaseException:
        await handle._kill()
        raise
    return handle


# ---- child side


def _encode(doc: dict[str, Any]) -> bytes:
    """One reply line; values JSON cannot carry become a "garbage" reply (NaN and infinities are carried)."""
    try:
        return (json.dumps(doc, allow_nan=True, separators=(",", ":")) + "\n").encode()
    except (TypeError, ValueError) as e:
        return _encode({"ok": False, "kind": "garbage", "error": f"result is not JSON-serialisable: {e}"})


def _error(kind: str, message: str) -> dict[str, Any]:
    return {"ok": False, "kind": kind, "error": message[:4000]}


class _Session:
    """The worker's one environment and the event loop its coroutines run on."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.env: Any = None

    def handle(self, req: Any) -> dict[str, Any]:
        if not isinstance(req, dict) or not isinstance(req.get("op"), str):
            return _error("protocol", "request: expected a JSON object with a string 'op'")
        op = req["op"]
        try:
            if op == "make":
                return self._make(req)
            if self.env is None:
                return _error("protocol", f"op {op!r} before 'make'")
            if op == "reset":
                if not isinstance(req.get("seed"), int):
                    return _error("protocol", "reset: 'seed' must be an integer")
                return self._reset(req["seed"])
            if op == "step":
                if not isinstance(req.get("action"), str):
                    return _error("protocol", "step: 'action' must be a string")
                return self._step(req["action"])
        except Exception as e:  # the environment's own failure, reported, never fatal to the worker
            return _error("raised", f"{type(e).__name__}: {e}")
        return _error("protocol", f"unknown op {op!r}")

    def _make(self, req: dict[str, Any]) -> dict[str, Any]:
        from asyncrl.envs import make  # registers the built-in environments
        from asyncrl.envs.injection import InjectedEnvironment

        name, params = req.get("name"), req.get("params") or {}
        if not isinstance(name, str) or not isinstance(params, dict):
            return _error("protocol", "make: 'name' must be a string and 'params' an object")
        try:
            env = make(name, **params)
            injection = req.get("injection")
            if injection is not None:
                from asyncrl.envs.injection import EnvInjectionConfig  # pydantic: imported only when needed

                cfg = EnvInjectionConfig.model_validate(injection)
                env = InjectedEnvironment(env, cfg, int(req.get("injection_key") or 0), blocking_hang=True)
        except ValueError as e:  # unknown name, bad parameters, bad injection config
            return _error("config", str(e))
        self.env = env
        return {"ok": True}

    def _reset(self, seed: int) -> dict[str, Any]:
        out = self.loop.run_until_complete(self.env.reset(seed))
        if not isinstance(out, tuple) or len(out) != 2:
            return _error("garbage", f"reset: expected an (observation, info) tuple, got {type(out).__name__}")
        return {"ok": True, "observation": out[0], "info": out[1]}

    def _step(self, action: str) -> dict[str, Any]:
        r = self.loop.run_until_complete(self.env.step(action))
        if not isinstance(r, StepResult):
            return _error("garbage", f"step: expected a StepResult, got {type(r).__name__}")
        return {"ok": True, "observation": r.observation, "reward": r.reward, "terminated": r.terminated,
                "truncated": r.truncated, "info": r.info}

    def close(self) -> None:
        closer = getattr(self.env, "aclose", None)
        if closer is not None:
            try:
                self.loop.run_until_complete(asyncio.wait_for(closer(), 10.0))
            except Exception as e:
                log.warning("environment worker: closing the environment failed: %s: %s", type(e).__name__, e)
        self.loop.close()


def _exit_with_parent(parent: int) -> None:
    """Daemon thread: end this process when the parent that started it is gone (even mid-hang)."""
    while os.getppid() == parent:
        time.sleep(_PARENT_POLL_S)
    os._exit(3)


def serve(inp: IO[bytes], out: IO[bytes]) -> None:
    """Answer requests from `inp` on `out` until EOF."""
    session = _Session()
    try:
        for line in iter(inp.readline, b""):
            try:
                req = json.loads(line)
            except ValueError as e:
                reply = _error("protocol", f"request is not JSON: {e}")
            else:
                reply = session.handle(req)
            out.write(_encode(reply))
            out.flush()
    finally:
        session.close()


def main() -> None:
    logging.basicConfig(level=logging.WARNING, stream=sys.stderr)
    threading.Thread(target=_exit_with_parent, args=(os.getppid(),), daemon=True).start()
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())  # prints of the environment must not corrupt the protocol
    sys.stdout = sys.stderr
    serve(sys.stdin.buffer, protocol_out)


if __name__ == "__main__":
    main()
