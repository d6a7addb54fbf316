"""Start `python -m asyncrl.generation.server` as a subprocess for integration tests.

`shared_generation_server()` starts ONE server per test session (engine start is ~30-60 s on 2 cores)
over a tiny random Qwen2 model, and kills it (and its vLLM children) at interpreter exit.
"""

from __future__ import annotations

import atexit
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import httpx

from tests.helpers.tiny_random_model import build_tiny_random_model

REPO = Path(__file__).resolve().parents[2]


@dataclass
class ServerProcess:
    proc: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def stop(self, timeout_s: float = 40.0) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)  # the server and its vLLM children
                self.proc.wait(timeout=10)

    def log_tail(self, n: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-n:])
        except OSError:
            return ""


MAX_MODEL_LEN = 2048  # long enough that a request spans an /abort or a weight update (~4 ms per token)


def start_server(model_dir: Path, work_dir: Path, timeout_s: float = 300.0, max_model_len: int = MAX_MODEL_LEN) -> ServerProcess:
    """Start a server on a free port; return once its ready file exists and /health answers."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ready = work_dir / "ready.json"
    log_path = work_dir / "server.log"
    cmd = [
        sys.executable, "-m", "asyncrl.generation.server", "--model", str(model_dir), "--port", "0",
        "--ready-file", str(ready), "--work-dir", str(work_dir / "vllm"), "--max-model-len", str(max_model_len),
        "--kv-cache-gib", "0.25", "--max-num-seqs", "16", "--dtype", "float32", "--log-level", "WARNING",
    ]
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            server = ServerProcess(proc, "", log_path)
            server.stop()
            raise RuntimeError(f"generation server did not start (rc={proc.returncode}):\n{server.log_tail()}")
        time.sleep(0.5)
    info = json.loads(ready.read_text())
    server = ServerProcess(proc, f"http://{info['host']}:{info['port']}", log_path)
    assert httpx.get(f"{server.url}/health", timeout=10).status_code == 200
    return server


_SHARED: dict[str, object] = {}


def shared_generation_server() -> tuple[ServerProcess, Path]:
    """The session's server and its model folder (started on first use, stopped at exit)."""
    if "server" not in _SHARED:
        root = Path(tempfile.mkdtemp(prefix="asyncrl-gen-test-"))
        model_dir = build_tiny_random_model(root / "model", seed=0, max_position_embeddings=MAX_MODEL_LEN)
        server = start_server(model_dir, root / "server0")
        _SHARED.update(server=server, model_dir=model_dir, root=root)

        def cleanup() -> None:
            server.stop()
            shutil.rmtree(root, ignore_errors=True)

        atexit.register(cleanup)
    return _SHARED["server"], _SHARED["model_dir"]  # type: ignore[return-value]
