"""The reward role's HTTP client: `score` one response, the calls of one event-loop iteration sent as one batch.

`RewardClient.score` is a per-sample call (the rollout scheduler scores each sample when it finishes), but the
samples finished in the same event-loop iteration travel together as one `POST /score_batch` call
(`asyncrl.rpc.coalesce`): with thousands of samples in flight, one HTTP call per sample made the control plane,
not the engine, set the speed. The wire contract is in `asyncrl.rewards.api` (docs/reward_api.md).

Every call carries `Authorization: Bearer <token>`, the token defaulting to `ASYNCRL_ROLE_TOKEN`
(`asyncrl.rpc.auth`); a server that refuses it answers 401/403, which becomes `RemoteError` for every item.

Invariants:
- `score` resolves to the item's own (reward, details) or raises; a sample never gets a default reward;
- a transient failure (no answer, 429, 5xx; of the whole batch call or of the one item) is retried by the caller of
  that item, with exponential backoff and full jitter, up to `attempts` calls in all; the retries of several callers
  coalesce again. A refusal (any other status) raises at once, for that item only;
- one item never fails the others: an item the server would refuse as a body field (type, length) is refused here
  before it joins a batch (`RemoteError` status 422, as the server would answer), one that cannot be encoded as JSON
  raises here as the HTTP client would (TypeError, ValueError), and a whole-batch 413 or 422 of several items is
  split in halves and re-sent until the refusal lands on the items that cause it;
- a malformed answer (not JSON, not one result per item, a result of the wrong shape) fails the items it concerns
  with `RemoteError` (status None: transient), never with KeyError or TypeError;
- every HTTP call has the client's deadline (`post_json`); a chunk holds at most `max_batch_items` items and about
  `max_batch_bytes` bytes of encoded text (estimated from the text lengths).
"""

from __future__ import annotations

import asyncio
import json
import math
import random
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from asyncrl.rewards.api import MAX_BATCH_ITEMS, MAX_BODY_BYTES, MAX_TASK_CHARS, MAX_TEXT_CHARS
from asyncrl.rpc.auth import auth_headers
from asyncrl.rpc.coalesce import Coalescer, Unanswered, settle
from asyncrl.rpc.http import RemoteError, post_json
from asyncrl.storage.retry import RetryPolicy

Score = tuple[float, dict[str, Any]]

ITEM_OVERHEAD_BYTES = 64
"""The JSON around one item's texts: its keys, quotes and separators (about 50 bytes)."""
SPLIT_STATUSES = frozenset({413, 422})
"""Whole-batch refusals caused by some item (too large, a field the server refused): split the batch and re-send."""
MAX_DETAIL_CHARS = 300


@dataclass(frozen=True, slots=True)
class _Item:
    body: dict[str, Any]
    size: int  # estimated encoded bytes


def _utf8_len(text: str) -> int:
    """The UTF-8 length of `text`; encoding a non-ASCII text also refuses a lone surrogate (UnicodeEncodeError), as
    the HTTP client would when it encodes the batch."""
    return len(text) if text.isascii() else len(text.encode("utf-8"))


def _shape(value: object) -> str:
    """What a malformed value is, without echoing it: its type, and a dict's first keys or a list's length."""
    if isinstance(value, dict):
        return f"an object with keys {sorted(str(k)[:40] for k in value)[:6]}"
    if isinstance(value, list):
        return f"a list of {len(value)}"
    return f"a {type(value).__name__}"


