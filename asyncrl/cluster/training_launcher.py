"""The pipeline's multi-node training step: create the training job, follow it to its end, delete it when stopped.

    python -m asyncrl.cluster.training_launcher --nodes N --gpus-per-node G --image IMG --run-url s3://b/p/run \
        [--engine auto|trainjob|pytorchjob] [--kueue-queue Q] [--timeout-s S]

Runs in the light image inside the pipeline's training task when `training_nodes > 1`, as the service account the
run uses (`asyncrl-runner`, manifests/base/rbac.yaml: create/get/watch/delete on trainjobs and pytorchjobs). It
builds the job (`asyncrl.cluster.training_job`) in its own namespace (the service account's namespace file), owned
by its own pod (`ASYNCRL_POD_NAME`/`ASYNCRL_POD_UID`, set from the downward API by the pipeline), so deleting the
run deletes the job. `--engine auto` takes a `TrainJob` where the cluster serves `trainer.kubeflow.org/v1alpha1`
trainjobs, else a `PyTorchJob` where it serves `kubeflow.org/v1` pytorchjobs, else fails naming both.

It then reads the job every `--poll-s` and prints each new condition (one JSON line: type, reason, message); it
exits 0 when the job succeeded, 1 naming the failed condition when it failed, and deletes the job and exits 1 when
`--timeout-s` passes or the API stays unreachable for `--api-grace-s`. On SIGTERM/SIGINT (the run stopped, the pod
deleted) it deletes the job (its pods with it) and exits 143. Every API call has a deadline. No secret passes
through here: the job's pods read theirs by reference.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.cluster.training_job import ENGINES, Owner, TrainingJobSpec, api_of, build

NAMESPACE_FILE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
API_TIMEOUT_S = 30.0  # every call to the Kubernetes API
POD_NAME_ENV, POD_UID_ENV = "ASYNCRL_POD_NAME", "ASYNCRL_POD_UID"
# the terminal conditions of each engine: (succeeded, failed)
TERMINAL = {"trainjob": ("Complete", "Failed"), "pytorchjob": ("Succeeded", "Failed")}


class LaunchError(RuntimeError):
    """The job could not be created, failed, or outlived its deadline; the message says which and why."""


@dataclass(frozen=True)
class JobState:
    done: bool
    succeeded: bool
    conditions: tuple[tuple[str, str, str], ...]  # (type, reason, message) of each condition with status True

    @property
    def summary(self) -> str:
        return "; ".join(f"{t} ({r}): {m}" for t, r, m in self.conditions) or "no condition yet"


def job_state(obj: dict[str, Any], engine: str) -> JobState:
    """Where a job is, from its status conditions (`status: "True"` only)."""
    ok, failed = TERMINAL[engine]
    conditions = tuple((str(c.get("type", "")), str(c.get("reason", "")), str(c.get("message", "")))
                       for c in (obj.get("status") or {}).get("conditions") or [] if c.get("status") == "True")
    kinds = {t for t, _, _ in conditions}
    if failed in kinds:
        return JobState(True, False, conditions)
    return JobState(ok in kinds, ok in kinds, conditions)


def dropped_fields(sent: Any, stored: Any, path: str) -> list[str]:
    """The paths of fields in `sent` that `stored` lacks (defaults the server added are not looked at)."""
    if isinstance(sent, dict):
        if not isinstance(stored, dict):
            return [path]
        return [m for k, v in sent.items() for m in (dropped_fields(v, stored[k], f"{path}.{k}") if k in stored
                                                     else [f"{path}.{k}"])]
    if isinstance(sent, list):
        if not isinstance(stored, list) or len(stored) != len(sent):
            return [path]
        return [m for i, (a, b) in enumerate(zip(sent, stored, strict=True)) for m in dropped_fields(a, b, f"{path}[{i}]")]
    return []


def job_name(pod_uid: str) -> str:
    """One job per launcher pod: `asyncrl-training-<12 hex digits of the pod uid>`."""
    digits = "".join(c for c in pod_uid.lower() if c in "0123456789abcdef")[:12]
    if len(digits) < 12:
        raise LaunchError(f"{POD_UID_ENV}: expected the launcher pod's uid (from the downward API), got {pod_uid!r}")
    return f"asyncrl-training-{digits}"


def own_namespace(path: Path = NAMESPACE_FILE) -> str:
    try:
        return path.read_text().strip()
    except OSError as err:
        raise LaunchError(f"{path}: expected the service account's namespace file (running in a pod?): {err}") from err


def served_engines(api: Any) -> list[str]:
    """The engines whose CRD the cluster serves, in preference order (API discovery; needs no RBAC rule)."""
    from kubernetes.client.rest import ApiException

    out = []
    for engine in ENGINES:
        group, version, plural = api_of(engine)
        try:
            resources = api.get_api_resources(group, version, _request_timeout=API_TIMEOUT_S)
        except ApiException as err:
            if err.status == 404:
                continue
            raise
        if resources is not None and any(r.name == plural for r in resources.resources):
            out.append(engine)
    return out


def choose_engine(asked: str, served: list[str]) -> str:
    if asked != "auto":
        if asked not in served:
            raise LaunchError(f"--engine {asked}: the cluster does not serve {'/'.join(api_of(asked)[:2])} "
                              f"{api_of(asked)[2]} (served: {served or 'neither'})")
        return asked
    if not served:
        raise LaunchError("--engine auto: the cluster serves neither trainer.kubeflow.org/v1alpha1 trainjobs "
                          "(Kubeflow Trainer) nor kubeflow.org/v1 pytorchjobs (training operator): install one")
    return served[0]


class Launcher:
    """Creates one job, follows it, deletes it on stop; `api` is a kubernetes CustomObjectsApi."""

    def __init__(self, api: Any, engine: str, namespace: str, name: str, poll_s: float, api_grace_s: float) -> None:
        self.api, self.engine, self.namespace, self.name = api, engine, namespace, name
        self.group, self.version, self.plural = api_of(engine)
        self.poll_s, self.api_grace_s = poll_s, api_grace_s
        self.stopping = False

    def create(self, obj: dict[str, Any]) -> None:
        """Create the job; LaunchError (after deleting it) when the API server dropped fields of its spec (a CRD
        release older than the one the objects target prunes what its schema lacks, silently)."""
        stored = self.api.create_namespaced_custom_object(self.group, self.version, self.namespace, self.plural, obj,
                                                          _request_timeout=API_TIMEOUT_S)
        _say("created", kind=obj["kind"], name=self.name, namespace=self.namespace)
        missing = dropped_fields(obj["spec"], (stored or {}).get("spec", {}), "spec")
        if missing:
            self.delete()
            raise LaunchError(f"{obj['kind']} {self.name}: the cluster's {self.group} schema dropped {missing[:5]}: "
                              f"its release predates the fields asyncrl sets (docs/multinode_training.md)")

    def delete(self) -> None:
        from kubernetes.client.rest import ApiException

        try:
            self.api.delete_namespaced_custom_object(self.group, self.version, self.namespace, self.plural,
                                                     self.name, propagation_policy="Background",
                                                     _request_timeout=API_TIMEOUT_S)
            _say("deleted", name=self.name)
        except ApiException as err:
            if err.status != 404:
                _say("delete failed", name=self.name, status=err.status, reason=str(err.reason))

    def wait(self, timeout_s: float) -> JobState:
        """Follow the job until it ends; LaunchError past `timeout_s`, or when the API stays unreachable."""
        deadline = time.monotonic() + timeout_s
        last_ok, seen = time.monotonic(), set()
        while not self.stopping:
            try:
                obj = self.api.get_namespaced_custom_object(self.group, self.version, self.namespace, self.plural,
                                                            self.name, _request_timeout=API_TIMEOUT_S)
                last_ok = time.monotonic()
            except Exception as err:  # noqa: BLE001 - any API failure is retried until api_grace_s
                if getattr(err, "status", None) == 404:
                    raise LaunchError(f"{self.plural} {self.name}: deleted by someone else") from err
                if time.monotonic() - last_ok > self.api_grace_s:
                    raise LaunchError(f"the Kubernetes API did not answer for {self.api_grace_s:.0f} s: {err}") from err
                obj = None
            if obj is not None:
                state = job_state(obj, self.engine)
                for cond in state.conditions:
                    if cond not in seen:
                        seen.add(cond)
                        _say("condition", name=self.name, type=cond[0], reason=cond[1], message=cond[2])
                if state.done:
                    return state
            if time.monotonic() > deadline:
                raise LaunchError(f"{self.plural} {self.name}: not finished after --timeout-s {timeout_s:.0f}")
            time.sleep(self.poll_s)
        raise LaunchError("stopped")


def _say(event: str, **fields: Any) -> None:
    print(json.dumps({"event": event, **fields}), flush=True)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="python -m asyncrl.cluster.training_launcher",
                                description=__doc__.splitlines()[0])
    p.add_argument("--nodes", type=int, required=True, help="training nodes (pods)")
    p.add_argument("--gpus-per-node", type=int, required=True, help="GPUs (training ranks) per node")
    p.add_argument("--image", required=True, help="the training image")
    p.add_argument("--run-url", required=True, help="s3://bucket/prefix/run_id")
    p.add_argument("--engine", default="auto", choices=["auto", *ENGINES])
    p.add_argument("--kueue-queue", default="", help="Kueue LocalQueue to admit the job through (empty: none)")
    p.add_argument("--namespace", default="", help="default: the service account's namespace")
    p.add_argument("--timeout-s", type=float, default=7 * 24 * 3600.0)
    p.add_argument("--poll-s", type=float, default=10.0)
    p.add_argument("--api-grace-s", type=float, default=300.0)
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    try:
        pod_name, pod_uid = os.environ.get(POD_NAME_ENV, ""), os.environ.get(POD_UID_ENV, "")
        if not pod_name:
            raise LaunchError(f"{POD_NAME_ENV}: expected the launcher pod's name (from the downward API)")
        spec = TrainingJobSpec(name=job_name(pod_uid), namespace=args.namespace or own_namespace(),
                               image=args.image, nodes=args.nodes, gpus_per_node=args.gpus_per_node,
                               run_url=args.run_url, owner=Owner(pod_name, pod_uid), kueue_queue=args.kueue_queue)
        spec.check()
    except (LaunchError, ValueError) as err:
        print(f"training_launcher: {err}", file=sys.stderr)
        sys.exit(2)
    from kubernetes import client, config
    from kubernetes.client.rest import ApiException

    try:
        config.load_incluster_config()
    except config.ConfigException as err:
        print(f"training_launcher: expected to run in a Kubernetes pod with its service account token (the "
              f"pipeline's training task; a local rehearsal has no cluster to create the job on): {err}",
              file=sys.stderr)
        sys.exit(2)
    api = client.CustomObjectsApi()
    try:
        served = served_engines(api)
        candidates = [choose_engine(args.engine, served)]
    except (LaunchError, ApiException) as err:
        print(f"training_launcher: {err}", file=sys.stderr)
        sys.exit(2)
    if args.engine == "auto":  # the other engine too, should the first one's CRD be too old for the object
        candidates += [e for e in served if e not in candidates]
    current: list[Launcher] = []

    def stop(signum: int, _frame: Any) -> None:
        _say("stopping", signal=signal.Signals(signum).name, name=spec.name)
        for one in current:
            one.stopping = True
            one.delete()
        sys.exit(128 + signum)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    for i, engine in enumerate(candidates):
        launcher = Launcher(api, engine, spec.namespace, spec.name, args.poll_s, args.api_grace_s)
        current[:] = [launcher]
        try:
            launcher.create(build(spec, engine))
            break
        except ApiException as err:  # 403: the RBAC rules are missing; 409: this pod already created it
            print(f"training_launcher: creating {engine} {spec.name} in {spec.namespace}: {err.status} "
                  f"{err.reason}: {err.body}", file=sys.stderr)
            sys.exit(1)
        except LaunchError as err:
            if i + 1 == len(candidates):
                print(f"training_launcher: {err}", file=sys.stderr)
                sys.exit(1)
            _say("engine refused the object", engine=engine, reason=str(err), next=candidates[i + 1])
    try:
        state = launcher.wait(args.timeout_s)
    except LaunchError as err:
        launcher.delete()
        print(f"training_launcher: {err}", file=sys.stderr)
        sys.exit(1)
    if not state.succeeded:
        print(f"training_launcher: {spec.name} failed: {state.summary}", file=sys.stderr)
        sys.exit(1)
    _say("succeeded", name=spec.name)


if __name__ == "__main__":
    main()
