"""A judge model as the reward (`task.judge`): the rubric filled with the problem, the response and the reference
answer, sent to a judge, the score read out of its reply and scaled to [0, 1].

Two transports, one per kind of judge:
- `OpenAIJudge`: any OpenAI-compatible server (`task.judge.url`): POST `<url>/chat/completions`, the rubric as one
  user message, temperature 0; an API key only from the environment variable `api_key_env` names;
- `ServedJudge`: the run's own judge role (`task.judge.model_path`, `asyncrl.roles.judge`): a vLLM server of the
  judge model, never sent weights; the rubric is rendered with the judge's chat template (without one: the plain
  text after the model's BOS), followed by `reply_prefix` (the start of the judge's reply, read with it), and sent
  as token ids to its /generate, greedily, ending at the judge's end ids.

`JudgeClient.score` makes one judgment: up to `attempts` calls, each with the `timeout_s` deadline; a call fails on
no answer, an error status, or a reply without a score in [min_score, max_score] (`read_score`). When every attempt
failed it raises `JudgeError`: the reward role answers that item as failed (status 502, retried by the environment
role, then the sample fails and is replaced), never with a default reward. It is thread-safe: the reward role
judges a batch's items concurrently, `max_concurrency` at once. `stats()` gives the figures the reward role beats
in its heartbeat (MLflow, the reward instance's child run): judgments, failed judgments, retried calls, latency.
"""

from __future__ import annotations

import os
import re
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

import httpx

JudgeConfig = Any  # the run's `task.judge` (asyncrl.config.schema.JudgeConfig; not imported: config imports rewards)


class JudgeError(RuntimeError):
    """A judgment failed: the judge gave no usable score within its attempts (or one call failed, inside)."""


def fill_rubric(rubric: str, prompt: str, response: str, answer: str) -> str:
    """The rubric with its fields replaced (the values are inserted as they are, never parsed as templates)."""
    return rubric.format(prompt=prompt, response=response, answer=answer)


def read_score(reply: str, pattern: str, min_score: float, max_score: float) -> tuple[float, float]:
    """(reward in [0, 1], raw score) from the last match of `pattern` in `reply`; JudgeError when there is none or
    it is outside [min_score, max_score]."""
    found = re.findall(pattern, reply)
    if not found:
        raise JudgeError(f"judge reply without a score (pattern {pattern!r}): {reply[:120]!r}")
    try:
        score = float(found[-1])
    except ValueError as err:
        raise JudgeError(f"judge score {found[-1]!r} is not a number") from err
    if not min_score <= score <= max_score:
        raise JudgeError(f"judge score {score} outside [{min_score}, {max_score}]")
    return (score - min_score) / (max_score - min_score), score


class JudgeTransport(Protocol):
    def ask(self, text: str, request_id: str) -> str:
        """The judge's reply to `text`; JudgeError (or an httpx error) when the call fails."""
        ...


class OpenAIJudge:
    """An OpenAI-compatible judge server (see the module docstring)."""

    def __init__(self, cfg: JudgeConfig, http: httpx.Client) -> None:
        assert cfg.url is not None
        self.cfg, self.http = cfg, http
        self.url = cfg.url.rstrip("/") + "/chat/completions"
        self.headers: dict[str, str] = {}
        if cfg.api_key_env:
            key = os.environ.get(cfg.api_key_env)
            if not key:
                raise ValueError(f"task.judge.api_key_env: the environment variable {cfg.api_key_env} is not set")
            self.headers["Authorization"] = f"Bearer {key}"

    def ask(self, text: str, request_id: str) -> str:
        body = {"model": self.cfg.model, "messages": [{"role": "user", "content": text}], "temperature": 0.0,
                "max_tokens": self.cfg.max_tokens}
        r = self.http.post(self.url, json=body, headers=self.headers, timeout=self.cfg.timeout_s)
        if r.status_code != 200:
            raise JudgeError(f"judge answered HTTP {r.status_code}")
        try:
            content = r.json()["choices"][0]["message"]["content"]
        except (ValueError, KeyError, IndexError, TypeError) as err:
            raise JudgeError(f"judge answer is not a chat completion: {type(err).__name__}") from err
        if not isinstance(content, str):
            raise JudgeError("judge answer has no text content")
        return content


