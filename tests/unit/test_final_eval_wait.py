"""The trainer waits for the final evaluation point as long as one evaluation request may take (its answers are as
long as a rollout's), not one HTTP exchange: a slow final evaluation is not dropped from the run."""

from __future__ import annotations

from asyncrl.config.schema import RunConfig
from asyncrl.roles.training_report import FINAL_EVAL_GRACE_S, final_eval_wait_s


def test_the_wait_covers_an_evaluation_requests_deadline() -> None:
    cfg = RunConfig.model_validate({"rollout": {"request_timeout_s": 900}, "timeouts": {"http_s": 60}})
    assert cfg.eval_request_timeout_s == 900
    assert final_eval_wait_s(cfg) == 900 + FINAL_EVAL_GRACE_S
    short = RunConfig.model_validate({"rollout": {"request_timeout_s": 30}, "timeouts": {"http_s": 60}})
    assert short.eval_request_timeout_s == 60 and final_eval_wait_s(short) == 60 + FINAL_EVAL_GRACE_S
