"""One agentic trajectory as one token sequence: generated turns, masked observations, per-turn rewards.

Pure bookkeeping, no I/O. The environment role feeds it what the generation server returned for each turn and
the tokens `ChatFormat` rendered between turns; `to_sample` gives the `Sample` the trainer reads.

Invariants (a `Sample.validate()` holds on every `to_sample()`):
- response = turn 0 generated tokens, then between-turn tokens, then turn 1 generated tokens, ...;
- `loss_mask` is 1 exactly on generated tokens: the tokens that close a turn, the observation and the generation
  prompt are never trained on (their log-prob is recorded as 0.0 and their version is the preceding token's);
- a turn that spanned a weight update (continued, or re-sent with its partial tokens) stays one turn: its later
  tokens are appended to it, with their own versions;
- `turn_offsets[i]` is where turn i's first generated token sits; `turn_rewards[i]` is the environment's reward
  for turn i's action (0 until it is known), and the sample's reward is their sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from asyncrl.types import Sample


@dataclass
class MultiTurnTrajectory:
    prompt_ids: list[int]
    token_ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    versions: list[int] = field(default_factory=list)
    loss_mask: list[int] = field(default_factory=list)
    turn_offsets: list[int] = field(default_factory=list)
    turn_rewards: list[float] = field(default_factory=list)
    start_version: int | None = None
    _turn_open: bool = False

    @property
    def context_ids(self) -> list[int]:
        """What the next request decodes from: the prompt and everything so far."""
        return self.prompt_ids + self.token_ids

    @property
    def turn_open(self) -> bool:
        """A turn has generated tokens and has not been ended by an environment step yet."""
        return self._turn_open

    @property
    def num_turns(self) -> int:
        return len(self.turn_offsets)

    def current_turn_ids(self) -> list[int]:
        """The generated tokens of the open (or last) turn."""
        return self.token_ids[self.turn_offsets[-1]:] if self.turn_offsets else []

    def add_generated(self, token_ids: list[int], logprobs: list[float], versions: list[int],
                      start_version: int) -> None:
        """Append what one request generated; the first tokens after `end_turn` open a new turn."""
        if not (len(token_ids) == len(logprobs) == len(versions)):
            raise ValueError(f"generated tokens, logprobs and versions differ in length: {len(token_ids)}, "
                             f"{len(logprobs)}, {len(versions)}")
        if self.start_version is None:
            self.start_version = start_version
        if not token_ids:
            return
        if not self._turn_open:
            self.turn_offsets.append(len(self.token_ids))
            self.turn_rewards.append(0.0)
            self._turn_open = True
        self.token_ids += token_ids
        self.logprobs += logprobs
        self.versions += versions
        self.loss_mask += [1] * len(token_ids)

    def end_turn(self, reward: float, between_ids: list[int] | None = None) -> None:
        """Close the open turn with the environment's `reward`; `between_ids` (turn close, next observation,
        generation prompt) are appended masked. Without them the episode ends here."""
        if not self._turn_open:
            raise ValueError("end_turn: no turn is open (a turn needs at least one generated token)")
        self.turn_rewards[-1] = float(reward)
        self._turn_open = False
        if between_ids:
            version = self.versions[-1] if self.versions else (self.start_version or 0)
            self.token_ids += between_ids
            self.logprobs += [0.0] * len(between_ids)
            self.versions += [version] * len(between_ids)
            self.loss_mask += [0] * len(between_ids)

    @property
    def reward(self) -> float:
        return float(sum(self.turn_rewards))

    def to_sample(self, group_id: str, sample_index: int, finish_reason: str) -> Sample:
        if not self.turn_offsets:
            raise ValueError(f"trajectory {group_id}/{sample_index}: no generated turn")
        sample = Sample(
            group_id=group_id, sample_index=sample_index, prompt_token_ids=list(self.prompt_ids),
            token_ids=list(self.token_ids), logprobs=list(self.logprobs), token_versions=list(self.versions),
            start_version=self.start_version if self.start_version is not None else 0, reward=self.reward,
            finish_reason=finish_reason, loss_mask=list(self.loss_mask), turn_offsets=list(self.turn_offsets),
            turn_rewards=list(self.turn_rewards),
        )
        sample.validate()
        return sample
