"""The reward role's `/score_batch` route (asyncrl.roles.reward), in process over httpx's ASGI transport with the real
token and body-limit wiring: per-item results in order, per-item refusals that fail no other item, per-item
counters, and whole-body refusals (4xx naming the field, no input echoed) after which the server still serves."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx
from fastapi import FastAPI

from asyncrl.rewards.api import MAX_BATCH_ITEMS
from asyncrl.roles.reward import create_app
from asyncrl.rpc.auth import auth_headers

TOKEN = "t" * 20 + "-reward"
AUTH = auth_headers(TOKEN)


def _item(response: str = "2", answer: Any = "2", task: str = "arithmetic", **extra: Any) -> dict[str, Any]:
    return {"task": task, "prompt": "1+1=", "response": response, "metadata": {"answer": answer}, **extra}


def _calls(app: FastAPI, *requests: tuple[str, str, dict[str, Any]]) -> list[httpx.Response]:
    """Make the requests in order on one client: (method, path, httpx keyword arguments)."""
    async def run() -> list[httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            return [await c.request(method, path, **kw) for method, path, kw in requests]

    return asyncio.run(run())


def _good(app: FastAPI) -> httpx.Response:
    return _calls(app, ("POST", "/score_batch", {"json": {"items": [_item()]}, "headers": AUTH}))[0]


def test_a_batch_answers_each_item_in_order_and_counts_items() -> None:
    stats: dict[str, int] = {}
    app = create_app(stats, token=TOKEN)
    items = [
        _item("2"),                               # correct
        _item("3"),                               # wrong: reward 0, still scored
        _item("2", answer=None),                  # no string answer: refused
        _item("2", answer=2),                     # a number, not a string: refused
        _item("2", task="gsm8k"),                 # unknown task: refused
        _item(" 2 <eos>junk"),                    # correct after EOS and spaces
        {"task": "arithmetic", "prompt": "", "response": "2", "metadata": {}},  # no answer at all: refused
    ]
    r, health = _calls(app, ("POST", "/score_batch", {"json": {"items": items}, "headers": AUTH}),
                       ("GET", "/health", {"headers": AUTH}))
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert len(results) == len(items)
    assert [x.get("reward") for x in results] == [1.0, 0.0, None, None, None, 1.0, None]
    assert results[0]["details"] == {"parsed": "2", "expected": "2", "correct": True, "reason": "correct"}
    assert results[1]["details"]["reason"] == "mismatch"
    for k in (2, 3, 6):
        assert results[k] == {"error": {"status": 422, "detail": "metadata.answer: expected the reference answer "
                                                                  "as a string"}}, k
    assert results[4]["error"]["status"] == 422 and results[4]["error"]["detail"].startswith("task: ") and "gsm8k" in results[4]["error"]["detail"]
    assert all(set(x) in ({"reward", "details"}, {"error"}) for x in results)
    assert stats == {"scored": 3, "rejected": 4}
    assert health.json() == {"status": "ok", "scored": 3, "rejected": 4}


def test_score_and_score_batch_share_the_counters_and_the_verdicts() -> None:
    stats: dict[str, int] = {}
    app = create_app(stats, token=TOKEN)
    one, refused, batch = _calls(
        app, ("POST", "/score", {"json": _item("2"), "headers": AUTH}),
        ("POST", "/score", {"json": _item("2", answer=None), "headers": AUTH}),
        ("POST", "/score_batch", {"json": {"items": [_item("2"), _item("2", answer=None)]}, "headers": AUTH}))
    assert one.status_code == 200 and one.json() == batch.json()["results"][0]
    assert refused.status_code == 422 and refused.json()["detail"] == batch.json()["results"][1]["error"]["detail"]
    assert stats == {"scored": 2, "rejected": 2}


def _loc_of(r: httpx.Response) -> list[list[Any]]:
    assert r.status_code == 422, (r.status_code, r.text[:300])
    detail = r.json()["detail"]
    assert isinstance(detail, list) and all(set(e) == {"loc", "msg", "type"} for e in detail), detail  # no input
    return [e["loc"] for e in detail]


def test_bad_bodies_are_refused_whole_naming_the_field_and_the_server_still_serves() -> None:
    stats: dict[str, int] = {}
    app = create_app(stats, token=TOKEN)
    secret = "do-not-echo-" + "x" * 40
    bad_field = [_item(), _item(), _item(), {**_item(), "task": 7}, _item()]
    cases: list[tuple[str, dict[str, Any], Any]] = [
        ("too many items", {"json": {"items": [_item()] * (MAX_BATCH_ITEMS + 1)}}, ["body", "items"]),
        ("no items", {"json": {"items": []}}, ["body", "items"]),
        ("items not a list", {"json": {"items": {"0": _item()}}}, ["body", "items"]),
        ("items a string", {"json": {"items": secret}}, ["body", "items"]),
        ("no items field", {"json": _item()}, ["body", "items"]),
        ("an extra field", {"json": {"items": [_item()], "extra": secret}}, ["body", "extra"]),
        ("a bad field at index 3", {"json": {"items": bad_field}}, ["body", "items", 3, "task"]),
        ("an unknown field in an item", {"json": {"items": [_item(), {**_item(), "x": secret}]}},
         ["body", "items", 1, "x"]),
        ("a null item", {"json": {"items": [_item(), None]}}, ["body", "items", 1]),
        ("an empty task", {"json": {"items": [_item(task="")]}}, ["body", "items", 0, "task"]),
        ("a list body", {"json": [_item()]}, ["body"]),
    ]
    answers = _calls(app, *[("POST", "/score_batch", {**kw, "headers": AUTH}) for _, kw, _ in cases])
    for (name, _, loc), r in zip(cases, answers, strict=True):
        assert loc in _loc_of(r), (name, r.text[:300])
        assert secret not in r.text, name
    garbage = [
        ("random bytes", {"content": bytes(range(256)) * 8, "headers": {**AUTH, "Content-Type": "application/json"}}),
        ("cut JSON", {"content": b'{"items": [{"task": "ari', "headers": {**AUTH, "Content-Type": "application/json"}}),
        ("NaN in a field", {"content": b'{"items": [{"task": "arithmetic", "prompt": NaN}]}',
                              "headers": {**AUTH, "Content-Type": "application/json"}}),
        ("deep nesting", {"content": b"[" * 100_000 + b"]" * 100_000,
                          "headers": {**AUTH, "Content-Type": "application/json"}}),
        ("form data", {"content": b"items=1", "headers": {**AUTH, "Content-Type": "application/x-www-form-urlencoded"}}),
    ]
    answers = _calls(app, *[("POST", "/score_batch", kw) for _, kw in garbage])
    for (name, _), r in zip(garbage, answers, strict=True):
        assert 400 <= r.status_code < 500, (name, r.status_code, r.text[:300])
    no_token, wrong_token, huge = _calls(
        app, ("POST", "/score_batch", {"json": {"items": [_item()]}}),
        ("POST", "/score_batch", {"json": {"items": [_item()]}, "headers": auth_headers("w" * 30)}),
        ("POST", "/score_batch", {"json": {"items": [_item("9" * (1 << 20))] * 9}, "headers": AUTH}))
    assert no_token.status_code == 401 and wrong_token.status_code == 403 and huge.status_code == 413
    assert stats == {"scored": 0, "rejected": 0}  # nothing was scored or refused per item
    ok = _good(app)
    assert ok.status_code == 200 and ok.json() == {"results": [{"reward": 1.0, "details": {
        "parsed": "2", "expected": "2", "correct": True, "reason": "correct"}}]}


def test_a_full_batch_of_the_largest_size_is_served() -> None:
    app = create_app(token=TOKEN)
    items = [_item(str(i % 3)) for i in range(MAX_BATCH_ITEMS)]
    r = _calls(app, ("POST", "/score_batch", {"json": {"items": items}, "headers": AUTH}))[0]
    assert r.status_code == 200
    assert [x["reward"] for x in r.json()["results"]] == [1.0 if i % 3 == 2 else 0.0 for i in range(MAX_BATCH_ITEMS)]


def test_a_verifier_bug_fails_only_its_item() -> None:
    from asyncrl.rewards.custom import builtin_scorer

    def flaky(task: str, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        if response == "boom":
            raise KeyError("a verifier bug")
        return builtin_scorer(task, prompt, response, answer)

    stats: dict[str, int] = {}
    app = create_app(stats, token=TOKEN, scorer=flaky)
    r = _calls(app, ("POST", "/score_batch", {"json": {"items": [_item(), _item("boom"), _item()]}, "headers": AUTH}))[0]
    results = r.json()["results"]
    assert r.status_code == 200 and [x.get("reward") for x in results] == [1.0, None, 1.0]
    assert results[1] == {"error": {"status": 500, "detail": "internal error while scoring: KeyError"}}
    assert stats == {"scored": 2, "rejected": 0}


def test_the_openapi_page_names_the_batch_route() -> None:
    r = _calls(create_app(token=TOKEN), ("GET", "/openapi.json", {"headers": AUTH}))[0]
    spec = json.loads(r.text)
    assert "/score_batch" in spec["paths"] and "/score" in spec["paths"]


def test_the_math_verifier_scores_through_the_batch_route() -> None:
    from asyncrl.config.schema import TaskConfig
    from asyncrl.rewards.custom import scorer_for

    stats: dict[str, int] = {}
    app = create_app(stats, token=TOKEN, scorer=scorer_for(TaskConfig(verifier="math", format_reward=0.25)))
    items = [
        _item("1 + 1 = 2, so \\boxed{2}.", answer="#### 2"),   # correct, explicit
        _item("1 + 1 is 2 I think", answer="#### 2"),           # correct, the last number only
        _item("The answer is 3.", answer="2"),                  # wrong, explicit: the format weight alone
        _item("\\boxed{\\frac{4}{2}}", answer="2"),            # correct: a fraction equal to the integer
        _item("no idea", answer="2"),                           # nothing to extract
        _item("\\boxed{2}", task="gsm8k"),                      # not this run's task: refused
    ]
    r = _calls(app, ("POST", "/score_batch", {"json": {"items": items}, "headers": AUTH}))[0]
    assert r.status_code == 200, r.text
    results = r.json()["results"]
    assert [x.get("reward") for x in results] == [1.25, 1.0, 0.25, 1.25, 0.0, None]
    assert results[0]["details"] == {"correct": True, "extracted": "2", "method": "boxed", "expected": "2",
                                     "format": True}
    assert results[1]["details"]["method"] == "last_number" and results[1]["details"]["format"] is False
    assert results[2]["details"] == {"correct": False, "extracted": "3", "method": "answer_is", "expected": "2",
                                     "format": True}
    assert results[4]["details"] == {"correct": False, "extracted": None, "method": None, "expected": "2",
                                     "format": False}
    assert results[5] == {"error": {"status": 422, "detail": "task: expected 'arithmetic' (this run's task.name), "
                                                             "got 'gsm8k'"}}
    assert stats == {"scored": 5, "rejected": 1}
