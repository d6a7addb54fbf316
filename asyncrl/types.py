"""The units that flow between roles: one generated `Sample`, one prompt's `Group` of samples.

Invariants (checked by `Sample.validate`):
- `token_ids`, `logprobs` and `token_versions` have the same length (one entry per response token);
- `token_versions` is non-decreasing and every entry is >= `start_version` (a sample that spanned a
  weight update has tokens from several versions: partial rollout);
- token ids and log-probs travel as numbers, never text, so trainer and engine cannot disagree;
- `loss_mask`, when given, has one 0/1 entry per response token: 1 on tokens the policy generated and is trained
  on, 0 on tokens that are not trained on (environment observations, or decode padding past the first EOS of a
  length-shaped benchmark workload). None means every response token is trained on.
- a multi-turn sample (agentic task) has `turn_offsets` and `turn_rewards`, one entry per policy turn: turn i's
  generated tokens start at response position `turn_offsets[i]` (strictly increasing, first 0, each on a loss-mask
  1 token) and run up to the next run of masked (observation) tokens; `turn_rewards[i]` is the environment's reward
  for the action of turn i, and `reward` is their sum. A turn's versions are its slice of `token_versions`.
- a sample whose context restarted mid-episode (the agent edited its history) has `segment_offsets`: the response
  positions where a new segment starts (strictly increasing, each in [1, n-1]; needs `loss_mask`). Segment 0 is
  `prompt_token_ids + token_ids[:o_1]`; segment k >= 1 is `token_ids[o_k:o_{k+1}]`, whose leading run of loss-mask 0
  tokens (at least one) is that segment's own prompt and the rest (at least one trained token) its response. Every
  segment's response starts on a trained token (for segment 0: `loss_mask[0] == 1`), and no turn starts inside a
  segment's prompt. The trainer trains each segment as its own sequence (`asyncrl.training.segments`).
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Sample:
    """One response to one prompt, as the generation engine produced it, plus its reward."""

    group_id: str
    sample_index: int
    prompt_token_ids: list[int]
    token_ids: list[int]
    logprobs: list[float]
    token_versions: list[int]
    start_version: int
    reward: float = 0.0
    finish_reason: str = "stop"
    loss_mask: list[int] | None = None
    turn_offsets: list[int] | None = None
    turn_rewards: list[float] | None = None
    segment_offsets: list[int] | None = None

    @property
    def num_turns(self) -> int:
        return 1 if self.turn_offsets is None else len(self.turn_offsets)

    def mask(self) -> list[int]:
        """The loss mask with None expanded to all ones."""
        return [1] * len(self.token_ids) if self.loss_mask is None else self.loss_mask

    def validate(self) -> None:
        n = len(self.token_ids)
        if len(self.logprobs) != n or len(self.token_versions) != n:
            raise ValueError(
                f"sample {self.group_id}/{self.sample_index}: token_ids, logprobs and token_versions must have one entry "
                f"per response token, got {n}, {len(self.logprobs)}, {len(self.token_versions)}"
            )
        if self.loss_mask is not None and (len(self.loss_mask) != n or any(m not in (0, 1) for m in self.loss_mask)):
            raise ValueError(
                f"sample {self.group_id}/{self.sample_index}: loss_mask must hold one 0/1 entry per response token "
                f"({n}), got {len(self.loss_mask)} entries"
            )
        if (self.turn_offsets is None) != (self.turn_rewards is None):
            raise ValueError(f"sample {self.group_id}/{self.sample_index}: turn_offsets and turn_rewards go together")
        if self.segment_offsets is not None:
            self._validate_segments(n)
        if self.turn_offsets is not None and self.turn_rewards is not None:
            self._validate_turns(n)
        if not self.prompt_token_ids:
            raise ValueError(f"sample {self.group_id}/{self.sample_index}: empty prompt_token_ids")
        prev = self.start_version
        for v in self.token_versions:
            if v < prev:
                raise ValueError(
                    f"sample {self.group_id}/{self.sample_index}: token_versions must be non-decreasing and "
                    f">= start_version {self.start_version}, got {self.token_versions}"
                )
            prev = v

    def _validate_turns(self, n: int) -> None:
        offsets, rewards, mask = self.turn_offsets or [], self.turn_rewards or [], self.mask()
        where = f"sample {self.group_id}/{self.sample_index}"
        if not offsets or len(offsets) != len(rewards):
            raise ValueError(f"{where}: expected one turn_rewards entry per turn offset (at least one), got "
                             f"{len(offsets)} offsets and {len(rewards)} rewards")
        if offsets[0] != 0 or any(b <= a for a, b in zip(offsets, offsets[1:], strict=False)) or offsets[-1] >= max(n, 1):
            raise ValueError(f"{where}: turn_offsets must start at 0 and increase strictly below {n}, got {offsets}")
        if n and any(mask[o] != 1 for o in offsets):
            raise ValueError(f"{where}: every turn must start on a trained-on (loss_mask 1) token, got {offsets}")
        if any(r != r or r in (float("inf"), float("-inf")) for r in rewards):
            raise ValueError(f"{where}: turn_rewards must be finite, got {rewards}")

    def _validate_segments(self, n: int) -> None:
        offsets, where = self.segment_offsets or [], f"sample {self.group_id}/{self.sample_index}"
        if not offsets:
            raise ValueError(f"{where}: segment_offsets must hold at least one offset (None for a single segment), "
                             f"got {self.segment_offsets}")
        if self.loss_mask is None:
            raise ValueError(f"{where}: segment_offsets requires loss_mask (a later segment's prompt is its leading "
                             f"loss_mask 0 run)")
        if any(b <= a for a, b in zip(offsets, offsets[1:], strict=False)) or offsets[0] < 1 or offsets[-1] > n - 1:
            raise ValueError(f"{where}: segment_offsets must increase strictly within [1, {n - 1}], got {offsets}")
        mask = self.loss_mask
        if mask[0] != 1:
            raise ValueError(f"{where}: segment_offsets: segment 0's response must start on a trained-on (loss_mask 1) "
                             f"token, got loss_mask[0] = {mask[0]}")
        turns = set(self.turn_offsets or [])
        for k, (a, b) in enumerate(zip(offsets, [*offsets[1:], n], strict=True), start=1):
            head = next((j for j in range(a, b) if mask[j]), b)
            if head == a:
                raise ValueError(f"{where}: segment_offsets: segment {k} ({a}..{b - 1}) must start with its prompt (at "
                                 f"least one loss_mask 0 token), got loss_mask {mask[a:b]}")
            if head == b:
                raise ValueError(f"{where}: segment_offsets: segment {k} ({a}..{b - 1}) must hold at least one trained-on "
                                 f"(loss_mask 1) token, got loss_mask {mask[a:b]}")
            inside = sorted(turns.intersection(range(a, head)))
            if inside:
                raise ValueError(f"{where}: turn_offsets {inside} fall inside the prompt of segment {k} "
                                 f"({a}..{head - 1}); a turn must start on a trained-on token of its segment")


@dataclass
class Group:
    """The n samples of one prompt: the unit the environment writes to S3 and the trainer consumes."""

    group_id: str
    prompt_index: int
    task: str
    samples: list[Sample] = field(default_factory=list)

    @property
    def start_version(self) -> int:
        """The oldest start version of the group's samples: what the staleness bound is checked on."""
        return min(s.start_version for s in self.samples)

    @property
    def rewards(self) -> list[float]:
        return [s.reward for s in self.samples]

    def validate(self) -> None:
        if not self.samples:
            raise ValueError(f"group {self.group_id}: no samples")
        for s in self.samples:
            if s.group_id != self.group_id:
                raise ValueError(f"group {self.group_id}: holds a sample of group {s.group_id}")
            s.validate()
