"""The decisions the rollout scheduler hands to its driver (the environment role or the simulator).

Each is a plain frozen record; the driver performs it (send a request, abort one, write a group, forget state).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Start:
    """Send one request of sample `sample_index` of `group_id` to server `server`.

    `turn` 0 is the sample's first request; a higher turn continues the same trajectory (after an environment step,
    or after a resubmit with the partial tokens appended). `context_tokens` is the length of what is sent.
    """

    group_id: str
    prompt_index: int
    sample_index: int
    server: int
    start_version: int
    turn: int = 0
    context_tokens: int = 0

    @property
    def request_id(self) -> str:
        return f"{self.group_id}-{self.sample_index}-{self.turn}"


@dataclass(frozen=True)
class Abort:
    """Abort the running request of a sample on its server. With `resubmit`, its partial tokens come back in
    `request_finished(..., aborted=True)` and the sample continues with a new request."""

    group_id: str
    sample_index: int
    server: int
    request_id: str
    reason: str
    resubmit: bool = False


@dataclass(frozen=True)
class EmitGroup:
    """The group is complete: write the kept samples (the first n scored, in index order) as one group."""

    group_id: str
    prompt_index: int
    start_version: int
    sample_indices: tuple[int, ...]


@dataclass(frozen=True)
class DropGroup:
    """The group is gone (stale, failed, surpassed or filtered): forget its pending state."""

    group_id: str
    reason: str


@dataclass(frozen=True)
class DropSample:
    """A sample that finished its requests but is no longer needed (its group completed or was dropped)."""

    group_id: str
    sample_index: int
    reason: str


Decision = Start | Abort | EmitGroup | DropGroup | DropSample


