"""Start `python -m asyncrl.generation.server` as a subprocess for integration tests.

`shared_generation_server()` and `shared_eos_server()`: the session's two servers (engine start is ~30-60 s
on 2 cores; both start at once on first use and are killed, with their vLLM children, at interpreter exit)
over the same tiny random Qwen2 weights. The first model has no EOS; the second's generation_config.json
names `EOS_TOKEN` as EOS (vLLM, run without a tokenizer, takes the EOS from there).
The shared servers run with `--insecure-no-token` (loopback only; the tests call them without a bearer token);
`start_server(..., token=...)` starts one that requires the token (given through ASYNCRL_ROLE_TOKEN, never argv).
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
    token: str | None = None

    @property
    def headers(self) -> dict[str, str]:
        """The Authorization header this server needs ({} for an insecure one)."""
        return {"Authorization": f"Bearer {self.token}"} if self.token else {}

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


# Long enough that a request is certain to span an /abort or a weight update: ~4 ms per token on 2 cores, so
# a full-length request decodes for ~30 s (tests abort it once they have seen what they wait for).
MAX_MODEL_LEN = 8192


@dataclass
class _Launched:
    proc: subprocess.Popen[bytes]
    ready: Path
    log_path: Path
    token: str | None = None


def _launch(model_dir: Path, work_dir: Path, max_model_len: int, token: str | None = None,
            dtype: str = "float32", kv_after_update: str = "recompute", extra_args: tuple[str, ...] = ()) -> _Launched:
    """Start a server; `token` None: `--insecure-no-token`, else the token goes in ASYNCRL_ROLE_TOKEN."""
    work_dir.mkdir(parents=True, exist_ok=True)
    ready = work_dir / "ready.json"
    log_path = work_dir / "server.log"
    cmd = [
        sys.executable, "-m", "asyncrl.generation.server", "--model", str(model_dir), "--port", "0",
        "--ready-file", str(ready), "--work-dir", str(work_dir / "vllm"), "--max-model-len", str(max_model_len),
        "--kv-cache-gib", "0.25", "--max-num-seqs", "16", "--dtype", dtype, "--kv-after-update", kv_after_update,
        "--log-level", "WARNING", *extra_args,
    ]
    env = {k: v for k, v in os.environ.items() if k != "ASYNCRL_ROLE_TOKEN"}
    # vLLM caches what it learns of a model class (`modelinfos`) under its cache root: one shared root spares each
    # server the subprocess that imports vLLM again to inspect the class (the launcher does the same for runs)
    env.setdefault("VLLM_CACHE_ROOT", str(REPO / ".cache" / "asyncrl" / "vllm"))
    if token is None:
        cmd.append("--insecure-no-token")
    else:
        env["ASYNCRL_ROLE_TOKEN"] = token
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, cwd=REPO, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    return _Launched(proc, ready, log_path, token)


def _wait_ready(launched: list[_Launched], timeout_s: float) -> list[ServerProcess]:
    """Wait until every launched server's ready file exists and /health answers; on failure stop them all."""
    deadline = time.monotonic() + timeout_s
    try:
        for one in launched:
            while not one.ready.exists():
                if one.proc.poll() is not None or time.monotonic() > deadline:
                    tail = ServerProcess(one.proc, "", one.log_path).log_tail()
                    raise RuntimeError(f"generation server did not start (rc={one.proc.returncode}):\n{tail}")
                time.sleep(0.5)
        servers = []
        for one in launched:
            info = json.loads(one.ready.read_text())
            server = ServerProcess(one.proc, f"http://{info['host']}:{info['port']}", one.log_path, one.token)
            assert httpx.get(f"{server.url}/health", headers=server.headers, timeout=10).status_code == 200
            servers.append(server)
        return servers
    except BaseException:
        for one in launched:
            ServerProcess(one.proc, "", one.log_path).stop()
        raise


def start_server(model_dir: Path, work_dir: Path, timeout_s: float = 300.0, max_model_len: int = MAX_MODEL_LEN,
                 token: str | None = None, dtype: str = "float32", kv_after_update: str = "recompute",
                 extra_args: tuple[str, ...] = ()) -> ServerProcess:
    """Start a server on a free port; return once its ready file exists and /health answers. `token`: the
    bearer token it requires (None: an insecure server); `dtype`, `kv_after_update`: generation.dtype and
    generation.kv_after_update of its engine; `extra_args`: more server arguments (e.g. --lora-scale)."""
    return _wait_ready([_launch(model_dir, work_dir, max_model_len, token, dtype, kv_after_update, extra_args)],
                       timeout_s)[0]


EOS_TOKEN = 20  # the most frequent token of the seed-0 tiny model (~8% of sampled tokens)

_SHARED: dict[str, object] = {}


def _start_shared() -> None:
    """Build the model and its EOS copy, start both session servers at once (starts overlap on 2 cores)."""
    root = Path(tempfile.mkdtemp(prefix="asyncrl-gen-test-"))
    model_dir = build_tiny_random_model(root / "model", seed=0, max_position_embeddings=MAX_MODEL_LEN)
    eos_dir = root / "model-eos"
    shutil.copytree(model_dir, eos_dir)
    gen_config = eos_dir / "generation_config.json"
    doc = json.loads(gen_config.read_text()) if gen_config.exists() else {}
    doc["eos_token_id"] = EOS_TOKEN
    gen_config.write_text(json.dumps(doc))
    try:
        server, eos_server = _wait_ready(
            [_launch(model_dir, root / "server0", MAX_MODEL_LEN), _launch(eos_dir, root / "server-eos", MAX_MODEL_LEN)],
            timeout_s=400.0,
        )
    except BaseException:
        shutil.rmtree(root, ignore_errors=True)
        raise
    _SHARED.update(server=server, model_dir=model_dir, eos_server=eos_server, eos_model_dir=eos_dir)

    def cleanup() -> None:
        server.stop()
        eos_server.stop()
        shutil.rmtree(root, ignore_errors=True)

    atexit.register(cleanup)


def shared_generation_server() -> tuple[ServerProcess, Path]:
    """The session's server and its model folder, which has no EOS (started on first use, stopped at exit)."""
    if "server" not in _SHARED:
        _start_shared()
    return _SHARED["server"], _SHARED["model_dir"]  # type: ignore[return-value]


def shared_eos_server() -> tuple[ServerProcess, Path]:
    """The session's second server: same weights, `EOS_TOKEN` as the EOS of its generation config."""
    if "eos_server" not in _SHARED:
        _start_shared()
    return _SHARED["eos_server"], _SHARED["eos_model_dir"]  # type: ignore[return-value]
