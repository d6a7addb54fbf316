"""The episode endpoint over real HTTP, driven by the official `openai` client: replies parse as the client's
types, every refusal is an OpenAI error with its 4xx status, an unknown or closed episode is 404, and a second
request of an episode while its first is answered is 409.

The session behind the URL answers from the parsed request (it isolates the HTTP layer; generation behind it is
exercised by the embedded agent run's tests)."""

from __future__ import annotations

import asyncio
from typing import Any

import httpx
import openai
import pytest

from asyncrl.agents.chat_request import (
    Limits,
    chat_response,
    completion_response,
    parse_chat,
    parse_completion,
)
from asyncrl.agents.endpoint import EpisodeEndpoint

LIMITS = Limits(temperature=1.0, top_p=1.0, max_new_tokens=16)


class EchoSession:
    def __init__(self, delay_s: float = 0.0) -> None:
        self.delay_s = delay_s

    async def chat(self, body: Any) -> dict[str, Any]:
        req = parse_chat(body, LIMITS, template_renders_tools=False)
        await asyncio.sleep(self.delay_s)
        return chat_response("c1", req.model, req.messages[-1]["content"].upper(), "stop", 3, req.max_tokens)

    async def completion(self, body: Any) -> dict[str, Any]:
        req = parse_completion(body, LIMITS)
        return completion_response("c2", req.model, req.prompt[::-1], "length", 1, 1)


def serve(test: Any) -> None:
    async def main() -> None:
        endpoint = EpisodeEndpoint(request_timeout_s=5.0)
        await endpoint.start()
        try:
            await test(endpoint)
        finally:
            await endpoint.stop()
    asyncio.run(main())


def test_the_openai_client_gets_replies_of_its_own_types() -> None:
    async def check(endpoint: EpisodeEndpoint) -> None:
        client = openai.AsyncOpenAI(base_url=endpoint.open_episode(EchoSession()), api_key="x", max_retries=0)
        r = await client.chat.completions.create(model="policy", messages=[{"role": "user", "content": "abc"}],
                                                 max_tokens=9)
        assert r.choices[0].message.content == "ABC" and r.choices[0].finish_reason == "stop"
        assert r.usage is not None and r.usage.completion_tokens == 9
        c = await client.completions.create(model="policy", prompt="abc")
        assert c.choices[0].text == "cba" and c.choices[0].finish_reason == "length"
        models = await client.models.list()
        assert [m.id for m in models.data] == ["policy"]
    serve(check)


def test_a_refused_request_is_a_bad_request_naming_the_field() -> None:
    async def check(endpoint: EpisodeEndpoint) -> None:
        client = openai.AsyncOpenAI(base_url=endpoint.open_episode(EchoSession()), api_key="x", max_retries=0)
        with pytest.raises(openai.BadRequestError) as e:
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "a"}],
                                                 temperature=0.2)
        assert e.value.status_code == 400 and e.value.param == "temperature"
        assert "this run samples with temperature 1.0" in e.value.message
        async with httpx.AsyncClient() as raw:
            url = f"{client.base_url}chat/completions"
            bad = await raw.post(url, content=b"{not json", headers={"content-type": "application/json"})
            assert bad.status_code == 400 and "not valid JSON" in bad.json()["error"]["message"]
    serve(check)


def test_an_unknown_or_closed_episode_is_not_found() -> None:
    async def check(endpoint: EpisodeEndpoint) -> None:
        url = endpoint.open_episode(EchoSession())
        endpoint.close_episode(url)
        client = openai.AsyncOpenAI(base_url=url, api_key="x", max_retries=0)
        with pytest.raises(openai.NotFoundError, match="unknown or ended"):
            await client.chat.completions.create(model="p", messages=[{"role": "user", "content": "a"}])
    serve(check)


def test_a_second_request_of_a_busy_episode_is_a_conflict() -> None:
    async def check(endpoint: EpisodeEndpoint) -> None:
        client = openai.AsyncOpenAI(base_url=endpoint.open_episode(EchoSession(delay_s=0.5)), api_key="x",
                                    max_retries=0)
        msgs = [{"role": "user", "content": "a"}]
        first = asyncio.create_task(client.chat.completions.create(model="p", messages=msgs))
        await asyncio.sleep(0.2)
        with pytest.raises(openai.ConflictError, match="one at a time"):
            await client.chat.completions.create(model="p", messages=msgs)
        assert (await first).choices[0].message.content == "A"
    serve(check)
