"""What the episode endpoint accepts and answers, in the OpenAI wire format. Pure, no I/O.

`parse_chat` and `parse_completion` check a request body against the part of the OpenAI API the endpoint honours
and return it typed; anything else is a `RequestError` that becomes an OpenAI-style error body with a 4xx status
(`error_body`). `render_chat` applies the model's chat template to the messages (text, not ids: see
`asyncrl.agents.transcript` for why). `chat_response` and `completion_response` build the answers.

What is honoured, and why the rest is refused rather than ignored:
- `temperature` and `top_p` must be absent or equal to the run's (`rollout.temperature`, `rollout.top_p`): the
  trainer's log-probs and the engine's behaviour log-probs assume the run's sampling distribution;
- `max_tokens` / `max_completion_tokens` lower the turn's budget, never raise it above `rollout.max_new_tokens`;
- `n` > 1, `stream`, `stop`, `logprobs`, `logit_bias`, `seed`, penalties and `response_format` are refused: each
  would change what is sampled or how it is returned in a way the trajectory does not record;
- `tools` are passed to the chat template when it renders them (its source mentions `tools`), refused otherwise.
  With `tools` in the request, tool calls the model writes as `<tool_call>{"name": ..., "arguments": ...}</tool_call>`
  (the Hermes / Qwen convention) are returned as `tool_calls` (finish reason `tool_calls`), the rest of the text as
  `content`; a block that is not such JSON stays in the text. Without `tools` the reply is text, as generated.
"""

from __future__ import annotations

import json
import re
import time
from dataclasses import dataclass
from typing import Any

ROLES = ("system", "user", "assistant", "tool")
REFUSED = {
    "stream": "streaming is not supported: ask without stream",
    "stop": "stop sequences are not supported: the reply ends at the model's end of turn or at max_tokens",
    "logprobs": "logprobs are not returned",
    "top_logprobs": "logprobs are not returned",
    "logit_bias": "logit_bias would change what is sampled",
    "seed": "the run seeds every sample itself",
    "presence_penalty": "penalties would change what is sampled",
    "frequency_penalty": "penalties would change what is sampled",
    "response_format": "response_format is not supported",
    "echo": "echo is not supported",
    "best_of": "best_of is not supported",
    "suffix": "suffix is not supported",
}
NEUTRAL = {"stream": False, "logprobs": False, "presence_penalty": 0, "frequency_penalty": 0, "echo": False,
           "best_of": 1}


