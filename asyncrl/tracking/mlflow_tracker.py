"""MLflow tracking of one run, shared by every role process.

`Tracker` wraps an explicit `mlflow.MlflowClient` bound to one run id: no global active-run state, so
several processes (trainer, environment, ...) log to the same run by `Tracker.attach(uri, run_id)`.
Embedded mode uses one `sqlite:///<runs folder>/mlflow.db` for every local run (so runs compare side by side), with artifacts in
`<runs folder>/artifacts` (set as the experiment's artifact location when the experiment is created).

Every tracker bounds the client's HTTP requests first (`asyncrl.tracking.mlflow_calls.bound_http_requests`: no
retries inside the client, a per-request timeout), so that callers put their own deadline on each call.

Invariants: parameters are flattened to `section.key` strings and any key that looks like a secret
is dropped before anything is sent (`flatten_params`); metric values are finite-or-NaN floats; every
batch respects MLflow's per-request limits.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Metric, Param, RunTag
from mlflow.exceptions import MlflowException

from asyncrl.secret_names import is_secret_key
from asyncrl.tracking.mlflow_calls import bound_http_requests, transient

log = logging.getLogger(__name__)

_MAX_PARAM_VALUE = 6000
_MAX_KEY = 250
_PARAMS_PER_BATCH = 100
_METRICS_PER_BATCH = 1000
_STATUSES = ("FINISHED", "FAILED", "KILLED")


def _param_value(value: Any) -> str:
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str)
    if len(text) > _MAX_PARAM_VALUE:
        suffix = "...<truncated>"
        text = text[: _MAX_PARAM_VALUE - len(suffix)] + suffix
    return text


def flatten_params(params: Mapping[str, Any], prefix: str = "") -> dict[str, str]:
    """Nested dict -> {"section.key": "value"}; lists/None as JSON; secret-looking keys dropped."""
    out: dict[str, str] = {}
    for k, v in params.items():
        key = f"{prefix}.{k}" if prefix else str(k)
        if is_secret_key(key):
            log.debug("not logging parameter %s (looks secret)", key)
            continue
        if isinstance(v, Mapping):
            out.update(flatten_params(v, key))
        elif len(key) <= _MAX_KEY:
            out[key] = _param_value(v)
        else:
            log.warning("parameter name longer than %d characters dropped: %s...", _MAX_KEY, key[:60])
    return out


def embedded_tracking_uri(runs_dir: Path | str) -> str:
    """`sqlite:///<abs runs folder>/mlflow.db`: the embedded-mode store shared by the runs in that folder."""
    return f"sqlite:///{Path(runs_dir).resolve() / 'mlflow.db'}"


def _default_artifact_location(tracking_uri: str) -> str | None:
    """For a sqlite store, `<folder of the db>/artifacts` as a file URI; None otherwise (server default)."""
    if tracking_uri.startswith("sqlite:///"):
        db = Path(tracking_uri[len("sqlite:///") :])
        return (db.parent / "artifacts").resolve().as_uri()
    return None


def _artifact_uri(root: str | Path | None) -> str | None:
    if root is None or root == "":
        return None
    if isinstance(root, str) and "://" in root:
        return root
    return Path(root).resolve().as_uri()


def _experiment_id(client: MlflowClient, name: str, artifact_location: str | None) -> str:
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        return exp.experiment_id
    try:
        return client.create_experiment(name, artifact_location=artifact_location)
    except MlflowException:  # another process created it first
        exp = client.get_experiment_by_name(name)
        if exp is None:
            raise
        return exp.experiment_id


class Tracker:
    """Logs to one MLflow run through an explicit client. Safe to use from several processes."""

    def __init__(self, client: MlflowClient, run_id: str, tracking_uri: str) -> None:
        bound_http_requests()  # the client reads it at each request
        self.client = client
        self.run_id = run_id
        self.tracking_uri = tracking_uri

    def __repr__(self) -> str:
        return f"Tracker(tracking_uri={self.tracking_uri!r}, run_id={self.run_id!r})"

    @classmethod
    def create(
        cls,
        tracking_uri: str,
        experiment: str,
        run_name: str,
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, str] | None = None,
        artifact_root: str | Path | None = None,
    ) -> Tracker:
        """Create the experiment if needed, start a run, log flattened params and tags.

        `artifact_root` (a folder path or a URI) becomes the artifact location of a *new* experiment;
        default: `<db folder>/artifacts` for a sqlite store, the server's default otherwise. An existing
        experiment keeps its own location.
        """
        if not tracking_uri:
            raise ValueError("tracking_uri: expected an MLflow tracking URI, got ''")
        t0 = time.monotonic()
        bound_http_requests()
        client = MlflowClient(tracking_uri=tracking_uri)
        exp_id = _experiment_id(client, experiment, _artifact_uri(artifact_root) or _default_artifact_location(tracking_uri))
        run = client.create_run(exp_id, run_name=run_name, tags={k: str(v) for k, v in (tags or {}).items()})
        tracker = cls(client, run.info.run_id, tracking_uri)
        if params:
            tracker.log_params(params)
        log.info("MLflow run %s created in %.1fs (%s)", tracker.run_id, time.monotonic() - t0, tracking_uri)
        return tracker

    @classmethod
    def attach(cls, tracking_uri: str, run_id: str) -> Tracker:
        """A tracker on an existing run (another process's); error if MLflow says the run does not exist. An MLflow
        that cannot be reached now is only a warning: the tracker's calls fail (and its callers retry or spool)
        until it is back."""
        tracker = cls.for_run(tracking_uri, run_id)
        try:
            tracker.client.get_run(run_id)
        except MlflowException as e:
            if not transient(e):
                raise ValueError(f"MLflow run {run_id!r} not found at {tracking_uri}: {e.message}") from e
            log.warning("MLflow at %s unavailable (%s): run %s not checked", tracking_uri,
                        str(e.message).splitlines()[0][:200], run_id)
        return tracker

    @classmethod
    def for_run(cls, tracking_uri: str, run_id: str) -> Tracker:
        """A tracker on run `run_id`, without asking MLflow anything (see `attach`)."""
        bound_http_requests()
        return cls(MlflowClient(tracking_uri=tracking_uri), run_id, tracking_uri)

    def log_params(self, params: Mapping[str, Any]) -> None:
        items = [Param(k, v) for k, v in sorted(flatten_params(params).items())]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, params=items[i : i + _PARAMS_PER_BATCH], synchronous=True)

    def log_metrics(self, metrics: Mapping[str, float], step: int, timestamp_ms: int | None = None) -> None:
        """Log `metrics` at `step` (at `timestamp_ms`, default now); values must be numbers (bool/int/float); inf
        becomes an error."""
        now = int(time.time() * 1000) if timestamp_ms is None else int(timestamp_ms)
        self.log_steps([(metrics, step, now)])

    def log_steps(self, steps: Sequence[tuple[Mapping[str, float], int, int]], run_id: str | None = None) -> None:
        """Log several steps' metrics, each (metrics, step, timestamp in ms), in as few calls as MLflow's batch
        limit allows (one database commit each); values as for `log_metrics`, all checked before anything is
        sent. `run_id`: another run of the same store (a child run, `asyncrl.tracking.child_runs`); default this
        tracker's."""
        items = []
        for metrics, step, timestamp_ms in steps:
            for k, v in metrics.items():
                try:
                    value = float(v)
                except (TypeError, ValueError) as e:
                    raise ValueError(f"metric {k!r}: expected a number, got {v!r}") from e
                if math.isinf(value):
                    raise ValueError(f"metric {k!r}: expected a finite number or NaN, got {value}")
                items.append(Metric(key=k, value=value, timestamp=int(timestamp_ms), step=int(step)))
        for i in range(0, len(items), _METRICS_PER_BATCH):
            self.client.log_batch(run_id or self.run_id, metrics=items[i : i + _METRICS_PER_BATCH], synchronous=True)

    def set_tags(self, tags: Mapping[str, Any]) -> None:
        items = [RunTag(k, str(v)) for k, v in tags.items()]
        for i in range(0, len(items), _PARAMS_PER_BATCH):
            self.client.log_batch(self.run_id, tags=items[i : i + _PARAMS_PER_BATCH], synchronous=True)

    def log_dict(self, obj: Any, artifact_file: str) -> None:
        """Store `obj` as a JSON (or YAML, by extension) artifact of the run."""
        self.client.log_dict(self.run_id, obj, artifact_file)

    def finish(self, status: str = "FINISHED") -> None:
        if status not in _STATUSES:
            raise ValueError(f"status: expected one of {_STATUSES}, got {status!r}")
        self.client.set_terminated(self.run_id, status=status)
