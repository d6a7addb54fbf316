"""The generation server's NDJSON lines: msgspec-encoded, parsed back to the same document; NaN and infinities are
refused as `json.dumps(allow_nan=False)` refuses them (a ValueError, which the batch route answers as a 400 line)."""

import json
import math

import pytest

from asyncrl.generation.server import _error_line, _line


def test_a_line_is_one_json_document_that_parses_back_exactly() -> None:
    doc = {"request_id": "env0-12-3-4 é", "token_ids": [12, 45, 2], "logprobs": [-1.2345678901234, -1e-07, -0.0],
           "token_versions": [3, 3, 4], "finish_reason": "stop", "start_version": 3}
    line = _line(doc)
    assert line.endswith(b"\n") and line.count(b"\n") == 1
    back = json.loads(line)
    assert back == doc and [math.copysign(1, x) for x in back["logprobs"]] == [-1, -1, -1]


def test_a_null_field_is_kept_and_a_request_id_saying_null_is_not_mistaken_for_nan() -> None:
    assert json.loads(_line({"request_id": "null", "spans": None, "logprobs": [-0.5]})) == {
        "request_id": "null", "spans": None, "logprobs": [-0.5]}


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), float("-inf")])
def test_non_finite_log_probs_are_refused(bad: float) -> None:
    with pytest.raises(ValueError):
        _line({"request_id": "r", "logprobs": [-0.1, bad]})


def test_error_line_names_the_request_and_status() -> None:
    assert json.loads(_error_line("r1", 409, "conflict")) == {"request_id": "r1",
                                                             "error": {"status": 409, "detail": "conflict"}}
