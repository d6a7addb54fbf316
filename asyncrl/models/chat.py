"""Multi-turn token sequences from a tokenizer's own chat template.

The environment role keeps a trajectory as ONE token sequence: the first prompt (system + first observation +
the generation prompt), then for every turn the tokens the policy generated, then the tokens that close the
assistant turn and carry the next observation up to the next generation prompt. Generated tokens are kept exactly
as the engine produced them (never re-tokenised from text); only the in-between parts are rendered by the template.

How the in-between parts are found, for any Hugging Face chat template (the built-in one and e.g. Qwen's alike):
- `turn_end_ids`: what the template writes after an assistant message's content (built-in: `<eos>`; Qwen:
  `<|im_end|>` and a newline), found by rendering a probe conversation with and without the assistant message;
- `observation_ids(text)`: what follows a closed assistant turn for a new user message, up to and including the
  generation prompt: rendered(probe + [user: text], generation prompt) minus rendered(probe);
- `close_ids(generated)`: the part of `turn_end_ids` the engine did not generate itself. A turn that stopped on
  the stop token already holds turn_end_ids[0]; a turn cut at its token budget gets the whole end appended.

Invariant: the template must render a conversation as the concatenation of its messages (prefix-stable): the
probe renderings are checked, and a template that is not prefix-stable is refused with an error naming it.
"""

from __future__ import annotations

from typing import Any

_PROBE_USER, _PROBE_ASSISTANT = "probe", "reply"


def _render(tok: Any, messages: list[dict[str, str]], add_generation_prompt: bool) -> list[int]:
    text = tok.apply_chat_template(messages, tokenize=False, add_generation_prompt=add_generation_prompt)
    if not isinstance(text, str):
        raise TypeError(f"chat template: expected the rendered text, got {type(text).__name__}")
    return list(tok(text, add_special_tokens=False)["input_ids"])


class ChatFormat:
    """Token pieces of a multi-turn conversation for one tokenizer (see the module docstring)."""

    def __init__(self, tokenizer: Any) -> None:
        if not getattr(tokenizer, "chat_template", None):
            raise ValueError("tokenizer: expected a chat template (tokenizer_config.json `chat_template`) for an "
                             "agentic task")
        self.tok = tokenizer
        user = [{"role": "user", "content": _PROBE_USER}]
        asked = _render(tokenizer, user, add_generation_prompt=True)
        answered = _render(tokenizer, [*user, {"role": "assistant", "content": _PROBE_ASSISTANT}], False)
        reply = list(tokenizer(_PROBE_ASSISTANT, add_special_tokens=False)["input_ids"])
        if answered[: len(asked) + len(reply)] != asked + reply:
            raise ValueError("tokenizer chat template: an assistant message must render as the generation prompt "
                             "followed by its content (the template is not prefix-stable)")
        self.turn_end_ids: list[int] = answered[len(asked) + len(reply):]
        self._probe = answered
        self._probe_messages = [*user, {"role": "assistant", "content": _PROBE_ASSISTANT}]

    def prompt_ids(self, observation: str, system: str = "") -> list[int]:
        """The first prompt: optional system message, the first observation, the generation prompt."""
        messages = ([{"role": "system", "content": system}] if system else []) + [
            {"role": "user", "content": observation}]
        return _render(self.tok, messages, add_generation_prompt=True)

    def observation_ids(self, observation: str) -> list[int]:
        """The tokens of a new user message after a closed assistant turn, through the generation prompt."""
        full = _render(self.tok, [*self._probe_messages, {"role": "user", "content": observation}], True)
        if full[: len(self._probe)] != self._probe:
            raise ValueError("tokenizer chat template: rendering a further user message changed the earlier "
                             "tokens (the template is not prefix-stable)")
        return full[len(self._probe):]

    def close_ids(self, generated: list[int]) -> list[int]:
        """What closes a generated assistant turn: the template's turn end minus what the engine already emitted."""
        end = self.turn_end_ids
        if end and generated and generated[-1] == end[0]:
            return end[1:]
        return list(end)

    def between_turns_ids(self, generated: list[int], observation: str) -> list[int]:
        """Everything between one turn's generated tokens and the next turn's: close, observation, prompt."""
        return self.close_ids(generated) + self.observation_ids(observation)
