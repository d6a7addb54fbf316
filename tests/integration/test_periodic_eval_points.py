"""The periodic held-out evaluation (asyncrl/roles/periodic_eval.py) against a real S3 server: attribution by
token versions with re-runs, points written once, read back once by the trainer's side."""

from __future__ import annotations

import asyncio
from types import SimpleNamespace
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.roles.periodic_eval import PeriodicEval
from asyncrl.storage.eval_points import eval_key, eval_summary, unseen_points
from asyncrl.storage.run_layout import RunPaths

pytestmark = pytest.mark.integration


class ScriptedEval(PeriodicEval):
    """The evaluation results are scripted (the servers' answers are what is under test elsewhere); the S3 server
    they are recorded in is real."""

    def __init__(self, ctx: Any, results: list[dict[str, Any]]) -> None:
        super().__init__(ctx, ["http://unused"], tokenizer=None)
        self.results = results

    async def evaluate_once(self) -> dict[str, Any]:
        return self.results.pop(0)


def _result(versions: list[int], mixed: int = 0, accuracy: float = 0.5) -> dict[str, Any]:
    return {"accuracy": accuracy, "correct": int(accuracy * 32), "n": 32, "mixed": mixed, "versions": versions}


def test_mixed_evaluations_are_re_run_and_points_written_once(s3_store):
    cfg = load_config(None, ["eval.every_steps=2", "eval.attempts=3", "task.num_eval=32"])
    paths = RunPaths("runs", "eval-test")
    ctx = SimpleNamespace(cfg=cfg, store=s3_store, paths=paths)
    ev = ScriptedEval(ctx, [_result([0], accuracy=0.25),  # the warm start
                            _result([1, 2]), _result([2], mixed=3), _result([2], accuracy=0.75),  # re-run twice
                            _result([1]),  # servers behind the due point 2: nothing recorded
                            _result([3, 4]), _result([4], mixed=1), _result([4], mixed=1)])  # mixed to the end
    assert asyncio.run(ev.point(0)) == 0
    assert asyncio.run(ev.point(2)) == 2
    assert asyncio.run(ev.point(2)) is None
    assert asyncio.run(ev.point(4)) == 4
    assert ev.results == [] and ev.recorded == {0, 2, 4}
    doc = s3_store.get_json(eval_key(paths, 2))
    assert doc["version"] == 2 and doc["metrics"]["eval/accuracy"] == 0.75 and doc["metrics"]["eval/attempts"] == 3
    assert s3_store.get_json(eval_key(paths, 4))["metrics"]["eval/mixed_requests"] == 1  # logged as mixed

    seen: set[int] = set()
    points = unseen_points(s3_store, paths, seen)
    assert [(v, m["eval/accuracy"]) for m, v in points] == [(0, 0.25), (2, 0.75), (4, 0.5)]
    assert unseen_points(s3_store, paths, seen) == []  # each point handed to MLflow once

    again = ScriptedEval(ctx, [_result([2], accuracy=0.0)])  # a restarted writer: the first record stays
    again.recorded = set()
    assert asyncio.run(again.point(2)) == 2
    assert s3_store.get_json(eval_key(paths, 2))["metrics"]["eval/accuracy"] == 0.75

    assert eval_summary(s3_store, paths, 4) == {"eval_accuracy_before": 0.25, "eval_accuracy_after": 0.5,
                                                "eval_curve": {"0": 0.25, "2": 0.75, "4": 0.5}}
    assert eval_summary(s3_store, paths, 6)["eval_accuracy_after"] is None  # the final point did not land


def test_the_evaluation_ends_with_a_point_at_the_final_version(s3_store, monkeypatch):
    """A run shorter than the interval still gets its end point: the warm start, then the final version."""
    monkeypatch.setattr("asyncrl.roles.periodic_eval.POLL_S", 0.0)
    cfg = load_config(None, ["eval.every_steps=50", "training.steps=3", "task.num_eval=32"])
    paths = RunPaths("runs", "eval-final-test")
    ev = ScriptedEval(SimpleNamespace(cfg=cfg, store=s3_store, paths=paths),
                      [_result([0], accuracy=0.25), _result([3], accuracy=0.75)])
    published = [1, 2, 3]  # the trainer's versions, one per poll

    async def trainer_version() -> int:
        return published.pop(0) if len(published) > 1 else published[0]

    ev.trainer_version = trainer_version
    assert asyncio.run(ev.point(0)) == 0
    asyncio.run(asyncio.wait_for(ev.run(), 10))  # returns once the final version is recorded
    assert ev.recorded == {0, 3} and ev.results == []
    assert eval_summary(s3_store, paths, 3)["eval_curve"] == {"0": 0.25, "3": 0.75}
