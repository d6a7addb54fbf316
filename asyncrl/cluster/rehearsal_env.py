"""The kfp-kubernetes platform spec's env for one task, as the rehearsal resolves it (see `asyncrl.cluster.rehearsal`).

Pure: secrets and config maps are dicts the caller passes; `status.podIP`/`status.hostIP` become the given pod IP.
"""

from __future__ import annotations

import re
import uuid
from collections.abc import Mapping
from typing import Any

FIELD_PATHS_LOCAL = ("status.podIP", "status.hostIP")


class PlatformEnvError(ValueError):
    """The platform spec asks for something the caller did not give; the message names the task and the field."""


def platform_env(key: str, executor: Mapping[str, Any], inputs: Mapping[str, Any], *, pod_ip: str,
                 secrets: Mapping[str, Mapping[str, str]], config_maps: Mapping[str, Mapping[str, str]]
                 ) -> dict[str, str]:
    """The env a kfp-kubernetes executor config gives task `key`: secretAsEnv and configMapAsEnv from the given
    dicts (a missing one, or a missing key, is an error unless marked optional), fieldPathAsEnv (the pod IP is
    `pod_ip`)."""
    ex = executor
    env: dict[str, str] = {}
    for kind, sources, key_field in (("secret", secrets, "secretKey"),
                                     ("config map", config_maps, "configMapKey")):
        entries = ex.get("secretAsEnv" if kind == "secret" else "configMapAsEnv", [])
        name_field = "secretName" if kind == "secret" else "configMapName"
        for entry in entries:
            name = _platform_name(key, entry, name_field, inputs)
            optional = bool(entry.get("optional", False))
            if name not in sources:
                if optional:
                    continue
                raise PlatformEnvError(f"task {key}: {kind} {name!r} is not given (have {sorted(sources)})")
            for kv in entry.get("keyToEnv", []):
                if kv[key_field] not in sources[name]:
                    if optional:
                        continue
                    raise PlatformEnvError(f"task {key}: {kind} {name!r} has no key {kv[key_field]!r} (for env "
                                           f"{kv['envVar']})")
                env[kv["envVar"]] = str(sources[name][kv[key_field]])
    for fp in ex.get("fieldPathAsEnv", []):
        path = fp.get("fieldPath", "")
        if path in FIELD_PATHS_LOCAL:
            env[fp["name"]] = pod_ip
        elif path == "metadata.name":
            env[fp["name"]] = re.sub(r"[^a-z0-9-]+", "-", key.lower()).strip("-")
        elif path == "metadata.uid":  # a pod's uid: stable per task here
            env[fp["name"]] = str(uuid.uuid5(uuid.NAMESPACE_URL, f"asyncrl-rehearsal/{key}"))
        elif path == "metadata.namespace":
            env[fp["name"]] = "kubeflow"
        else:
            raise PlatformEnvError(f"task {key}: fieldPathAsEnv {fp.get('name')}: field path {path!r} is not "
                                   f"supported (expected one of {[*FIELD_PATHS_LOCAL, 'metadata.name', 'metadata.uid']})")
    return env


def _platform_name(key: str, entry: dict[str, Any], name_field: str, inputs: Mapping[str, Any]) -> str:
    param = entry.get(f"{name_field}Parameter", {})
    if "componentInputParameter" in param:
        ref = param["componentInputParameter"]
        if ref not in inputs:
            raise PlatformEnvError(f"task {key}: {name_field}Parameter: input {ref!r} is not given")
        return str(inputs[ref])
    if "runtimeValue" in param:
        return str(param["runtimeValue"].get("constant", ""))
    if name_field in entry:
        return str(entry[name_field])
    raise PlatformEnvError(f"task {key}: expected {name_field} or {name_field}Parameter")


# ---- volumes and resources --------------------------------------------------------------------------------
# a Kubernetes resource quantity, as the KFP driver parses a task's resources (same form as pods.QUANTITY)
QUANTITY = re.compile(r"^(\d+(\.\d*)?|\.\d+)([eE][+-]?\d+|[numkMGTPE]|[KMGTPE]i)?$")
RESOURCE_FIELDS = ("resourceCpuRequest", "resourceCpuLimit", "resourceMemoryRequest", "resourceMemoryLimit")


def disk_mounts(executor: Mapping[str, Any]) -> list[str]:
    """The mount paths of a task's disk volumes: PVCs, generic ephemeral volumes, emptyDirs not in memory."""
    mounts = [m.get("mountPath", "") for m in executor.get("pvcMount", [])]
    mounts += [v.get("mountPath", "") for v in executor.get("genericEphemeralVolume", [])]
    mounts += [d.get("mountPath", "") for d in executor.get("emptyDirMounts", []) if d.get("medium") != "Memory"]
    return mounts


def volume_env(key: str, executor: Mapping[str, Any], env: Mapping[str, str],
               volumes: Mapping[str, str]) -> dict[str, str]:
    """`env` with every value under a disk volume's mount path moved to that volume's local folder (`volumes`: mount
    path -> folder); a disk volume with no local folder is a PlatformEnvError."""
    out = dict(env)
    for mount in disk_mounts(executor):
        if mount not in volumes:
            raise PlatformEnvError(f"task {key}: the volume mounted at {mount!r} has no local folder (have "
                                   f"{sorted(volumes)})")
        local = volumes[mount].rstrip("/")
        for name, value in env.items():
            if value == mount or value.startswith(mount.rstrip("/") + "/"):
                out[name] = local + value[len(mount.rstrip("/")):]
    return out


def task_resources(key: str, resources: Mapping[str, Any], text: Any) -> dict[str, str]:
    """The task's CPU and memory requests and limits with their placeholders resolved by `text`; a value that is not
    a Kubernetes quantity (the KFP driver would fail the task) is a PlatformEnvError naming the field."""
    out: dict[str, str] = {}
    for name in RESOURCE_FIELDS:
        if name in resources:
            value = text(str(resources[name]))
            if not QUANTITY.match(value):
                raise PlatformEnvError(f"task {key}: resources.{name}: expected a Kubernetes quantity such as 2, "
                                       f"500m or 8Gi, got {value!r}")
            out[name] = value
    return out
