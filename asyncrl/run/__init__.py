"""A run's lifecycle, written once for both ways of running one: the embedded launcher (`asyncrl.local`) and the
pipeline's steps (`asyncrl.cluster`) call these functions and hold no rule of their own.

`create`: validate, write the run's documents once (`config.json` by conditional PUT, `model.json`, `tracking.json`)
and open its MLflow run. `resume`: check a stored run can go on with the configuration given (only `training.steps`
may grow), rewind it to its last committed checkpoint, re-attach its MLflow run. `finalize`: the `done` marker, the
final status, the summary, the registered model, the MLflow run's end. `summary`: what a finished run reports.
`documents`: the run documents these modules share (`resumes.json`, `final_status.json`).

Never imports `asyncrl.local`, `asyncrl.cluster` or `asyncrl.roles` (tests/unit/test_import_rules.py).
"""
