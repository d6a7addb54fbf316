"""A judge model as the reward (asyncrl/rewards/judge.py): the rubric, the score read from a reply, attempts, and
the figures, with exact values. The transports' failures are injected (a judge that fails its first calls)."""

from __future__ import annotations

import threading
import time

import pytest

from asyncrl.config import load_config
from asyncrl.config.schema import JudgeConfig
from asyncrl.rewards.judge import JudgeClient, JudgeError, fill_rubric, read_score

PATTERN = JudgeConfig(url="http://judge/v1").score_pattern


def test_the_rubric_takes_the_three_fields_and_leaves_their_braces_alone() -> None:
    assert fill_rubric("P={prompt} R={response} A={answer} {{x}}", "1+1", "{y}", "2") == "P=1+1 R={y} A=2 {x}"


def test_the_last_score_counts_and_is_scaled_to_its_range() -> None:
    assert read_score("Score: 3 ... final Score: 7", PATTERN, 0, 10) == (0.7, 7.0)
    assert read_score("score: -1.5", PATTERN, -2, 2) == (0.125, -1.5)
    with pytest.raises(JudgeError, match="without a score"):
        read_score("looks right to me", PATTERN, 0, 1)
    with pytest.raises(JudgeError, match=r"judge score 11.0 outside \[0, 10\]"):
        read_score("Score: 11", PATTERN, 0, 10)


class FlakyJudge:
    """Fails its first `failures` calls (no score), then answers `reply`; records how many run at once."""

    def __init__(self, failures: int, reply: str = "Score: 1", delay_s: float = 0.0) -> None:
        self.failures, self.reply, self.delay_s = failures, reply, delay_s
        self.calls, self.running, self.most = 0, 0, 0
        self.lock = threading.Lock()

    def ask(self, text: str, request_id: str) -> str:
        with self.lock:
            self.calls += 1
            n = self.calls
            self.running += 1
            self.most = max(self.most, self.running)
        time.sleep(self.delay_s)
        with self.lock:
            self.running -= 1
        return "I am not sure" if n <= self.failures else self.reply


def test_a_judgment_retries_within_its_attempts_and_counts() -> None:
    cfg = JudgeConfig(url="http://judge/v1", attempts=3)
    client = JudgeClient(cfg, FlakyJudge(failures=2))
    assert client.score("p", "r", "a") == (1.0, {"judge_score": 1.0, "judge_attempts": 3, "correct": True})
    s = client.stats()
    assert (s["judge_judgments"], s["judge_failed"], s["judge_retries"], s["judge_calls"]) == (1, 0, 2, 3)


def test_a_judgment_that_never_scores_fails_never_zero() -> None:
    client = JudgeClient(JudgeConfig(url="http://judge/v1", attempts=2), FlakyJudge(failures=99))
    with pytest.raises(JudgeError, match="judge: 2 attempts failed, the last: JudgeError: judge reply without a score"):
        client.score("p", "r", "a")
    s = client.stats()
    assert (s["judge_judgments"], s["judge_failed"], s["judge_retries"], s["judge_calls"]) == (0, 1, 1, 2)


@pytest.mark.parametrize("judge,message", [
    ({}, "expected exactly one of url"),
    ({"url": "http://a/v1", "model_path": "/m"}, "expected exactly one of url"),
    ({"url": "ftp://a"}, "expected an http"),
    ({"url": "http://a/v1", "rubric": "{prompt} {secret}"}, r"unknown fields \['secret'\]"),
    ({"url": "http://a/v1", "rubric": "{prompt"}, "not a valid template"),
    ({"url": "http://a/v1", "score_pattern": "(a)(b)"}, "expected exactly one group"),
    ({"url": "http://a/v1", "score_pattern": "("}, "not a regular expression"),
    ({"url": "http://a/v1", "min_score": 1, "max_score": 1}, "expected min_score < max_score"),
    ({"url": "http://a/v1", "api_key_env": "sk-live-123"}, "api_key_env"),
])
def test_a_bad_judge_config_names_the_field(judge: dict, message: str) -> None:
    import json

    with pytest.raises(ValueError, match=message):
        load_config("configs/smoke.yaml", [f"task.judge={json.dumps(judge)}"])


def test_a_judge_replaces_the_reward_function_never_both() -> None:
    with pytest.raises(ValueError, match="a judge replaces task.reward"):
        load_config("configs/smoke.yaml", ['task.judge={"url": "http://a/v1"}',
                                           "task.reward=tests.helpers.reward_functions:length_bonus"])


def _batch(app, items: list[dict]) -> dict:
    import asyncio

    import httpx

    from asyncrl.rpc.auth import auth_headers

    async def run() -> dict:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://test") as c:
            r = await c.post("/score_batch", json={"items": items}, headers=auth_headers("t" * 24))
            assert r.status_code == 200
            return r.json()

    return asyncio.run(run())