class RequestError(ValueError):
    """A request the endpoint cannot serve: `status` (4xx), `param` (the field at fault, if one is)."""

    def __init__(self, message: str, status: int = 400, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.param, self.kind = status, param, kind


def error_body(err: RequestError) -> dict[str, Any]:
    """The OpenAI error object for `err`."""
    return {"error": {"message": str(err), "type": err.kind, "param": err.param, "code": None}}


@dataclass(frozen=True)
class Limits:
    """The run's sampling settings the endpoint holds every request to."""

    temperature: float
    top_p: float
    max_new_tokens: int


@dataclass(frozen=True)
class ChatRequest:
    model: str
    messages: list[dict[str, Any]]
    max_tokens: int
    tools: list[dict[str, Any]] | None


@dataclass(frozen=True)
class CompletionRequest:
    model: str
    prompt: str
    max_tokens: int


def _number(body: dict[str, Any], name: str) -> float | None:
    value = body.get(name)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise RequestError(f"{name}: expected a number, got {type(value).__name__}", param=name)
    return float(value)


def _common(body: Any, limits: Limits) -> tuple[str, int]:
    """Checks shared by both routes: the body is an object, nothing refused is asked for, sampling matches the run.
    Returns (model, max_tokens)."""
    if not isinstance(body, dict):
        raise RequestError(f"request body: expected a JSON object, got {type(body).__name__}")
    for name, why in REFUSED.items():
        if name in body and body[name] is not None and body[name] != NEUTRAL.get(name, object()):
            raise RequestError(f"{name}: {why}", param=name)
    n = body.get("n")
    if n is not None and n != 1:
        raise RequestError(f"n: expected 1 (one reply per request; the run's group gives several samples), got {n!r}",
                           param="n")
    for name, run_value in (("temperature", limits.temperature), ("top_p", limits.top_p)):
        value = _number(body, name)
        if value is not None and abs(value - run_value) > 1e-9:
            raise RequestError(f"{name}: this run samples with {name} {run_value}; the trained log-probs assume it, "
                               f"got {value}", param=name)
    model = body.get("model", "")
    if not isinstance(model, str):
        raise RequestError(f"model: expected a string, got {type(model).__name__}", param="model")
    max_tokens = limits.max_new_tokens
    for name in ("max_tokens", "max_completion_tokens"):
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise RequestError(f"{name}: expected a positive integer, got {value!r}", param=name)
        max_tokens = min(max_tokens, value)
    return model, max_tokens


def _content(message: dict[str, Any], i: int) -> str:
    content = message.get("content")
    if content is None and message.get("role") == "assistant":
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        parts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise RequestError(f"messages[{i}].content[{j}]: expected a text part {{'type': 'text', 'text': ...}}",
                                   param=f"messages[{i}].content")
            parts.append(part["text"])
        return "".join(parts)
    raise RequestError(f"messages[{i}].content: expected a string or a list of text parts, got "
                       f"{type(content).__name__}", param=f"messages[{i}].content")


def _template_tool_calls(calls: Any, i: int) -> list[dict[str, Any]]:
    """An assistant message's `tool_calls` as chat templates read them: each function's `arguments` as an object
    (the API carries it as a JSON string)."""
    where = f"messages[{i}].tool_calls"
    if not isinstance(calls, list):
        raise RequestError(f"{where}: expected a list", param=where)
    out = []
    for j, call in enumerate(calls):
        fn = call.get("function") if isinstance(call, dict) else None
        if not isinstance(fn, dict) or not isinstance(fn.get("name"), str):
            raise RequestError(f"{where}[{j}]: expected {{'function': {{'name': ..., 'arguments': ...}}}}", param=where)
        args = fn.get("arguments", {})
        if isinstance(args, str):
            try:
                args = json.loads(args) if args.strip() else {}
            except json.JSONDecodeError as e:
                raise RequestError(f"{where}[{j}].function.arguments: not JSON ({e.msg})", param=where) from e
        out.append({**call, "function": {**fn, "arguments": args}})
    return out


def parse_chat(body: Any, limits: Limits, template_renders_tools: bool) -> ChatRequest:
    """`body` of POST /v1/chat/completions, checked (RequestError otherwise)."""
    model, max_tokens = _common(body, limits)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise RequestError("messages: expected a non-empty list of messages", param="messages")
    clean: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if not isinstance(m, dict):
            raise RequestError(f"messages[{i}]: expected an object, got {type(m).__name__}", param="messages")
        role = m.get("role")
        if role not in ROLES:
            raise RequestError(f"messages[{i}].role: expected one of {list(ROLES)}, got {role!r}",
                               param=f"messages[{i}].role")
        out = {"role": role, "content": _content(m, i)}
        for key in ("name", "tool_call_id"):
            if m.get(key) is not None:
                out[key] = m[key]
        if m.get("tool_calls") is not None:
            out["tool_calls"] = _template_tool_calls(m["tool_calls"], i)
        clean.append(out)
    if clean[-1]["role"] == "assistant":
        raise RequestError("messages: the last message is the assistant's; continuing an assistant message is not "
                           "supported", param="messages")
    tools = body.get("tools")
    if tools is not None:
        if not isinstance(tools, list):
            raise RequestError("tools: expected a list of tool definitions", param="tools")
        if not template_renders_tools:
            raise RequestError("tools: this model's chat template does not render tools; describe the tools in a "
                               "message instead", param="tools")
    return ChatRequest(model, clean, max_tokens, tools or None)


def parse_completion(body: Any, limits: Limits) -> CompletionRequest:
    """`body` of POST /v1/completions, checked (RequestError otherwise)."""
    model, max_tokens = _common(body, limits)
    prompt = body.get("prompt")
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if not isinstance(prompt, str) or not prompt:
        raise RequestError("prompt: expected one non-empty string", param="prompt")
    return CompletionRequest(model, prompt, max_tokens)


def template_renders_tools(tokenizer: Any) -> bool:
    """Whether the tokenizer's chat template reads `tools` at all."""
    return "tools" in str(getattr(tokenizer, "chat_template", "") or "")


def render_chat(tokenizer: Any, request: ChatRequest) -> str:
    """The chat template applied to the request's messages, with the generation prompt, as text."""
    kwargs: dict[str, Any] = {"tokenize": False, "add_generation_prompt": True}
    if request.tools is not None:
        kwargs["tools"] = request.tools
    try:
        text = tokenizer.apply_chat_template(request.messages, **kwargs)
    except Exception as err:  # noqa: BLE001 - a template error is the request's, reported as a 400
        raise RequestError(f"messages: the model's chat template cannot render them: {err}", param="messages") \
            from err
    if not isinstance(text, str):
        raise RequestError("messages: the chat template did not render text", param="messages")
    return text


def _usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


_TOOL_CALL = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)


def parse_tool_calls(text: str, reply_id: str) -> tuple[str, list[dict[str, Any]]]:
    """(the text without its tool-call blocks, the OpenAI `tool_calls` they hold); blocks that are not JSON objects
    with a string `name` stay in the text."""
    calls: list[dict[str, Any]] = []

    def take(match: re.Match[str]) -> str:
        try:
            doc = json.loads(match.group(1))
        except json.JSONDecodeError:
            return match.group(0)
        if not isinstance(doc, dict) or not isinstance(doc.get("name"), str):
            return match.group(0)
        args = doc.get("arguments", {})
        calls.append({"id": f"call-{reply_id}-{len(calls)}", "type": "function",
                      "function": {"name": doc["name"], "arguments": args if isinstance(args, str) else json.dumps(args)}})
        return ""

    rest = _TOOL_CALL.sub(take, text)
    return (rest.strip() if calls else text), calls


def chat_response(reply_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                  completion_tokens: int, tools: bool = False) -> dict[str, Any]:
    """The chat completion; with `tools` (the request offered some) tool-call blocks become `tool_calls`."""
    message: dict[str, Any] = {"role": "assistant", "content": text}
    if tools:
        content, calls = parse_tool_calls(text, reply_id)
        if calls:
            message = {"role": "assistant", "content": content or None, "tool_calls": calls}
            finish_reason = "tool_calls"
    return {"id": reply_id, "object": "chat.completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "message": message, "logprobs": None, "finish_reason": finish_reason}],
            "usage": _usage(prompt_tokens, completion_tokens)}


def completion_response(reply_id: str, model: str, text: str, finish_reason: str, prompt_tokens: int,
                        completion_tokens: int) -> dict[str, Any]:
    return {"id": reply_id, "object": "text_completion", "created": int(time.time()), "model": model,
            "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": finish_reason}],
            "usage": _usage(prompt_tokens, completion_tokens)}
