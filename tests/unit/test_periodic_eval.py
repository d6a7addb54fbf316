"""The periodic held-out evaluation's pure rules (asyncrl/roles/periodic_eval.py): due points and metrics; the
S3 side is tests/integration/test_periodic_eval_points.py."""

from __future__ import annotations

from asyncrl.roles.periodic_eval import next_due, point_metrics


def test_due_points_are_the_multiples_of_every():
    assert [next_due(v, 5, 100) for v in (0, 1, 4, 5, 9, 10)] == [5, 5, 5, 10, 10, 15]


def test_the_final_version_is_always_due():
    assert [next_due(v, 5, 12) for v in (0, 9, 10, 11)] == [5, 10, 12, 12]
    assert next_due(0, 50, 4) == 4  # a run shorter than the interval: the warm start and its final version


def test_point_metrics():
    m = point_metrics({"accuracy": 0.25, "correct": 8, "n": 32, "mixed": 0, "mean_reward": 0.4, "versions": [3]},
                      1.5, 2)
    assert m == {"eval/accuracy": 0.25, "eval/correct": 8.0, "eval/n": 32.0, "eval/mixed_requests": 0.0,
                 "eval/wall_s": 1.5, "eval/attempts": 2.0, "eval/mean_reward": 0.4}


