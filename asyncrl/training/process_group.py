"""The trainer's torch.distributed setup: the default process group and device of one training rank.

Owns: the env of a lone process (rank 0 of 1) when no launcher set one, the device and backend choice, keeping
DeepSpeed from JIT-building ops it never uses, and forgetting DeepSpeed's caches of a destroyed group.

Device assumption (GPU pods): torchrun starts one rank per GPU and sets LOCAL_RANK; when
`torch.cuda.is_available()`, rank r trains on `cuda:LOCAL_RANK` over NCCL. Without CUDA every rank trains on the
CPU over gloo (the path the tests exercise).
"""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def ensure_dist_env() -> None:
    """Fill in the torch.distributed env of a lone process (rank 0 of 1) where a launcher did not."""
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    if "MASTER_PORT" not in os.environ:
        os.environ["MASTER_PORT"] = str(_free_port())
    for key, value in (("RANK", "0"), ("WORLD_SIZE", "1"), ("LOCAL_RANK", "0")):
        os.environ.setdefault(key, value)


def launcher_world_size() -> int:
    """WORLD_SIZE as a launcher (torchrun) set it; 1 for a lone process."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"WORLD_SIZE: expected an integer from the launcher, got {raw!r}") from None


def training_device() -> torch.device:
    """`cuda:LOCAL_RANK` where CUDA is available (one GPU per rank), else the CPU."""
    if torch.cuda.is_available():
        return torch.device(f"cuda:{int(os.environ.get('LOCAL_RANK', '0'))}")
    return torch.device("cpu")


def init_default_group(timeout_s: float) -> tuple[bool, torch.device]:
    """Join (or create, for a lone process) the default group; returns (this call created it, device).

    NCCL with the rank's GPU set as current device when CUDA is available, else gloo.
    """
    ensure_dist_env()
    device = training_device()
    if device.type == "cuda":
        torch.cuda.set_device(device)
    if dist.is_initialized():
        return False, device
    backend = "nccl" if device.type == "cuda" else "gloo"
    dist.init_process_group(backend, timeout=timedelta(seconds=timeout_s))
    return True, device


def skip_deepspeed_op_builds() -> None:
    """Keep DeepSpeed from JIT-compiling its CPU shared-memory all-reduce op at init (~85 s, once).

    DeepSpeed's TorchBackend builds `deepspeed_shm_comm` when `deepspeed.ops.__compatible_ops__` says
    it can (probing that also runs compilers); the op only serves `inference_all_reduce`, never
    training. Setting the (lazily computed) table to empty makes `build_shm_op` return None.
    """
    import deepspeed.ops

    if "__compatible_ops__" not in vars(deepspeed.ops):
        deepspeed.ops.__compatible_ops__ = {}


def forget_deepspeed_groups() -> None:
    """Drop DeepSpeed's module-level caches of the destroyed process group.

    `deepspeed.utils.groups` caches a clone of the world group and `deepspeed.comm` its backend; a
    later `deepspeed.initialize` in the same process would use the dead group ("Group ... is not
    registered") without this.
    """
    import deepspeed.comm.comm as ds_comm
    from deepspeed.utils import groups

    groups._WORLD_GROUP = None
    groups._ZERO_PARAM_INTRA_PARALLEL_GROUP = None
    groups._DATA_PARALLEL_GROUP = None
    groups._MODEL_PARALLEL_GROUP = None
    for cache in (groups._EXPERT_PARALLEL_GROUP, groups._EXPERT_DATA_PARALLEL_GROUP, groups._ALL_TO_ALL_GROUP):
        cache.clear()
    ds_comm.cdb = None
