"""How a rehearsal task becomes a local process: its command line and its environment.

`local_argv` maps a container command to this machine (`asyncrl-task` -> this interpreter's
`asyncrl.task_entrypoint`); `base_env` is what every local task inherits (this environment without what a pod is
given by the cluster, plus what the images provide); `client_env` is the little a docker client needs when the task
runs as a container instead (`asyncrl.cluster.rehearsal_containers`), whose own environment comes from its env file.
`shown` prints a command line for people.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from pathlib import Path

# what a pod does not inherit from this shell: the cluster gives these (or nothing) through the pipeline's env
NOT_INHERITED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL",
                 "AWS_PROFILE", "MLFLOW_RUN_ID", "POD_IP", "ASYNCRL_BIND_HOST", "MASTER_ADDR", "MASTER_PORT",
                 "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK",
                 "TORCHELASTIC_RUN_ID", "ASYNCRL_ROLE_TOKEN")
MAX_SHOWN_ARG = 160
CODE_ROOT = Path(__file__).resolve().parents[2]  # the folder holding the asyncrl package this process imported
TASK_ENTRYPOINT = "asyncrl-task"  # pyproject.toml [project.scripts]; the components' command


def local_argv(command: Sequence[str], python: str = sys.executable) -> list[str]:
    """The local equivalent of a container command: `asyncrl-task` → `python -m asyncrl.task_entrypoint` (the
    images' console script, run by this interpreter), `python`/`python3` → this interpreter, `torchrun` →
    `python -m torch.distributed.run`; anything else unchanged."""
    if not command:
        raise ValueError("command: expected a non-empty container command")
    head, rest = command[0], list(command[1:])
    if head == TASK_ENTRYPOINT:
        return [python, "-m", "asyncrl.task_entrypoint", *rest]
    if head in ("python", "python3"):
        return [python, *rest]
    if head == "torchrun":
        return [python, "-m", "torch.distributed.run", *rest]
    return [head, *rest]


def shown(argv: Sequence[str]) -> str:
    """A command line for people: long arguments (the finalize component's source) cut short."""
    def cut(a: str) -> str:
        first = a.strip().splitlines()[0] if a.strip() else a
        return a if len(a) <= MAX_SHOWN_ARG and "\n" not in a else f"{first[:MAX_SHOWN_ARG]}...<{len(a)} chars>"

    return shlex.join(cut(a) for a in argv)


def base_env(workdir: Path, rpc_dir: Path, cache_dir: Path) -> dict[str, str]:
    """What every task inherits: this environment without credentials, endpoints and launcher variables (the
    pipeline must provide them), plus what the images provide (PATH to the interpreter, the asyncrl this process
    runs, first on PYTHONPATH: the tasks start in their own folders, where an editable install of another checkout
    would otherwise win; caches, no downloads), and the rehearsal's folder (`ASYNCRL_RUN_DIR`). vLLM's cache is the
    pipeline's own `VLLM_CACHE_ROOT` (`/cache/vllm`, moved to the cache volume's local folder), which a task's env
    sets over these."""
    env = {k: v for k, v in os.environ.items() if k not in NOT_INHERITED}
    env.update({
        "PATH": os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")]),
        "PYTHONPATH": os.pathsep.join(p for p in (str(CODE_ROOT), env.get("PYTHONPATH", "")) if p),
        "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1", "DS_BUILD_OPS": "0",
        "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1",
        "ASYNCRL_RUN_DIR": str(workdir), "VLLM_RPC_BASE_PATH": str(rpc_dir),
        "TORCH_EXTENSIONS_DIR": os.environ.get("TORCH_EXTENSIONS_DIR", str(cache_dir / "torch_extensions")),
    })
    return env


def client_env() -> dict[str, str]:
    """What a docker client needs to reach its daemon; a container's own env comes from its env file."""
    keep = ("PATH", "HOME", "DOCKER_HOST", "DOCKER_CONFIG", "DOCKER_CONTEXT", "XDG_RUNTIME_DIR")
    return {k: os.environ[k] for k in keep if k in os.environ}
