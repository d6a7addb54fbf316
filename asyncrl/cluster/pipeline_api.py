"""The Kubeflow Pipelines API calls of `asyncrl pipeline upload|run`, through the `kfp` client, each with a deadline.

- `connect`: a client with the bearer token from KFP_TOKEN or the file named by KF_PIPELINES_SA_TOKEN_PATH
  (never a command-line value), checked with the health endpoint.
- `upload_version`: the pipeline `name` gets a new version named by the git revision (`git-<sha>[-dirty]`) whose
  description lists the image references; the pipeline is created first if it does not exist. A version of that
  name that exists already is reused when its description (the images) is the same and the tree is clean, else
  refused (pass another `--version`).
- `start_run`: a run of one uploaded version (pipeline name + version name -> ids), in an experiment created if
  missing, with caching off and the runner's service account.
`namespace` (multi-user Kubeflow) goes to every call that takes one. Every failure is `ApiError` with a clear
message; the CLI prints it and exits 2. The kfp client's own "details" lines go to stderr, so stdout is JSON only.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any


class ApiError(RuntimeError):
    """A call to the KFP API failed or timed out; the message says which, where and what to do."""


@dataclass(frozen=True)
class Api:
    """A connected client, its host (for messages), the deadline of each call and the namespace (or None)."""

    client: Any
    host: str
    timeout_s: float
    namespace: str | None

    def call(self, what: str, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
        return with_deadline(what, self.host, self.timeout_s, fn, *args, **kwargs)


def with_deadline(what: str, host: str, timeout_s: float, fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """`fn(*args, **kwargs)` with a deadline: the kfp client has none of its own (its HTTP calls wait forever on a
    host that accepts connections but never answers, and its health check retries). The call runs in a daemon
    thread; past the deadline `ApiError` and the thread is abandoned with the process. The client's prints go to
    stderr."""
    result: dict[str, Any] = {}

    def target() -> None:
        try:
            with contextlib.redirect_stdout(sys.stderr):
                result["value"] = fn(*args, **kwargs)
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller's thread
            result["error"] = err

    worker = threading.Thread(target=target, name=f"kfp-{what}", daemon=True)
    worker.start()
    worker.join(timeout_s)
    if worker.is_alive():
        raise ApiError(f"{what}: no answer from the Kubeflow Pipelines API at {host} within {timeout_s:g}s "
                       f"(--api-timeout)")
    if "error" in result:
        err = result["error"]
        text = str(err).splitlines()[0][:300] if str(err) else repr(err)
        raise ApiError(f"{what}: the Kubeflow Pipelines API at {host} failed: {text}") from err
    return result.get("value")


def rejected_credentials(err: ApiError) -> bool:
    """The API refused the token: its answer's status (kfp's ApiException carries it) is 401 or 403, or the error
    says Unauthorized / Forbidden. Not a bare "401" or "403" anywhere in the text: a port such as 54403 has one."""
    status = getattr(err.__cause__, "status", None)
    if isinstance(status, int) and status in (401, 403):
        return True
    return re.search(r"\b(Unauthorized|Forbidden)\b|\((401|403)\)", str(err)) is not None


def connect(host: str, timeout_s: float, namespace: str | None) -> Api:
    import kfp

    token = os.environ.get("KFP_TOKEN", "")
    path = os.environ.get("KF_PIPELINES_SA_TOKEN_PATH", "")
    if not token and path:
        if not Path(path).is_file():
            raise ApiError(f"KF_PIPELINES_SA_TOKEN_PATH={path}: no such token file")
        token = Path(path).read_text().strip()

    def healthy() -> Any:
        client = kfp.Client(host=host, existing_token=token or None)
        client.get_kfp_healthz(sleep_duration=1)
        return client

    try:
        client = with_deadline("connect", host, timeout_s, healthy)
    except ApiError as err:
        text = str(err)
        if "no answer" in text:
            raise
        if rejected_credentials(err):
            raise ApiError(f"the Kubeflow Pipelines API at {host} rejected the credentials: set KFP_TOKEN or "
                           f"KF_PIPELINES_SA_TOKEN_PATH to a valid token ({text[:200]})") from None
        raise ApiError(f"cannot reach the Kubeflow Pipelines API at {host}: {text}") from None
    return Api(client, host, timeout_s, namespace)


def _by_name(name: str) -> str:
    return json.dumps({"predicates": [{"operation": "EQUALS", "key": "display_name", "stringValue": name}]})


def pipeline_id(api: Api, name: str) -> str | None:
    """The id of the pipeline named `name` (in `namespace`, when given), None if there is none."""
    kwargs = {"namespace": api.namespace} if api.namespace else {}
    found = api.call("list_pipelines", api.client.list_pipelines, filter=_by_name(name), page_size=2, **kwargs)
    pipelines = found.pipelines or []
    if len(pipelines) > 1:
        raise ApiError(f"--name {name}: {len(pipelines)} pipelines have this name at {api.host}; expected one")
    return pipelines[0].pipeline_id if pipelines else None


def find_version(api: Api, pid: str, version: str) -> Any | None:
    found = api.call("list_pipeline_versions", api.client.list_pipeline_versions, pid, filter=_by_name(version),
                     page_size=2)
    versions = found.pipeline_versions or []
    return versions[0] if versions else None


def upload_version(api: Api, package: Path, name: str, version: str, description: str,
                   reuse_same: bool) -> dict[str, Any]:
    """Upload `package` as version `version` of pipeline `name` (created if missing); see the module docstring."""
    pid = pipeline_id(api, name)
    created = pid is None
    if created:
        kwargs = {"namespace": api.namespace} if api.namespace else {}
        p = api.call("upload_pipeline", api.client.upload_pipeline, str(package), pipeline_name=name,
                     description=description, **kwargs)
        pid = p.pipeline_id
    existing = find_version(api, pid, version)
    if existing is not None:
        if reuse_same and (existing.description or "") == description:
            return {"pipeline_id": pid, "version_id": existing.pipeline_version_id, "version": version,
                    "new_pipeline": created, "new_version": False}
        raise ApiError(f"--version {version}: pipeline {name} already has a version of this name"
                       f"{' with other images' if reuse_same else ' (the tree has uncommitted changes)'}; pass "
                       f"--version to name the new one")
    v = api.call("upload_pipeline_version", api.client.upload_pipeline_version, str(package),
                 pipeline_version_name=version, pipeline_id=pid, description=description)
    return {"pipeline_id": pid, "version_id": v.pipeline_version_id, "version": version, "new_pipeline": created,
            "new_version": True}


def resolve_version(api: Api, name: str, version: str) -> tuple[str, str]:
    """(pipeline id, version id) of version `version` of pipeline `name`; ApiError naming what is missing."""
    pid = pipeline_id(api, name)
    if pid is None:
        raise ApiError(f"--name {name}: no such pipeline at {api.host}"
                       f"{f' in namespace {api.namespace}' if api.namespace else ''}; upload it first "
                       f"(`asyncrl pipeline upload`, or `asyncrl pipeline run --upload`)")
    found = find_version(api, pid, version)
    if found is None:
        raise ApiError(f"--version {version}: pipeline {name} has no version of this name; upload it first "
                       f"(`asyncrl pipeline upload`, or `asyncrl pipeline run --upload`)")
    return pid, found.pipeline_version_id


def start_run(api: Api, pid: str, vid: str, *, experiment: str, run_name: str, params: dict[str, Any],
              service_account: str) -> dict[str, Any]:
    """Start a run of version `vid` of pipeline `pid` in `experiment` (created if missing); caching off."""
    kwargs = {"namespace": api.namespace} if api.namespace else {}
    exp = api.call("create_experiment", api.client.create_experiment, experiment, **kwargs)
    run = api.call("run_pipeline", api.client.run_pipeline, experiment_id=exp.experiment_id, job_name=run_name,
                   params=params, pipeline_id=pid, version_id=vid, enable_caching=False,
                   service_account=service_account)
    return {"run_id": run.run_id, "experiment": experiment, "experiment_id": exp.experiment_id,
            "pipeline_id": pid, "version_id": vid}
