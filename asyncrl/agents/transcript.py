"""The exact token record of one agent episode, built from the chat requests the agent sends. Pure, no I/O.

An agent (user code with an OpenAI client) sends its whole conversation with every request. The engine must decode,
and the trainer must train, the tokens the engine actually produced, never a re-tokenisation of the text the agent
sends back. So the record is kept as token ids, with the text they stand for alongside:

- the first request's rendered prompt (the chat template applied to its messages, with the generation prompt) is
  tokenised once and opens segment 0;
- each generated turn is appended as the engine's token ids, log-probs and versions (loss mask 1), and its text
  (`decode` of those ids, special tokens kept) is appended to the segment's text;
- a later request is rendered to text the same way. When that text starts with the segment's text, the agent's
  history extends what was recorded: only the new part (the template's turn close, the new messages, the next
  generation prompt) is tokenised, appended masked (loss mask 0), and the next turn decodes from the recorded ids
  plus those. When it does not (the agent edited or dropped earlier messages, or the template renders earlier turns
  differently once a later one exists), the request opens a new segment from its own rendering: the earlier
  segment stays as it was generated, and `to_sample` marks where the new one starts (`Sample.segment_offsets`), so
  each segment trains as its own sequence. Nothing is ever re-tokenised in place.

Comparing rendered text, not token ids, is what makes the common case exact: a reply the engine produced as ids
`[a, b]` may tokenise differently from its text, yet its text is what the agent sends back.

Invariants: a segment's `context_ids` is exactly what the engine decoded its last turn from, plus that turn's
tokens; the segment's text is the decode of its ids (special tokens kept); `segment_count` only grows.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from asyncrl.rollout.multiturn import MultiTurnTrajectory
from asyncrl.types import Sample

Tokenize = Callable[[str], list[int]]
Decode = Callable[[list[int]], str]


@dataclass
class _Segment:
    trajectory: MultiTurnTrajectory
    text: str  # the decode of trajectory.context_ids (special tokens kept)


@dataclass
class AgentTranscript:
    """One episode's segments (see the module docstring). `tokenize` maps rendered text to ids without adding
    special tokens; `decode` maps ids to text keeping special tokens and spaces as they are."""

    tokenize: Tokenize
    decode: Decode
    segments: list[_Segment] = field(default_factory=list)
    pending_between: int = 0  # tokens appended by the last `begin_turn` (the scheduler's context growth)

    @classmethod
    def for_tokenizer(cls, tokenizer: Any) -> AgentTranscript:
        """A transcript that tokenises and decodes with a Hugging Face tokenizer (no added specials, text kept)."""
        return cls(tokenize=lambda text: list(tokenizer(text, add_special_tokens=False)["input_ids"]),
                   decode=lambda ids: tokenizer.decode(ids, skip_special_tokens=False,
                                                       clean_up_tokenization_spaces=False))

    @property
    def segment_count(self) -> int:
        return len(self.segments)

    @property
    def num_turns(self) -> int:
        return sum(s.trajectory.num_turns for s in self.segments)

    def begin_turn(self, rendered: str) -> list[int]:
        """Record the request whose rendered prompt is `rendered`; the ids the engine decodes this turn from.

        Extends the current segment when its last turn is answered, and `rendered` starts with its text and adds
        something to it; otherwise opens a new segment. `pending_between` is then the number of tokens the context grew by (the whole prompt for a new
        segment)."""
        if not rendered:
            raise ValueError("chat request: the rendered prompt is empty")
        current = self.segments[-1] if self.segments else None
        if current is not None and current.trajectory.turn_open and rendered.startswith(current.text) \
                and len(rendered) > len(current.text):
            between = self.tokenize(rendered[len(current.text):])
            current.trajectory.end_turn(0.0, between)
            current.text = rendered
            self.pending_between = len(between)
            return current.trajectory.context_ids
        if current is not None and current.trajectory.turn_open:
            current.trajectory.end_turn(0.0)
        prompt = self.tokenize(rendered)
        if not prompt:
            raise ValueError("chat request: the rendered prompt has no tokens")
        self.segments.append(_Segment(MultiTurnTrajectory(prompt), rendered))
        self.pending_between = len(prompt)
        return list(prompt)

    def add_generated(self, token_ids: list[int], logprobs: list[float], versions: list[int],
                      start_version: int) -> None:
        """Append what one engine request returned for the open turn (a turn re-sent after a weight update comes
        back in several parts; they stay one turn)."""
        if not self.segments:
            raise ValueError("add_generated: no request was recorded (begin_turn first)")
        seg = self.segments[-1]
        seg.trajectory.add_generated(token_ids, logprobs, versions, start_version)
        seg.text += self.decode(list(token_ids))

    def current_turn_ids(self) -> list[int]:
        """The generated tokens of the open (or last) turn of the current segment."""
        return self.segments[-1].trajectory.current_turn_ids() if self.segments else []

    def context_ids(self) -> list[int]:
        """What the open turn decodes from next: the current segment's prompt and everything so far."""
        if not self.segments:
            raise ValueError("context_ids: no request was recorded")
        return self.segments[-1].trajectory.context_ids

    def to_sample(self, group_id: str, sample_index: int, reward: float, finish_reason: str) -> Sample:
        """The episode as one `Sample`: segment 0's prompt; then every segment's tokens, each later segment's own
        prompt masked in front of its tokens, marked by `segment_offsets`; `reward` on the last turn."""
        turned = [s.trajectory for s in self.segments if s.trajectory.num_turns]
        if not turned:
            raise ValueError(f"agent episode {group_id}/{sample_index}: the agent never called the model")
        for traj in turned:
            if traj.turn_open:
                traj.end_turn(0.0)
        turned[-1].turn_rewards[-1] = float(reward)
        first = turned[0]
        ids, logprobs = list(first.token_ids), list(first.logprobs)
        versions, mask = list(first.versions), list(first.loss_mask)
        turn_offsets, turn_rewards = list(first.turn_offsets), list(first.turn_rewards)
        segment_offsets: list[int] = []
        for traj in turned[1:]:
            segment_offsets.append(len(ids))
            version = versions[-1]
            ids += traj.prompt_ids
            logprobs += [0.0] * len(traj.prompt_ids)
            versions += [version] * len(traj.prompt_ids)
            mask += [0] * len(traj.prompt_ids)
            base = len(ids)
            turn_offsets += [base + o for o in traj.turn_offsets]
            turn_rewards += traj.turn_rewards
            ids += traj.token_ids
            logprobs += traj.logprobs
            versions += traj.versions  # a later segment was generated later: its versions are not lower
            mask += traj.loss_mask
        sample = Sample(
            group_id=group_id, sample_index=sample_index, prompt_token_ids=list(first.prompt_ids), token_ids=ids,
            logprobs=logprobs, token_versions=versions,
            start_version=first.start_version if first.start_version is not None else 0, reward=float(reward),
            finish_reason=finish_reason, loss_mask=mask, turn_offsets=turn_offsets, turn_rewards=turn_rewards,
            segment_offsets=segment_offsets or None,
        )
        sample.validate()
        return sample
