"""Rehearsal tasks as real containers: the `docker run` line of one compiled task, as a kubelet would start its pod.

`Containers` turns a resolved `RehearsalTask` into a `docker run` of the task's own image with the container's
command as its entrypoint and its args after it (Kubernetes' `command`/`args`), the task's environment (the
pipeline's env, secrets and config maps, already resolved) from a private env file, never the command line, the
host's network (the local daemon has no bridge; every role binds a free port and publishes it in S3, as in a pod),
and the folders a pod would mount (the cache volume at its mount path, the KFP outputs folder) bound at their
paths. The image's own user runs the task; the bound folders are opened to it. The docker client is the local
process the runner watches: it forwards SIGTERM to the container (a pod's stop) and exits with the container's
code; `kill(name)` and `remove_all()` remove containers whose client is gone. Nothing here reads the network.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from asyncrl.cluster.rehearsal import RehearsalTask

LABEL = "asyncrl.rehearsal"
S3_ENV = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "GOGC", "GOMEMLIMIT", "TMPDIR")
DOCKER_TIMEOUT_S = 60.0


class ContainerError(RuntimeError):
    """A task that cannot be run as a container: the message names the task and what is wrong."""


@dataclass
class Containers:
    """How the runner starts each task: `docker` the client, `mounts` host folder -> container path."""

    docker: str = "docker"
    mounts: dict[str, str] = field(default_factory=dict)  # bound into every container
    volumes: dict[str, str] = field(default_factory=dict)  # a pod volume's mount path -> its host folder
    executors: dict[str, Any] = field(default_factory=dict)  # the platform spec's executors (their volumes)
    s3_image: str = ""  # an image with SeaweedFS's `weed` to run the rehearsal's S3 in (empty: on the host)
    prefix: str = field(default_factory=lambda: f"asyncrl-rh-{uuid.uuid4().hex[:8]}")
    _env_dir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="asyncrl-rh-env-")))

    def __post_init__(self) -> None:
        if shutil.which(self.docker) is None:
            raise ContainerError(f"containers: the client {self.docker!r} is not on PATH (scripts/container-runtime.sh)")
        self._env_dir.chmod(0o700)

    def name(self, task: RehearsalTask) -> str:
        return f"{self.prefix}-{task.name}".replace("_", "-").lower()

    def run_line(self, name: str) -> list[str]:
        """The start of every `docker run` of this rehearsal: removed on exit, named, labelled (`remove_all` finds
        it), on the host's network."""
        return [self.docker, "run", "--rm", "--name", name, "--label", f"{LABEL}={self.prefix}", "--network", "host"]

    def env_file(self, task: RehearsalTask) -> Path:
        """The task's environment for `--env-file`, readable by this user alone (it holds the secrets)."""
        lines = []
        for key, value in sorted(task.env.items()):
            if "\n" in value:
                raise ContainerError(f"task {task.name}: env {key} holds a newline, which an env file cannot carry")
            lines.append(f"{key}={value}")
        self._env_dir.mkdir(mode=0o700, exist_ok=True)  # again after remove_all: a resumed rehearsal reuses this
        path = self._env_dir / f"{self.name(task)}.env"
        path.touch(mode=0o600)
        path.write_text("\n".join(lines) + "\n")
        return path

    def argv(self, task: RehearsalTask) -> list[str]:
        """The `docker run` line of `task`: its image, command as entrypoint, args, env file and mounts."""
        if not task.command:
            raise ContainerError(f"task {task.name}: no container command")
        binds = [a for host, inside in self.mounts.items() for a in ("-v", f"{host}:{inside}")]
        return [*self.run_line(self.name(task)), "--env-file", str(self.env_file(task)), *binds, *self.pod_volumes(task),
                "--entrypoint", task.command[0], task.image, *task.command[1:], *task.args]

    def pod_volumes(self, task: RehearsalTask) -> list[str]:
        """The volumes the platform spec gives `task`'s pod: a memory-backed /dev/shm as the container's shm of
        that size, a disk volume (ephemeral, PVC or emptyDir) as its host folder in `volumes`."""
        spec = self.executors.get(task.executor, {})
        out: list[str] = []
        for mount in spec.get("emptyDirMounts", []):
            if mount.get("medium") == "Memory" and mount["mountPath"] == "/dev/shm":
                out += ["--shm-size", k8s_bytes(mount.get("sizeLimit", "64Mi"))]
            else:
                out += ["-v", f"{self.volume(task, mount['mountPath'])}:{mount['mountPath']}"]
        for mount in [*spec.get("genericEphemeralVolume", []), *spec.get("pvcMount", [])]:
            out += ["-v", f"{self.volume(task, mount['mountPath'])}:{mount['mountPath']}"]
        return out

    def volume(self, task: RehearsalTask, mount_path: str) -> str:
        if mount_path not in self.volumes:
            raise ContainerError(f"task {task.name}: its pod mounts {mount_path}, which the rehearsal has no folder "
                                 f"for (have {sorted(self.volumes)})")
        return self.volumes[mount_path]

    def prepare(self) -> None:
        """Create the bound folders and open them to the images' user (once, before the first task)."""
        for host in [*self.mounts, *self.volumes.values()]:
            Path(host).mkdir(parents=True, exist_ok=True)
            open_to_all(Path(host))

    def s3_launcher(self, data_dir: Path, sock_dir: str) -> list[str]:
        """The `docker run` that runs `weed` in `s3_image` over `data_dir` (for `EmbeddedS3(launcher=...)`): the
        host's network, the data and socket folders bound at their paths, the credentials and Go settings passed by
        name from the client's environment (never on the command line)."""
        for folder in (data_dir, Path(sock_dir)):
            folder.mkdir(parents=True, exist_ok=True)
            open_to_all(folder)
        passed = [a for key in S3_ENV for a in ("-e", key)]
        return [*self.run_line(f"{self.prefix}-s3-{uuid.uuid4().hex[:6]}"), *passed,
                "-v", f"{data_dir}:{data_dir}", "-v", f"{sock_dir}:{sock_dir}", "-w", str(data_dir),
                "--entrypoint", "weed", self.s3_image]

    def kill(self, task: RehearsalTask) -> None:
        """Remove `task`'s container whatever its state (its client was killed: the container outlives it)."""
        subprocess.run([self.docker, "rm", "-f", self.name(task)], capture_output=True, timeout=DOCKER_TIMEOUT_S)

    def remove_all(self) -> None:
        """Remove every container of this rehearsal and the env files."""
        listed = subprocess.run([self.docker, "ps", "-aq", "--filter", f"label={LABEL}={self.prefix}"],
                                capture_output=True, text=True, timeout=DOCKER_TIMEOUT_S)
        ids = listed.stdout.split()
        if ids:
            subprocess.run([self.docker, "rm", "-f", *ids], capture_output=True, timeout=DOCKER_TIMEOUT_S)
        shutil.rmtree(self._env_dir, ignore_errors=True)


def open_to_all(root: Path) -> None:
    """Make `root` and everything under it writable by the images' non-root user, as a pod's emptyDir is."""
    for folder, _dirs, files in os.walk(root):
        os.chmod(folder, 0o777)
        for f in files:
            p = Path(folder) / f
            if not p.is_symlink():
                os.chmod(p, os.stat(p).st_mode | 0o666)


_UNITS = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12}


def k8s_bytes(quantity: str) -> str:
    """A Kubernetes quantity ("16Gi", "512M", "1000") as a byte count for docker."""
    for unit, factor in _UNITS.items():
        if quantity.endswith(unit) and quantity[: -len(unit)].isdigit():
            return str(int(quantity[: -len(unit)]) * factor)
    if quantity.isdigit():
        return quantity
    raise ContainerError(f"size {quantity!r}: expected a Kubernetes quantity such as 16Gi")
