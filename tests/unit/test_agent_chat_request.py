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


def test_tool_call_blocks_become_tool_calls_only_when_tools_were_offered() -> None:
    from asyncrl.agents.chat_request import parse_tool_calls

    text = 'Let me add.\n<tool_call>\n{"name": "add", "arguments": {"a": 2, "b": 3}}\n</tool_call>'
    rest, calls = parse_tool_calls(text, "r1")
    assert rest == "Let me add." and calls == [{"id": "call-r1-0", "type": "function",
                                                "function": {"name": "add", "arguments": '{"a": 2, "b": 3}'}}]
    assert parse_tool_calls("<tool_call>not json</tool_call>", "r") == ("<tool_call>not json</tool_call>", [])
    with_tools = chat_response("r1", "m", text, "stop", 1, 1, tools=True)["choices"][0]
    assert with_tools["finish_reason"] == "tool_calls" and with_tools["message"]["tool_calls"] == calls
    assert chat_response("r1", "m", text, "stop", 1, 1)["choices"][0]["message"] == {"role": "assistant",
                                                                                       "content": text}


TOOL_TEMPLATE = (
    "{% if tools %}{{ 'tools:' + (tools | map(attribute='function') | map(attribute='name') | join(',')) }}{% endif %}"
    "{% for m in messages %}{{ '<|' + m['role'] + '|>' }}{{ m['content'] }}"
    "{% for c in m.get('tool_calls', []) %}{{ c['function']['name'] }}({{ c['function']['arguments']['a'] }})"
    "{% endfor %}{% endfor %}{% if add_generation_prompt %}{{ '<|assistant|>' }}{% endif %}"
)


def test_a_template_that_renders_tools_gets_them_and_tool_call_arguments_as_objects() -> None:
    from asyncrl.agents.chat_request import render_chat, template_renders_tools
    from asyncrl.models.tokenizer import make_tokenizer

    tok = make_tokenizer("text")
    tok.chat_template = TOOL_TEMPLATE
    assert template_renders_tools(tok)
    body = {"messages": [{"role": "user", "content": "x"},
                         {"role": "assistant", "content": None, "tool_calls": [
                             {"id": "c0", "type": "function", "function": {"name": "add", "arguments": '{"a": 2}'}}]},
                         {"role": "tool", "tool_call_id": "c0", "content": "5"}],
            "tools": [{"type": "function", "function": {"name": "add", "parameters": {}}}]}
    req = parse_chat(body, LIMITS, template_renders_tools=True)
    assert render_chat(tok, req) == "tools:add<|user|>x<|assistant|>add(2)<|tool|>5<|assistant|>"
    bad = {"messages": [{"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": "{"}}]},
                        {"role": "user", "content": "y"}]}
    with pytest.raises(RequestError, match=r"messages\[0\].tool_calls\[0\].function.arguments: not JSON"):
        parse_chat(bad, LIMITS, template_renders_tools=True)
