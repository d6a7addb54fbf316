"""The trainer's read-ahead of finished groups: a background thread polls a `GroupReader` (with backoff while
nothing is new) and decodes the next groups into a bounded buffer; the trainer *takes* groups for its steps.

Owns: the prefetch thread, its buffer, the idle backoff, and the trainer's stream positions (`cursors`).

Invariants:
- once `start()`ed, the reader (its cursors, quarantine and gap records) is used by the prefetch thread alone;
  `restore()` is allowed only before; the buffer fills only once started (the trainer's `lead` starts it);
- a buffered group is not consumed. `cursors[w]` is the stream index of writer w's first buffered (not yet taken)
  group, or, when none is buffered, the reader's cursor: every group before it was taken, quarantined or skipped as
  a gap (it may point inside an object whose first groups were taken; `GroupReader.restore` finds it there).
  So the `consumed` counts the trainer publishes and the cursors it checkpoints cover taken groups only, and a
  resume from them re-reads whatever was only prefetched;
- `quarantined` / `gaps_skipped` hold only the reader's records that `cursors` has moved past (those a resume
  from `cursors` would not meet again), so checkpointed counters and cursors agree;
- groups are taken one by one, round-robin across writers (the writer after the last one served, by name, that has
  a buffered group), each writer's in stream order, never more than asked for; the thread reads only while fewer
  than `capacity` groups are buffered (an object holding several groups may overshoot by its extra groups);
- after a poll that ended on a miss the thread waits `Backoff.next()` (`initial_s` doubling to `cap_s` while polls
  find nothing, back to `initial_s` after one that found a group); it polls again at once only after a poll cut
  short by the buffer's room. A poll that found groups already ended on a miss (the reader GETs each writer's next
  key until one is missing), so polling again at once would only repeat that miss (an 80-step default run: the
  trainer's empty GETs 6.3-7.2 per step before, 5.6 after). Every wait of the thread is cut short by `close()`;
- an exception in the thread ends it; the groups buffered before it are handed over first, then `take()` raises
  it (and keeps raising it): never swallowed;
- `take()` waits at most its `timeout_s`; `close()` stops the thread and joins it for at most `join_timeout_s`
  (a thread still inside an S3 call is a daemon: it exits when the call returns, and is logged).
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable, Mapping

from asyncrl.storage.groups import GapRecord, GroupReader, QuarantineRecord
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store
from asyncrl.types import Group

log = logging.getLogger(__name__)

IDLE_BACKOFF_INITIAL_S = 0.01
IDLE_BACKOFF_CAP_S = 0.2
# An idle poll costs one GET per writer, ~1.5-2 ms of CPU each (boto3 against SeaweedFS); at the 0.2 s cap a waiting
# trainer measured 1.5 % of a core with 1 writer, 4 % with 4. Past 3 writers the cap grows with them: an idle
# trainer makes at most 1/0.06 ≈ 17 GETs/s whatever the number of writers (~3-4 % of a core, budget 5 %).
IDLE_BACKOFF_CAP_PER_WRITER_S = 0.06


def idle_backoff_cap_s(num_writers: int) -> float:
    """The idle backoff cap for `num_writers` writers: 0.2 s up to 3 writers, then 0.06 s per writer."""
    return max(IDLE_BACKOFF_CAP_S, IDLE_BACKOFF_CAP_PER_WRITER_S * num_writers)


def environment_writer_ids(num_writers: int) -> list[str]:
    """The group writers' ids of a run with `rollout.num_writers` environment roles: env0, env1, ... (the `--id`
    that `asyncrl.local.launcher` and `asyncrl.cluster.setup` give them)."""
    return [f"env{i}" for i in range(num_writers)]


class Backoff:
    """The waits between polls that found nothing: `initial_s`, then ×`factor` each time, at most `cap_s`;
    `reset()` (a poll found something) starts again at `initial_s`."""

    def __init__(self, initial_s: float = IDLE_BACKOFF_INITIAL_S, cap_s: float = IDLE_BACKOFF_CAP_S,
                 factor: float = 2.0) -> None:
        if not 0 < initial_s <= cap_s or factor < 1:
            raise ValueError(f"backoff: expected 0 < initial_s <= cap_s and factor >= 1, got {initial_s}, {cap_s}, {factor}")
        self.initial_s, self.cap_s, self.factor = initial_s, cap_s, factor
        self._next = initial_s

    def next(self) -> float:
        wait = self._next
        self._next = min(self.cap_s, wait * self.factor)
        return wait

    def reset(self) -> None:
        self._next = self.initial_s


class GroupPrefetcher:
    """Reads groups ahead of the trainer in a background thread; see the module docstring for the invariants.

    `idle_wait(s)` (a test seam) replaces the thread's interruptible wait after a poll that ended on a miss.
    """

    def __init__(self, reader: GroupReader, capacity: int, backoff: Backoff | None = None,
                 join_timeout_s: float = 10.0, idle_wait: Callable[[float], None] | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"capacity: expected >= 1, got {capacity}")
        self.reader = reader
        self.capacity = capacity
        self.backoff = backoff or Backoff()
        self.join_timeout_s = join_timeout_s
        self._idle_wait = idle_wait or self._wait_unless_closed
        self._cond = threading.Condition()
        self._buffer: dict[str, deque[tuple[int, Group]]] = {}  # writer -> (stream index, group), in order
        self._buffered = 0  # groups in the buffer
        self._last_served: str | None = None
        self._read_cursors = reader.cursors  # the reader's state as of its last poll (the thread's to update)
        self._quarantined: list[QuarantineRecord] = []
        self._gaps: list[GapRecord] = []
        self._error: BaseException | None = None
        self._closing = False
        self._thread: threading.Thread | None = None
        self.polls = 0  # polls made (found something or not)
        self.empty_polls = 0

    @classmethod
    def for_run(cls, store: S3Store, paths: RunPaths, num_writers: int, capacity: int,
                gap_wait_s: float) -> GroupPrefetcher:
        """The trainer's read-ahead: a reader that knows the run's writers from the start (and rediscovers others
        every few seconds), the backoff cap sized for `num_writers` (`idle_backoff_cap_s`)."""
        reader = GroupReader(store, paths, writers=environment_writer_ids(num_writers), gap_wait_s=gap_wait_s)
        return cls(reader, capacity=capacity, backoff=Backoff(cap_s=idle_backoff_cap_s(num_writers)))

    # ---- the trainer's side --------------------------------------------------------------------------
    def restore(self, cursors: Mapping[str, int]) -> None:
        """Continue from saved (taken) cursors; only before `start()`, with nothing read ahead."""
        with self._cond:
            if self._thread is not None or self._buffered:
                raise RuntimeError("GroupPrefetcher.restore: the prefetch thread has started (or groups are buffered)")
            self.reader.restore(cursors)
            self._read_cursors = self.reader.cursors

    def start(self) -> None:
        """Start the prefetch thread (idempotent)."""
        with self._cond:
            if self._closing:
                raise RuntimeError("GroupPrefetcher.start: closed")
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="group-prefetch", daemon=True)
                self._thread.start()

    @property
    def cursors(self) -> dict[str, int]:
        """{writer: stream index of the next group not yet taken}: for `consumed` counts and checkpoints (see the
        module docstring)."""
        with self._cond:
            return self._taken_cursors()

    def _taken_cursors(self) -> dict[str, int]:
        out = dict(self._read_cursors)
        for w, buffered in self._buffer.items():
            if buffered:
                out[w] = buffered[0][0]
        return out

    @property
    def quarantined(self) -> list[QuarantineRecord]:
        """The reader's quarantine records behind the taken cursors."""
        with self._cond:
            cursors = self._taken_cursors()
            return [r for r in self._quarantined if r.seq < cursors.get(r.writer, 0)]

    @property
    def gaps_skipped(self) -> list[GapRecord]:
        """The reader's skipped gaps behind the taken cursors."""
        with self._cond:
            cursors = self._taken_cursors()
            return [r for r in self._gaps if r.resumed_at <= cursors.get(r.writer, 0)]

    @property
    def buffered(self) -> int:
        """Groups read ahead, not taken."""
        with self._cond:
            return self._buffered

    def take(self, max_groups: int, timeout_s: float = 0.0) -> list[tuple[str, int, Group]]:
        """Take buffered groups for a step: (writer, stream index, group), round-robin across writers, until
        `max_groups` or the buffer is empty. Waits up to `timeout_s` for the first one; [] if none came
        (the buffer fills only once `start()`ed). Raises the thread's error once nothing buffered is left."""
        if max_groups < 1:
            raise ValueError(f"max_groups: expected >= 1, got {max_groups}")
        with self._cond:
            if timeout_s > 0:
                self._cond.wait_for(lambda: self._buffered or self._error is not None or self._closing, timeout_s)
            out: list[tuple[str, int, Group]] = []
            while len(out) < max_groups and self._buffered:
                w = self._next_writer()
                index, group = self._buffer[w].popleft()
                self._buffered -= 1
                self._last_served = w
                out.append((w, index, group))
            if out:
                self._cond.notify_all()  # room for the thread
                return out
            if self._error is not None:
                raise self._error
            if self._closing:
                raise RuntimeError("GroupPrefetcher.take: closed")
            return out

    def _next_writer(self) -> str:
        """The writer after the last one served (by name, wrapping) that has a buffered group."""
        ready = sorted(w for w, buffered in self._buffer.items() if buffered)
        last = self._last_served
        return next((w for w in ready if last is None or w > last), ready[0])

    def close(self) -> None:
        """Stop the thread and join it (at most `join_timeout_s`); idempotent."""
        with self._cond:
            self._closing = True
            self._cond.notify_all()
            thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(self.join_timeout_s)
            if thread.is_alive():
                log.warning("group prefetch thread still busy %.0fs after close (in an S3 call); left to finish",
                            self.join_timeout_s)

    # ---- the prefetch thread -------------------------------------------------------------------------
    def fetch_once(self, max_groups: int) -> int:
        """One poll of the reader into the buffer; the number of groups it read. The thread's step (tests may call
        it directly on an unstarted prefetcher)."""
        got: list[tuple[str, int, Group]] = []
        try:
            got = self.reader.poll(max_groups=max_groups)
        finally:  # also after an error: the reader's cursors may have moved past quarantined objects
            with self._cond:
                self._add(got)
                self._read_cursors = self.reader.cursors
                self._quarantined = list(self.reader.quarantined)
                self._gaps = list(self.reader.gaps_skipped)
                self.polls += 1
                self.empty_polls += int(not got)
                if got:
                    self._cond.notify_all()
        return len(got)

    def _add(self, got: Iterable[tuple[str, int, Group]]) -> None:
        for w, index, g in got:
            self._buffer.setdefault(w, deque()).append((index, g))
            self._buffered += 1

    def _room(self) -> int:
        """Wait for room in the buffer: the groups that may be read now, 0 once closing."""
        with self._cond:
            self._cond.wait_for(lambda: self._buffered < self.capacity or self._closing)
            return 0 if self._closing else self.capacity - self._buffered

    def _wait_unless_closed(self, seconds: float) -> None:
        with self._cond:
            self._cond.wait_for(lambda: self._closing, seconds)

    def _run(self) -> None:
        try:
            while True:
                room = self._room()
                if room == 0:
                    return
                got = self.fetch_once(room)
                if got:
                    self.backoff.reset()
                if got < room:  # the poll ended on a miss for every writer: nothing more is there yet
                    self._idle_wait(self.backoff.next())
        except BaseException as e:  # surfaced by take()
            log.error("group prefetch thread failed: %s", e, exc_info=True)
            with self._cond:
                self._error = e
                self._cond.notify_all()
