"""The request half of an episode endpoint session: a chat or completion body checked, rendered and answered in the
OpenAI shape around one turn. Subclasses own the turn itself (`turn`): training episodes schedule it, held-out ones
generate it greedily."""

from __future__ import annotations

from typing import Any

from asyncrl.agents.chat_request import (
    Limits,
    chat_response,
    completion_response,
    parse_chat,
    parse_completion,
    render_chat,
)


class TurnSession:
    """Implements `EpisodeSession` (asyncrl.agents.endpoint) on top of `turn`."""

    def __init__(self, tokenizer: Any, limits: Limits, renders_tools: bool, tag: str) -> None:
        self.tokenizer, self.limits, self.renders_tools, self.tag = tokenizer, limits, renders_tools, tag
        self.turns = 0  # answered turns

    async def turn(self, rendered: str, max_tokens: int) -> tuple[str, str, int, int]:
        """Record and generate one turn from the rendered prompt: (reply text, finish reason, prompt tokens,
        reply tokens); RequestError for a request that cannot be served."""
        raise NotImplementedError

    async def chat(self, body: Any) -> dict[str, Any]:
        req = parse_chat(body, self.limits, self.renders_tools)
        text, finish, prompt_n, n = await self.turn(render_chat(self.tokenizer, req), req.max_tokens)
        return chat_response(f"chatcmpl-{self.tag}-{self.turns}", req.model or "policy", text, finish, prompt_n, n,
                             tools=req.tools is not None)

    async def completion(self, body: Any) -> dict[str, Any]:
        req = parse_completion(body, self.limits)
        text, finish, prompt_n, n = await self.turn(req.prompt, req.max_tokens)
        return completion_response(f"cmpl-{self.tag}-{self.turns}", req.model or "policy", text, finish, prompt_n, n)
