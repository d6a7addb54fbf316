"""The rollout scheduler core: admission under the async ratio, prompt replication, queue routing, staleness aborts.

Sans-IO: events go in (a prompt is offered, a sample finished or failed, the policy version advanced), decisions
come out (`Start`, `Abort`, `EmitGroup`). The environment role drives it with asyncio and real servers; a simulator
can drive the same object with a virtual clock. Nothing here sleeps, sends or reads a clock.

Invariants (ALGORITHMS.md §1, with B = prompts_per_step of this writer, α = async_ratio):
- outstanding = admitted − aborted − consumed, where `consumed` is how many of this writer's groups the trainer
  has read (trained or dropped as stale). A prompt is admitted only while outstanding < (α + 1)·B, so the trainer
  will consume it by step start_version + α when groups finish in order: no sample is started that could not be used.
- Each of a prompt's n samples is its own request (prompt replication), sent to the server with the fewest
  outstanding requests (queue scheduling; ties go to the lowest index).
- When the version becomes v, the next training step is k = v, which accepts start_version >= v − α. Every running
  group with start_version < v − α can never be trained on: all its running samples are aborted and the group is
  counted as aborted, never emitted.
- A group is emitted exactly once, when all n samples finished; a sample that failed (server error) fails its group,
  which is then aborted like a stale one so that admission can replace it.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Start:
    """Send sample `sample_index` of group `group_id` to server `server` (an index into the server list)."""

    group_id: str
    prompt_index: int
    sample_index: int
    server: int
    start_version: int


@dataclass(frozen=True)
class Abort:
    """Abort the running request of a sample on its server."""

    group_id: str
    sample_index: int
    server: int
    reason: str


@dataclass(frozen=True)
class EmitGroup:
    """All samples of the group finished: score-complete results can be written as one group."""

    group_id: str
    prompt_index: int
    start_version: int


Decision = Start | Abort | EmitGroup


@dataclass
class _GroupState:
    group_id: str
    prompt_index: int
    start_version: int
    running: dict[int, int] = field(default_factory=dict)  # sample_index -> server
    finished: set[int] = field(default_factory=set)


@dataclass
class SchedulerStats:
    admitted: int = 0
    emitted: int = 0
    aborted_groups: int = 0
    aborted_samples: int = 0
    failed_samples: int = 0


class RolloutScheduler:
    """Admission, replication, routing and staleness aborts for one environment writer."""

    def __init__(self, *, async_ratio: int, prompts_per_step: int, samples_per_prompt: int, num_servers: int,
                 writer: str = "env0") -> None:
        if async_ratio < 0:
            raise ValueError(f"async_ratio: expected >= 0, got {async_ratio}")
        if prompts_per_step < 1 or samples_per_prompt < 1 or num_servers < 1:
            raise ValueError("prompts_per_step, samples_per_prompt and num_servers must be >= 1")
        self.async_ratio = async_ratio
        self.prompts_per_step = prompts_per_step
        self.samples_per_prompt = samples_per_prompt
        self.writer = writer
        self.version = 0
        self.consumed = 0
        self.stats = SchedulerStats()
        self._server_load = [0] * num_servers
        self._groups: dict[str, _GroupState] = {}

    # ---- queries -------------------------------------------------------------------------------------
    @property
    def window(self) -> int:
        """(α + 1)·B: how many of this writer's groups may be admitted and not yet consumed."""
        return (self.async_ratio + 1) * self.prompts_per_step

    @property
    def outstanding(self) -> int:
        return self.stats.admitted - self.stats.aborted_groups - self.consumed

    def can_admit(self) -> bool:
        return self.outstanding < self.window

    @property
    def server_load(self) -> list[int]:
        return list(self._server_load)

    @property
    def running_groups(self) -> int:
        return len(self._groups)

    def min_trainable_version(self) -> int:
        """The oldest start_version the next training step (k = version) accepts."""
        return self.version - self.async_ratio

    # ---- events --------------------------------------------------------------------------------------
    def admit(self, prompt_index: int) -> list[Decision]:
        """Admit one prompt: returns one `Start` per sample. Raises if the window is full."""
        if not self.can_admit():
            raise RuntimeError(
                f"admission window full: outstanding {self.outstanding} >= (α+1)·B = {self.window}"
            )
        group_id = f"{self.writer}-{self.stats.admitted:09d}"
        self.stats.admitted += 1
        state = _GroupState(group_id, prompt_index, self.version)
        self._groups[group_id] = state
        decisions: list[Decision] = []
        for i in range(self.samples_per_prompt):
            server = self._least_loaded()
            self._server_load[server] += 1
            state.running[i] = server
            decisions.append(Start(group_id, prompt_index, i, server, self.version))
        return decisions

    def sample_finished(self, group_id: str, sample_index: int) -> list[Decision]:
        """A sample's request completed (scored). Returns `EmitGroup` when its group is complete.

        A result for a group that was already aborted (it raced the abort) is ignored.
        """
        state = self._groups.get(group_id)
        if state is None or sample_index not in state.running:
            return []
        server = state.running.pop(sample_index)
        self._server_load[server] -= 1
        state.finished.add(sample_index)
        if state.running or len(state.finished) < self.samples_per_prompt:
            return []
        del self._groups[group_id]
        self.stats.emitted += 1
        return [EmitGroup(group_id, state.prompt_index, state.start_version)]

    def sample_failed(self, group_id: str, sample_index: int) -> list[Decision]:
        """A sample's request failed: the whole group is aborted (and so replaced by admission)."""
        state = self._groups.get(group_id)
        if state is None or sample_index not in state.running:
            return []
        server = state.running.pop(sample_index)
        self._server_load[server] -= 1
        self.stats.failed_samples += 1
        return self._abort_group(state, "sample failed")

    def version_advanced(self, version: int, consumed: int) -> list[Decision]:
        """The trainer published `version` having consumed `consumed` of this writer's groups.

        Returns `Abort`s for every running sample of a group that can no longer be trained on.
        """
        if version < self.version or consumed < self.consumed:
            raise ValueError(
                f"version/consumed must not go back: had ({self.version}, {self.consumed}), got ({version}, {consumed})"
            )
        self.version, self.consumed = version, consumed
        floor = self.min_trainable_version()
        decisions: list[Decision] = []
        for state in [g for g in self._groups.values() if g.start_version < floor]:
            decisions += self._abort_group(state, f"stale: start_version {state.start_version} < {floor}")
        return decisions

    # ---- internals -----------------------------------------------------------------------------------
    def _least_loaded(self) -> int:
        return min(range(len(self._server_load)), key=lambda s: (self._server_load[s], s))

    def _abort_group(self, state: _GroupState, reason: str) -> list[Decision]:
        decisions: list[Decision] = []
        for sample_index, server in sorted(state.running.items()):
            self._server_load[server] -= 1
            self.stats.aborted_samples += 1
            decisions.append(Abort(state.group_id, sample_index, server, reason))
        state.running.clear()
        del self._groups[state.group_id]
        self.stats.aborted_groups += 1
        return decisions