class RewardClient:
    """The reward role's `/score_batch` behind a per-sample `score`. `token`: the bearer token (default: the
    environment's `ASYNCRL_ROLE_TOKEN`). Counters, over the client's life: `retries` (transient failures retried),
    `calls` (batch calls made), `items` (items those calls carried; `items / calls` is the mean batch size)."""

    def __init__(self, base_url: str, client: httpx.AsyncClient, timeout_s: float, token: str | None = None,
                 attempts: int = 1, backoff: RetryPolicy | None = None,
                 rand: Callable[[], float] = random.random, *, max_batch_items: int = MAX_BATCH_ITEMS,
                 max_batch_bytes: int = MAX_BODY_BYTES // 2) -> None:
        if attempts < 1:
            raise ValueError(f"attempts: expected >= 1, got {attempts}")
        if not 1 <= max_batch_items <= MAX_BATCH_ITEMS:
            raise ValueError(f"max_batch_items: expected 1..{MAX_BATCH_ITEMS}, got {max_batch_items}")
        self.base_url = base_url.rstrip("/")
        self._url = f"{self.base_url}/score_batch"
        self._client = client
        self._timeout = timeout_s
        self._headers = auth_headers(token)
        self.attempts = attempts
        self._backoff = backoff or RetryPolicy(base_s=0.5, cap_s=8.0)
        self._rand = rand
        # max_batch_bytes counts text bytes before JSON escapes: half the body limit by default leaves room for them
        self._batches: Coalescer[_Item, Score] = Coalescer(
            self._send, max_items=max_batch_items, max_bytes=max_batch_bytes, size=lambda item: item.size,
            name=f"POST {self._url}")
        self.retries = 0
        self.calls = 0
        self.items = 0

    async def score(self, task: str, prompt: str, response: str, metadata: dict[str, Any]) -> Score:
        """The reward of one response. A transient failure (no answer, 429, 5xx) is retried up to `attempts` calls in
        all, with exponential backoff and full jitter; then, or at once for a refusal, `RemoteError` (the caller
        drops the sample and counts it: a sample never gets a default reward). Calls made in the same event-loop
        iteration share one `/score_batch` call."""
        item = self._item(task, prompt, response, metadata)
        for attempt in range(1, self.attempts + 1):
            try:
                return await self._batches.submit(item)
            except Unanswered as err:  # the batch call ended without settling this item (cancelled)
                failure = RemoteError(f"POST {self._url}: {err}")
                failure.__cause__ = err
            except RemoteError as err:
                failure = err
            if not failure.transient or attempt == self.attempts:
                raise failure
            self.retries += 1
            await asyncio.sleep(self._backoff.backoff(attempt, self._rand))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def _item(self, task: str, prompt: str, response: str, metadata: dict[str, Any]) -> _Item:
        """The item as it travels, with its estimated size; refuses at once what would make the server refuse the
        whole batch (see the module docstring)."""
        def refuse(field: str, expected: str) -> RemoteError:
            return RemoteError(f"POST {self._url}: HTTP 422: {field}: expected {expected} (refused before sending)",
                               422)

        if not isinstance(task, str) or not 1 <= len(task) <= MAX_TASK_CHARS:
            raise refuse("task", f"a string of 1 to {MAX_TASK_CHARS} characters")
        if not isinstance(prompt, str) or len(prompt) > MAX_TEXT_CHARS:
            raise refuse("prompt", f"a string of at most {MAX_TEXT_CHARS} characters")
        if not isinstance(response, str) or len(response) > MAX_TEXT_CHARS:
            raise refuse("response", f"a string of at most {MAX_TEXT_CHARS} characters")
        if not isinstance(metadata, dict):
            raise refuse("metadata", "an object")
        # encoded as the HTTP client encodes the batch: what it cannot encode raises here (TypeError, ValueError)
        meta = json.dumps(metadata, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
        size = _utf8_len(task) + _utf8_len(prompt) + _utf8_len(response) + _utf8_len(meta) + ITEM_OVERHEAD_BYTES
        return _Item({"task": task, "prompt": prompt, "response": response, "metadata": metadata}, size)

    async def _send(self, items: list[_Item], futures: list[asyncio.Future[Score]]) -> None:
        """The coalescer's batch call: settle every future with its item's score or error."""
        outcomes = await self._post([item.body for item in items])
        for future, outcome in zip(futures, outcomes, strict=True):
            if isinstance(outcome, RemoteError):
                settle(future, error=outcome)
            else:
                settle(future, outcome)

    async def _post(self, bodies: list[dict[str, Any]]) -> list[Score | RemoteError]:
        """One `/score_batch` call (two or more when a whole-batch 413/422 splits it): one outcome per body, in
        order; each error is its own RemoteError instance (they are raised in different tasks)."""
        self.calls += 1
        self.items += len(bodies)
        try:
            answer = await post_json(self._client, self._url, {"items": bodies}, self._timeout, self._headers)
        except RemoteError as err:
            if err.status in SPLIT_STATUSES and len(bodies) > 1:
                half = len(bodies) // 2
                first, second = await asyncio.gather(self._post(bodies[:half]), self._post(bodies[half:]))
                return first + second
            return [self._copy(err) for _ in bodies]
        except ValueError as err:  # the answer is not JSON (post_json parses it)
            return [self._malformed(f"not JSON ({type(err).__name__})") for _ in bodies]
        results = answer.get("results") if isinstance(answer, dict) else None
        if not isinstance(results, list) or len(results) != len(bodies):
            got = _shape(results) if isinstance(answer, dict) and "results" in answer else _shape(answer)
            return [self._malformed(f"expected {{'results': [...]}} with {len(bodies)} results, got {got}")
                    for _ in bodies]
        return [self._outcome(index, result) for index, result in enumerate(results)]

    def _outcome(self, index: int, result: object) -> Score | RemoteError:
        """One result: a score, the item's own error, or a malformed-answer error."""
        if isinstance(result, dict) and "error" in result:
            error = result["error"]
            status = error.get("status") if isinstance(error, dict) else None
            if isinstance(status, int) and not isinstance(status, bool) and 400 <= status <= 599:
                detail = str(error.get("detail", ""))[:MAX_DETAIL_CHARS]
                return RemoteError(f"POST {self._url}: HTTP {status}: {detail}", status)
            return self._malformed(f"results[{index}].error: expected {{status: 4xx/5xx, detail}}, "
                                   f"got {_shape(error)}")
        if isinstance(result, dict):
            reward, details = result.get("reward"), result.get("details", {})
            if (isinstance(reward, int | float) and not isinstance(reward, bool) and math.isfinite(reward)
                    and isinstance(details, dict)):
                return float(reward), details
        return self._malformed(f"results[{index}]: expected {{reward: finite number, details: object}} or "
                               f"{{error: ...}}, got {_shape(result)}")

    def _malformed(self, what: str) -> RemoteError:
        return RemoteError(f"POST {self._url}: malformed answer: {what}")

    @staticmethod
    def _copy(err: RemoteError) -> RemoteError:
        copy = RemoteError(str(err), err.status, err.lost)
        copy.__cause__ = err.__cause__
        return copy
