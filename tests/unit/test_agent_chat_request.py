"""What the episode endpoint accepts (asyncrl.agents.chat_request): refused fields name themselves, the run's
sampling settings bind, replies have OpenAI's shape."""

from __future__ import annotations

import pytest

from asyncrl.agents.chat_request import (
    Limits,
    RequestError,
    chat_response,
    error_body,
    parse_chat,
    parse_completion,
)

LIMITS = Limits(temperature=0.6, top_p=1.0, max_new_tokens=160)
HI = [{"role": "user", "content": "hi"}]


def test_a_plain_request_gets_the_runs_budget_and_text_parts_are_joined() -> None:
    req = parse_chat({"model": "m", "messages": [{"role": "system", "content": "s"},
                                                  {"role": "user", "content": [{"type": "text", "text": "a"},
                                                                               {"type": "text", "text": "b"}]}]},
                     LIMITS, template_renders_tools=False)
    assert req.messages == [{"role": "system", "content": "s"}, {"role": "user", "content": "ab"}]
    assert (req.model, req.max_tokens, req.tools) == ("m", 160, None)


def test_max_tokens_lowers_the_budget_never_raises_it() -> None:
    assert parse_chat({"messages": HI, "max_tokens": 20}, LIMITS, False).max_tokens == 20
    assert parse_chat({"messages": HI, "max_completion_tokens": 999}, LIMITS, False).max_tokens == 160


def test_the_runs_sampling_settings_are_accepted_and_others_refused_by_name() -> None:
    assert parse_chat({"messages": HI, "temperature": 0.6, "top_p": 1, "n": 1, "stream": False}, LIMITS, False)
    with pytest.raises(RequestError, match="temperature: this run samples with temperature 0.6") as e:
        parse_chat({"messages": HI, "temperature": 1.0}, LIMITS, False)
    assert (e.value.status, e.value.param) == (400, "temperature")


@pytest.mark.parametrize("field,value,message", [
    ("stream", True, "stream: streaming is not supported"),
    ("n", 2, "n: expected 1"),
    ("stop", ["\n"], "stop: stop sequences are not supported"),
    ("logprobs", True, "logprobs: logprobs are not returned"),
    ("seed", 3, "seed: the run seeds every sample itself"),
    ("max_tokens", 0, "max_tokens: expected a positive integer"),
    ("tools", [{"type": "function"}], "tools: this model's chat template does not render tools"),
    ("messages", [], "messages: expected a non-empty list"),
    ("messages", [{"role": "robot", "content": "x"}], r"messages\[0\].role: expected one of"),
    ("messages", [{"role": "user", "content": 3}], r"messages\[0\].content: expected a string"),
    ("messages", [{"role": "user", "content": "x"}, {"role": "assistant", "content": "y"}],
     "the last message is the assistant's"),
])
def test_refused_requests_name_the_field(field: str, value: object, message: str) -> None:
    body = {"messages": HI, field: value}
    with pytest.raises(RequestError, match=message) as e:
        parse_chat(body, LIMITS, template_renders_tools=False)
    assert e.value.status == 400
    err = error_body(e.value)["error"]
    assert err["type"] == "invalid_request_error" and err["message"] == str(e.value)


def test_completions_take_one_prompt_string() -> None:
    assert parse_completion({"prompt": ["abc"], "max_tokens": 5}, LIMITS).prompt == "abc"
    with pytest.raises(RequestError, match="prompt: expected one non-empty string"):
        parse_completion({"prompt": [1, 2]}, LIMITS)
    with pytest.raises(RequestError, match="request body: expected a JSON object, got list"):
        parse_completion([], LIMITS)


def test_a_reply_has_the_openai_shape() -> None:
    r = chat_response("id1", "policy", "hello", "stop", 7, 2)
    assert r["object"] == "chat.completion" and r["choices"][0]["message"] == {"role": "assistant",
                                                                               "content": "hello"}
    assert r["usage"] == {"prompt_tokens": 7, "completion_tokens": 2, "total_tokens": 9}