def _judged_app(judge: FlakyJudge, concurrency: int, stats: dict):
    from asyncrl.rewards.custom import for_task
    from asyncrl.roles.reward import create_app

    client = JudgeClient(JudgeConfig(url="http://judge/v1", attempts=1, max_concurrency=concurrency), judge)
    scorer = for_task(("arithmetic",), lambda task, p, r, a: client.score(p, r, a))
    return create_app(stats, token="t" * 24, scorer=scorer, concurrency=concurrency)


def test_the_reward_role_judges_a_batch_concurrently() -> None:
    judge, stats = FlakyJudge(failures=0, reply="Score: 1", delay_s=0.2), {}
    items = [{"task": "arithmetic", "prompt": f"{i}+1=", "response": "x", "metadata": {"answer": "0"}}
             for i in range(8)]
    out = _batch(_judged_app(judge, 4, stats), items)
    assert [r["reward"] for r in out["results"]] == [1.0] * 8
    assert judge.most == 4 and stats == {"scored": 8, "rejected": 0}


def test_a_failed_judgment_is_that_items_502_never_a_zero() -> None:
    judge, stats = FlakyJudge(failures=1), {}
    items = [{"task": "arithmetic", "prompt": "1+1=", "response": "x", "metadata": {"answer": "2"}},
             {"task": "arithmetic", "prompt": "2+1=", "response": "x", "metadata": {"answer": "3"}}]
    out = _batch(_judged_app(judge, 1, stats), items)
    assert out["results"][0]["error"]["status"] == 502
    assert out["results"][0]["error"]["detail"].startswith("judge: 1 attempts failed")
    assert out["results"][1]["reward"] == 1.0 and stats == {"scored": 1, "rejected": 0}


def test_an_openai_compatible_judge_gets_the_rubric_and_its_key_from_the_environment(monkeypatch) -> None:
    import json

    import httpx

    from asyncrl.rewards.judge import OpenAIJudge

    seen: list[dict] = []

    def server(request: httpx.Request) -> httpx.Response:  # the first call fails (injected), the second answers
        seen.append({"url": str(request.url), "auth": request.headers.get("authorization"),
                     "body": json.loads(request.content)})
        if len(seen) == 1:
            return httpx.Response(503, json={"error": {"message": "busy"}})
        return httpx.Response(200, json={"choices": [{"message": {"role": "assistant", "content": "Score: 0"}}]})

    monkeypatch.setenv("JUDGE_KEY", "k-123")
    cfg = JudgeConfig(url="http://judge:8000/v1/", model="m", api_key_env="JUDGE_KEY", rubric="{answer}|{response}",
                      max_tokens=5)
    client = JudgeClient(cfg, OpenAIJudge(cfg, httpx.Client(transport=httpx.MockTransport(server))))
    assert client.score("p", "r", "a") == (0.0, {"judge_score": 0.0, "judge_attempts": 2, "correct": False})
    assert seen[1] == {"url": "http://judge:8000/v1/chat/completions", "auth": "Bearer k-123",
                       "body": {"model": "m", "messages": [{"role": "user", "content": "a|r"}], "temperature": 0.0,
                                "max_tokens": 5}}
    monkeypatch.delenv("JUDGE_KEY")
    with pytest.raises(ValueError, match="the environment variable JUDGE_KEY is not set"):
        OpenAIJudge(cfg, httpx.Client())


def test_with_a_judge_the_writers_send_one_round_of_judgments_a_call_and_wait_for_every_attempt() -> None:
    plain = load_config("configs/smoke.yaml")
    assert plain.reward_call == (plain.timeouts.http_s, 4096)
    judged = load_config("configs/smoke.yaml", ['task.judge={"url": "http://a/v1", "timeout_s": 30, "attempts": 2, '
                                                '"max_concurrency": 8}'])
    assert judged.reward_call == (judged.timeouts.http_s + 60, 8)


def test_a_served_judge_reply_starts_with_the_prefix_it_was_given() -> None:
    import httpx

    from asyncrl.models.tokenizer import make_tokenizer
    from asyncrl.rewards.judge import ServedJudge

    tok = make_tokenizer("text")
    cfg = JudgeConfig(model_path="/m", reply_prefix="Score:", rubric="{answer}")

    def server(request: httpx.Request) -> httpx.Response:
        assert json.loads(request.content)["prompt_token_ids"] == served.prompt_ids("7")
        return httpx.Response(200, json={"token_ids": tok(" 1", add_special_tokens=False)["input_ids"]})

    import json

    served = ServedJudge(cfg, httpx.Client(transport=httpx.MockTransport(server)), lambda: "http://judge", None, tok,
                        [tok.eos_token_id])
    assert tok.decode(served.prompt_ids("7")).endswith("<|assistant|>Score:")
    assert JudgeClient(cfg, served).score("p", "r", "7") == (1.0, {"judge_score": 1.0, "judge_attempts": 1,
                                                                   "correct": True})
    with pytest.raises(ValueError, match="reply_prefix: only with model_path"):
        JudgeConfig(url="http://a/v1", reply_prefix="Score:")
