"""The status rule of a run's end (asyncrl.run.documents): the exit task's `PipelineTaskFinalStatus.state`, exact
strings as the KFP backend, Vertex AI and the embedded launcher write them, plus the run's `stopped.json` and the
trainer's last heartbeat state → "succeeded" / "cancelled" / "failed" → MLflow FINISHED / KILLED / FAILED."""

import pytest

from asyncrl.run.documents import OUTCOMES, ended_successfully, run_outcome

STOP = {"role": "training", "id": "0", "signal": "SIGTERM", "pid": 1, "time": 0.0}


@pytest.mark.parametrize("state", ["SUCCEEDED", "COMPLETE", "succeeded"])
def test_success_states_finish_the_run_even_after_a_role_was_stopped(state):
    # an evicted generation pod (retried) recorded a stop, and the run went on to the end
    assert run_outcome(state, None, "finished") == run_outcome(state, STOP, "finished") == "succeeded"
    assert OUTCOMES["succeeded"] == "FINISHED"


@pytest.mark.parametrize("state", ["CANCELED", "CANCELLED", "CANCELING", "CANCELLING"])
def test_cancel_states_kill_the_run(state):
    assert run_outcome(state, None, None) == run_outcome(state, STOP, "failed") == "cancelled"
    assert OUTCOMES["cancelled"] == "KILLED"


@pytest.mark.parametrize("state", ["FAILED", "RUNNING", "UNKNOWN", "Unknown", ""])
def test_other_states_are_a_cancel_only_when_a_role_was_stopped_and_the_trainer_did_not_fail(state):
    assert run_outcome(state, None, "running") == "failed"
    assert run_outcome(state, STOP, "stopped") == "cancelled"  # terminated from the UI: the DAG reads FAILED
    assert run_outcome(state, STOP, None) == "cancelled"  # the trainer never started
    assert run_outcome(state, STOP, "failed") == "failed"  # the trainer's own error, whoever was evicted before
    assert OUTCOMES["failed"] == "FAILED"


@pytest.mark.parametrize("state", ["succeeded ", "Succeeded", "canceled", "complete", "KILLED"])
def test_near_misses_are_not_taken_for_a_success_or_a_cancel(state):
    assert run_outcome(state, None, None) == "failed"


def test_a_recorded_final_status_is_a_success_by_its_outcome_else_by_its_status():
    assert ended_successfully({"status": "COMPLETE", "outcome": "succeeded"})
    assert not ended_successfully({"status": "FAILED", "outcome": "cancelled"})
    assert ended_successfully({"status": "SUCCEEDED"})  # written before outcomes were recorded
    assert not ended_successfully({"status": "FAILED"})
    assert not ended_successfully(None)
