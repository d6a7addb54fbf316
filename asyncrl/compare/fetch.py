"""Reading the runs `asyncrl compare` compares from MLflow: which runs, and the history of the metrics asked for.

Runs are chosen by id (`--runs`), or by experiment name plus an optional MLflow filter string (`--filter
"params.rollout.mode = 'sync'"`), through `MlflowClient.search_runs`; they come back oldest first, so plots and
tables list them in the order they ran. An experiment's runs are the jobs' runs: the child runs of their role
instances (`asyncrl.tracking.child_runs`, tagged `asyncrl.child`) are left out unless `children` asks for them
(`asyncrl compare --children`), and are then labelled `<asyncrl run id>/<role>-<id>`. A name that matches no experiment, a run id that does not exist, a filter
MLflow rejects, or a selection with no run is a `CompareError` naming what was asked.
"""

from __future__ import annotations

from mlflow import MlflowClient
from mlflow.entities import Run
from mlflow.exceptions import MlflowException

from asyncrl.compare.table import SAMPLES_TOTAL, STEP_TIME, THROUGHPUT, Point, RunHistory

MAX_RUNS = 200  # more lines than this in one plot is not a comparison
CHILD_TAG = "asyncrl.child"  # as asyncrl.tracking.child_runs tags a role instance's child run
JOBS_ONLY = f"tags.`{CHILD_TAG}` IS NULL"


class CompareError(Exception):
    """What was asked for cannot be compared; the message names the option and the value."""


def select_runs(client: MlflowClient, experiment: str = "", run_ids: list[str] | None = None,
                filter_string: str = "", children: bool = False) -> list[Run]:
    """The runs asked for: `run_ids` as given, else the experiment's runs matching `filter_string` (the jobs' runs
    only, unless `children`)."""
    if run_ids:
        runs = []
        for run_id in run_ids:
            try:
                runs.append(client.get_run(run_id))
            except MlflowException as err:
                raise CompareError(f"--runs {run_id}: no such MLflow run at {client.tracking_uri} "
                                   f"({err.message.splitlines()[0]})") from err
        if filter_string:
            raise CompareError("--filter: give either --runs or --filter (with --experiment), not both")
        return runs
    exp = client.get_experiment_by_name(experiment)
    if exp is None:
        known = sorted(e.name for e in client.search_experiments())
        raise CompareError(f"--experiment {experiment!r}: no such experiment at {client.tracking_uri}; "
                           f"expected one of {known}")
    search = filter_string if children else " and ".join(f for f in (filter_string, JOBS_ONLY) if f)
    try:
        runs = client.search_runs([exp.experiment_id], filter_string=search,
                                  order_by=["attributes.start_time ASC"], max_results=MAX_RUNS)
    except MlflowException as err:
        raise CompareError(f"--filter {filter_string!r}: MLflow rejected it: {err.message.splitlines()[0]}") from err
    if not runs:
        raise CompareError(f"--experiment {experiment!r}{f' --filter {filter_string!r}' if filter_string else ''}: "
                           "no run matched")
    return list(runs)


def load_history(client: MlflowClient, run: Run, metrics: list[str]) -> RunHistory:
    """The run with the per-step history of `metrics`, and of what rebuilds the samples axis."""
    info, data = run.info, run.data
    history: dict[str, list[Point]] = {}
    for name in dict.fromkeys([*metrics, SAMPLES_TOTAL, THROUGHPUT, STEP_TIME]):
        if name not in data.metrics:
            continue
        history[name] = [Point(int(m.step), float(m.value), int(m.timestamp))
                         for m in client.get_metric_history(info.run_id, name)]
    name = info.run_name or info.run_id[:8]
    if CHILD_TAG in data.tags:  # a role instance's child run: named by its job too
        name = f"{data.tags.get('asyncrl.run_id', '?')}/{name}"
    return RunHistory(run_id=info.run_id, name=name, status=info.status,
                      start_ms=int(info.start_time), end_ms=int(info.end_time) if info.end_time else None,
                      params=dict(data.params), latest={k: float(v) for k, v in data.metrics.items()},
                      history=history)
