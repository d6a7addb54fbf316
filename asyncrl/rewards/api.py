"""The reward role's wire contract: the limits and the request/answer models of `/score` and `/score_batch`.

Owned here so that the server (`asyncrl.roles.reward`) and the client (`asyncrl.rewards.client`) agree on one set of
numbers: the client checks an item against the same limits before it joins a batch, so one item the server would
refuse as a body field never makes the whole batch fail. docs/reward_api.md describes the contract in prose.

Invariants:
- a score request is strict JSON: `task` a string of 1..MAX_TASK_CHARS characters, `prompt` and `response` strings of
  at most MAX_TEXT_CHARS characters, `metadata` an object (only `metadata.answer` is read), no other field;
- a batch holds 1..MAX_BATCH_ITEMS score requests; its answer has exactly one result per item, in the same order,
  each either a score (`reward`, `details`) or an `error` (`status`, `detail`), never both;
- every body, one score or a batch, is bounded by MAX_BODY_BYTES (the server answers 413 above it).
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field

MAX_BODY_BYTES = 8 << 20
"""The largest request body the reward role reads, `/score` and `/score_batch` alike (413 above)."""
MAX_TEXT_CHARS = 1 << 20
"""A prompt or a response, in characters; the body limit bounds the metadata."""
MAX_TASK_CHARS = 128
MAX_BATCH_ITEMS = 4096
"""Score requests in one `/score_batch` body."""
ITEM_STATUS_REFUSED = 422
"""The per-item status of a refused item (no string `metadata.answer`, a task other than the run's `task.name`)."""
ITEM_STATUS_FAILED = 500
ITEM_STATUS_JUDGE_FAILED = 502  # task.judge gave no usable score within its attempts (retried by the caller)
"""The per-item status of an item whose scoring failed on the server (a verifier bug): transient for the client."""


class ScoreRequest(BaseModel):
    """One response to score: the body of `/score`, one item of `/score_batch`."""

    model_config = ConfigDict(extra="forbid", strict=True, allow_inf_nan=False)
    task: str = Field(min_length=1, max_length=MAX_TASK_CHARS)
    prompt: str = Field(max_length=MAX_TEXT_CHARS)
    response: str = Field(max_length=MAX_TEXT_CHARS)
    metadata: dict[str, Any] = Field(default_factory=dict)


class ScoreResponse(BaseModel):
    """A score: the answer of `/score`, one result of `/score_batch`."""

    reward: float
    details: dict[str, Any]


class ItemError(BaseModel):
    """Why one item of a batch got no score: `status` as `/score` would have answered it, `detail` naming the field."""

    status: int
    detail: str


class ScoreItemFailure(BaseModel):
    """One result of `/score_batch` that is not a score."""

    error: ItemError


class ScoreBatchRequest(BaseModel):
    """The body of `/score_batch`."""

    model_config = ConfigDict(extra="forbid", strict=True)
    items: list[ScoreRequest] = Field(min_length=1, max_length=MAX_BATCH_ITEMS)


class ScoreBatchResponse(BaseModel):
    """The answer of `/score_batch`: one result per item, in the order of the items."""

    results: list[ScoreResponse | ScoreItemFailure]
