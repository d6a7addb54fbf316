"""The job's child runs in MLflow: one per role instance, under the job's run, holding that instance's own figures.

The job's MLflow run (`asyncrl.run.create`) is the parent: training and evaluation curves, parameters, lineage tags,
dataset inputs. Each role instance (`generation-0`, `environment-env0`, `reward-0`, `training-0`: its *key*,
`<role>-<id>`) gets one child run named by its key, tagged `mlflow.parentRunId` (MLflow's nesting tag: the UI lists
it under the parent), `asyncrl.child` (the key), `asyncrl.role`, `asyncrl.role_id`, `asyncrl.run_id` and
`asyncrl.run_url`. The trainer's reporter logs every instance's figures there (it reads every role's heartbeat
anyway), so the roles themselves never call MLflow.

Created once, by whoever logs to it first (the trainer's reporter thread, or a replay of the tracking spool), through
`ChildRuns.run_id(key)`, in this order:
1. this process's cache;
2. the run's `tracking.json` (`children`: key → MLflow run id);
3. MLflow: a run of the parent's experiment tagged with the parent and the key (made by an attempt that died before
   recording it);
4. a new run, then recorded in `tracking.json` (best effort: step 3 finds it again if that write failed).
So a resumed run, a restarted trainer or a replay reuses the children; none is made twice.

`end_children` ends every child of a run with the parent's status, wherever the parent is ended; `reopen_children`
sets them RUNNING again with the parent (a resumed run).

Invariants: `tracking.json` has one writer at a time (the trainer's rank 0, or a replay once the trainer stopped);
its other fields are kept as they are. A key that is not `<role>-<id>` with valid ids is refused (ValueError naming
it), so no value read from S3 reaches an MLflow filter unchecked.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from typing import Any

from mlflow import MlflowClient
from mlflow.entities import Run

from asyncrl.storage.run_layout import RunPaths, run_url
from asyncrl.storage.s3 import S3Store
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.tracking.spool import StepMetrics

log = logging.getLogger(__name__)

PARENT_TAG = "mlflow.parentRunId"
CHILD_TAG = "asyncrl.child"
CHILDREN = "children"  # the field of tracking.json
JOB = ""  # the key of the job's own run
_KEY = re.compile(r"^(generation|environment|reward|training)-([A-Za-z0-9_-]+)$")
_SEARCH_PAGE = 1000


def child_key(role: str, role_id: str) -> str:
    """The key of role instance `role`/`role_id` (`generation-0`)."""
    return check_key(f"{role}-{role_id}")


def check_key(key: str) -> str:
    if not _KEY.match(key):
        raise ValueError(f"child run key: expected <role>-<id> (role generation, environment, reward or training; id "
                         f"of letters, digits, '_' or '-'), got {key!r}")
    return key


def child_runs(client: MlflowClient, parent_run_id: str) -> list[Run]:
    """Every child run asyncrl made under `parent_run_id` (runs tagged with it as parent and with `asyncrl.child`;
    runs others nested there, such as KFP's task runs, are not among them), oldest first."""
    experiment_id = client.get_run(parent_run_id).info.experiment_id
    out: list[Run] = []
    token = None
    while True:
        page = client.search_runs([experiment_id], filter_string=f"tags.`{PARENT_TAG}` = '{parent_run_id}'",
                                  order_by=["attributes.start_time ASC"], max_results=_SEARCH_PAGE, page_token=token)
        out.extend(r for r in page if CHILD_TAG in r.data.tags)
        token = page.token
        if not token:
            return out


def end_children(client: MlflowClient, parent_run_id: str, status: str) -> list[str]:
    """End every child run of `parent_run_id` with `status` (FINISHED, FAILED, KILLED); the keys of those ended now
    (a child already ended with that status is left as it is)."""
    ended = []
    for run in child_runs(client, parent_run_id):
        if run.info.status != status:
            client.set_terminated(run.info.run_id, status=status)
            ended.append(run.data.tags[CHILD_TAG])
    if ended:
        log.info("MLflow child runs of %s ended %s: %s", parent_run_id, status, ", ".join(ended))
    return ended


def end_with_children(tracker: Tracker, status: str) -> list[str]:
    """End the job's run (`tracker`'s) and every child run of it with `status`; the children's keys ended now."""
    ended = end_children(tracker.client, tracker.run_id, status)
    tracker.finish(status)
    return ended


def reopen_children(client: MlflowClient, parent_run_id: str) -> list[str]:
    """Set every ended child run of `parent_run_id` RUNNING again (the parent is resumed); their keys."""
    reopened = []
    for run in child_runs(client, parent_run_id):
        if run.info.status != "RUNNING":
            client.update_run(run.info.run_id, status="RUNNING")
            reopened.append(run.data.tags[CHILD_TAG])
    return reopened


class ChildRuns:
    """The child runs of one job's run (`parent`, a tracker on the job's MLflow run); see the module docstring."""

    def __init__(self, parent: Tracker, store: S3Store, paths: RunPaths) -> None:
        self.parent, self.store, self.paths = parent, store, paths
        self._ids: dict[str, str] = {}
        self._experiment_id: str | None = None

    def send(self, run: str, steps: Sequence[StepMetrics]) -> None:
        """Log `steps` to the job's run (`run` == JOB) or to the child run keyed `run` (made if needed)."""
        self.parent.log_steps(steps, run_id=None if run == JOB else self.run_id(run))

    def run_id(self, key: str) -> str:
        """The MLflow run id of child `key`, found or made (see the module docstring)."""
        if key in self._ids:
            return self._ids[key]
        check_key(key)
        run_id = self._recorded().get(key) or self._search(key)
        if run_id is None:
            run_id = self._create(key)
            self._record(key, run_id)
        self._ids[key] = run_id
        return run_id

    def _recorded(self) -> dict[str, str]:
        doc = self.store.get_json(self.paths.tracking())
        children = doc.get(CHILDREN) if isinstance(doc, dict) else None
        return {str(k): str(v) for k, v in children.items()} if isinstance(children, dict) else {}

    def _experiment(self) -> str:
        if self._experiment_id is None:
            self._experiment_id = self.parent.client.get_run(self.parent.run_id).info.experiment_id
        return self._experiment_id

    def _search(self, key: str) -> str | None:
        runs = self.parent.client.search_runs(
            [self._experiment()], filter_string=f"tags.`{PARENT_TAG}` = '{self.parent.run_id}' and "
                                                f"tags.`{CHILD_TAG}` = '{key}'",
            order_by=["attributes.start_time ASC"], max_results=1)
        if not runs:
            return None
        self._record(key, runs[0].info.run_id)  # made by an attempt that died before recording it
        return runs[0].info.run_id

    def _create(self, key: str) -> str:
        role, role_id = key.split("-", 1)
        tags = {PARENT_TAG: self.parent.run_id, CHILD_TAG: key, "asyncrl.role": role, "asyncrl.role_id": role_id,
                "asyncrl.run_id": self.paths.run_id,
                "asyncrl.run_url": run_url(self.store.bucket, self.paths.prefix, self.paths.run_id)}
        run = self.parent.client.create_run(self._experiment(), run_name=key, tags=tags)
        log.info("MLflow child run %s (%s) made under %s", run.info.run_id, key, self.parent.run_id)
        return run.info.run_id

    def _record(self, key: str, run_id: str) -> None:
        """Add `key` → `run_id` to tracking.json's children; a failure is a warning (the search finds it again)."""
        try:
            doc: Any = self.store.get_json(self.paths.tracking())
            if not isinstance(doc, dict):
                log.warning("%s: no tracking document; child run %s (%s) not recorded", self.paths.tracking(),
                            run_id, key)
                return
            children = doc.get(CHILDREN) if isinstance(doc.get(CHILDREN), dict) else {}
            if children.get(key) == run_id:
                return
            self.store.put_json(self.paths.tracking(), {**doc, CHILDREN: {**children, key: run_id}})
        except Exception as err:  # noqa: BLE001 - MLflow has the run; the record only saves a search
            log.warning("child run %s (%s) not recorded in %s: %s", run_id, key, self.paths.tracking(), err)
