"""The exact-match verifier (`task.verifier: exact`, the default of arithmetic and jsonl): the response against the
answer.

Owns `score`, the function the reward role serves for it. Pure: no I/O, no model.

Invariants:
- the response is cut at the first end-of-sequence marker (EOS_TEXT) if there is one; spaces are
  stripped from both ends of what remains and of the answer;
- reward is 1.0 iff what remains equals the answer exactly, else 0.0 (never partial credit);
- one rule whatever the task: the verifier choice (`asyncrl.rewards.custom.scorer_for`), not the task name, decides
  that a task is scored by exact match; `task` is not read.
"""

from __future__ import annotations

from typing import Any

EOS_TEXT = "<eos>"
"""The end-of-sequence token's text, as the built-in tokenizer writes it (asyncrl.models.tokenizer)."""


def parse_response(response_text: str) -> str:
    """The part of a response the verifier compares: up to the first EOS marker, spaces stripped."""
    return response_text.split(EOS_TEXT, 1)[0].strip(" ")


def score(task: str, response_text: str, answer: str) -> tuple[float, dict[str, Any]]:
    """Reward 1.0 iff the response, up to EOS and without surrounding spaces, is exactly `answer` (any `task`).

    Returns (reward, details) where details = {"parsed": str, "expected": str, "correct": bool,
    "reason": "correct" | "empty" | "mismatch"}.
    """
    parsed = parse_response(response_text)
    expected = answer.strip(" ")
    correct = parsed == expected
    reason = "correct" if correct else ("empty" if not parsed else "mismatch")
    return (1.0 if correct else 0.0), {
        "parsed": parsed,
        "expected": expected,
        "correct": correct,
        "reason": reason,
    }
