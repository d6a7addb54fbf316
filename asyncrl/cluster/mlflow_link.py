"""The setup step's Markdown output artifact `mlflow_run`: a link from the KFP run page to the run's MLflow run.

The link is `<tracking URI>/#/experiments/<experiment id>/runs/<run id>`, MLflow's own UI route, for an http(s)
tracking URI; any login in the URI (`user:password@`) and its query are dropped, so no secret reaches the artifact.
Other URIs (a local sqlite store in the rehearsal) get the run id and the URI's scheme only, as text.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol
from urllib.parse import urlsplit, urlunsplit


class TrackedRun(Protocol):
    """What the link needs of `asyncrl.tracking.mlflow_tracker.Tracker`."""

    run_id: str
    tracking_uri: str
    client: Any  # an MlflowClient


def mlflow_run_url(tracking_uri: str, experiment_id: str, run_id: str) -> str | None:
    """The MLflow UI's page of the run, or None when the tracking URI is not an http(s) server."""
    parts = urlsplit(tracking_uri)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return None
    host = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    if ":" in parts.hostname:  # an IPv6 literal keeps its brackets
        host = f"[{parts.hostname}]" + (f":{parts.port}" if parts.port is not None else "")
    base = urlunsplit((parts.scheme, host, parts.path.rstrip("/"), "", ""))
    return f"{base}/#/experiments/{experiment_id}/runs/{run_id}"


def mlflow_link_markdown(tracking_uri: str, experiment_id: str, mlflow_run_id: str, asyncrl_run_id: str) -> str:
    url = mlflow_run_url(tracking_uri, experiment_id, mlflow_run_id)
    where = f"[MLflow run {mlflow_run_id}]({url})" if url else \
        f"MLflow run `{mlflow_run_id}` (experiment {experiment_id}, tracking store `{urlsplit(tracking_uri).scheme}:`)"
    return f"## asyncrl run `{asyncrl_run_id}`\n\n{where}\n"


def write_mlflow_link(path: Path, tracker: TrackedRun | None, asyncrl_run_id: str) -> str:
    """Write the Markdown for `tracker`'s run (or a line saying the run is not tracked) to `path`; returns it."""
    if tracker is None:
        text = f"## asyncrl run `{asyncrl_run_id}`\n\nNot tracked in MLflow (no tracking URI).\n"
    else:
        experiment_id = tracker.client.get_run(tracker.run_id).info.experiment_id
        text = mlflow_link_markdown(tracker.tracking_uri, str(experiment_id), tracker.run_id, asyncrl_run_id)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return text