class ServedJudge:
    """The run's own judge server (see the module docstring). `base_url` gives its address (called on the first
    call, under a lock: it may wait for the judge role's rendezvous); `tokenizer` is the judge model's and
    `stop_ids` its end ids (asyncrl.models.prompts.stop_token_ids)."""

    def __init__(self, cfg: JudgeConfig, http: httpx.Client, base_url: Callable[[], str], token: str | None,
                 tokenizer: Any, stop_ids: list[int]) -> None:
        self.cfg, self.http, self._base_url = cfg, http, base_url
        self.tok, self.stop_ids = tokenizer, stop_ids
        self.chat = bool(getattr(tokenizer, "chat_template", None))
        self.headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._url: str | None = None
        self._lock = threading.Lock()

    def prompt_ids(self, text: str) -> list[int]:
        if self.chat:
            rendered = self.tok.apply_chat_template([{"role": "user", "content": text}], tokenize=False,
                                                    add_generation_prompt=True)
            return list(self.tok(rendered + self.cfg.reply_prefix, add_special_tokens=False)["input_ids"])
        ids = list(self.tok(text + self.cfg.reply_prefix)["input_ids"])
        bos = getattr(self.tok, "bos_token_id", None)
        return ids if bos is None or ids[:1] == [bos] else [int(bos), *ids]

    def ask(self, text: str, request_id: str) -> str:
        with self._lock:
            if self._url is None:
                self._url = self._base_url().rstrip("/")
        ids = self.prompt_ids(text)
        budget = min(self.cfg.max_tokens, self.cfg.max_model_len - len(ids))
        if budget < 1:
            raise JudgeError(f"judge prompt of {len(ids)} tokens does not fit task.judge.max_model_len "
                             f"{self.cfg.max_model_len}")
        body = {"request_id": request_id, "prompt_token_ids": ids, "max_tokens": budget, "temperature": 0.0,
                "stop_token_ids": self.stop_ids}
        r = self.http.post(f"{self._url}/generate", json=body, headers=self.headers, timeout=self.cfg.timeout_s)
        if r.status_code != 200:
            raise JudgeError(f"judge server answered HTTP {r.status_code}")
        try:
            out = r.json()["token_ids"]
        except (ValueError, KeyError, TypeError) as err:
            raise JudgeError(f"judge server answer has no token_ids: {type(err).__name__}") from err
        return self.cfg.reply_prefix + str(self.tok.decode(out, skip_special_tokens=True))


class JudgeClient:
    """Judgments with attempts and figures (see the module docstring)."""

    def __init__(self, cfg: JudgeConfig, transport: JudgeTransport) -> None:
        self.cfg, self.transport = cfg, transport
        self.concurrency = cfg.max_concurrency
        self._lock = threading.Lock()
        self._seq = 0
        self.judgments = self.failed = self.retries = self.calls = 0
        self.latency_sum_s = self.latency_max_s = 0.0

    def _next_id(self) -> str:
        with self._lock:
            self._seq += 1
            return f"judge-{os.getpid()}-{self._seq}"

    def score(self, prompt: str, response: str, answer: str) -> tuple[float, dict[str, Any]]:
        """(reward, details) of one judgment; JudgeError when every attempt failed."""
        text = fill_rubric(self.cfg.rubric, prompt, response, answer)
        last: Exception | None = None
        for attempt in range(1, self.cfg.attempts + 1):
            t0 = time.monotonic()
            try:
                reply = self.transport.ask(text, self._next_id())
                reward, raw = read_score(reply, self.cfg.score_pattern, self.cfg.min_score, self.cfg.max_score)
            except (JudgeError, httpx.HTTPError) as err:
                last = err
                self._count(time.monotonic() - t0, retried=attempt < self.cfg.attempts)
                continue
            self._count(time.monotonic() - t0, judged=True)
            return reward, {"judge_score": raw, "judge_attempts": attempt, "correct": reward >= 1.0}
        with self._lock:
            self.failed += 1
        raise JudgeError(f"judge: {self.cfg.attempts} attempts failed, the last: {type(last).__name__}: {last}")

    def _count(self, latency_s: float, judged: bool = False, retried: bool = False) -> None:
        with self._lock:
            self.calls += 1
            self.judgments += judged
            self.retries += retried
            self.latency_sum_s += latency_s
            self.latency_max_s = max(self.latency_max_s, latency_s)

    def stats(self) -> dict[str, float]:
        with self._lock:
            return {"judge_judgments": float(self.judgments), "judge_failed": float(self.failed),
                    "judge_retries": float(self.retries), "judge_calls": float(self.calls),
                    "judge_latency_mean_s": self.latency_sum_s / max(1, self.calls),
                    "judge_latency_max_s": self.latency_max_s}
