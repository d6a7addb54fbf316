"""Finished groups on S3: their Parquet encoding and the per-writer streams of group objects.

Encoding: one Parquet (zstd) table per object, one row per sample, columns `GROUP_SCHEMA`. Log-probs
are stored as float64 (not float32) so a Python float written is the exact float read back.
`decode_groups` checks every column's presence, type and absence of nulls, then `Group.validate()`; a column of
`OPTIONAL_COLUMNS` (`segment_offsets`) may be absent (an object written before it existed) and then reads as empty.

Streams: writer `w`'s groups are numbered 0, 1, 2, ... in the order written (the stream index); an object holds
one or several consecutive groups and is named by the index of its first: `groups/<w>/<seq:012d>.parquet`, the
next object starting at seq + its number of groups (one group per object: seq 0, 1, 2, ... as before). Each object
is written once with a conditional PUT and never rewritten. A reader keeps one cursor per writer, the stream index
of the next group to read, which is also how many of that writer's groups it has consumed; it GETs exactly the
key at its cursor: no reliance on listing order, and cursors are small JSON that a checkpoint can store and
`restore()`. A cursor may point inside an object (the trainer took part of it): `restore()` finds the object that
holds it and the reader returns that object's groups from there on.

Every object carries its group count as S3 user metadata (`GROUPS_METADATA`).

Faults: an object that does not decode (truncated, not Parquet, wrong schema, invalid group) is copied
to `quarantine/groups/<w>/<seq>.parquet`, logged, recorded in `reader.quarantined` and skipped: the cursor moves
past its groups, as many as its metadata says; without that (the metadata lost too) it moves to the writer's next
object once that exists (where it starts says how many the bad one held). A missing object while a later seq of the same writer exists
(a gap) is waited for `gap_wait_s`, then skipped with an error log and a record in `reader.gaps_skipped`: never
silently.

Cost: a poll GETs one key per writer and lists nothing, except a writer discovery (one delimiter listing of
`groups/`) at most every `rediscover_interval_s` and a gap check at most every `gap_check_interval_s` per writer.
The trainer reads through `asyncrl.storage.group_prefetch` (a background thread, idle backoff).
"""

from __future__ import annotations

import dataclasses
import io
import logging
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.parquet as pq

from asyncrl.storage.run_layout import RunPaths, check_id
from asyncrl.storage.s3 import ObjectExists, S3Store, StorageError
from asyncrl.types import Group, Sample

log = logging.getLogger(__name__)

GROUP_SCHEMA = pa.schema(
    [
        ("group_id", pa.string()),
        ("prompt_index", pa.int64()),
        ("task", pa.string()),
        ("sample_index", pa.int32()),
        ("prompt_token_ids", pa.list_(pa.int32())),
        ("token_ids", pa.list_(pa.int32())),
        ("logprobs", pa.list_(pa.float64())),
        ("token_versions", pa.list_(pa.int32())),
        ("start_version", pa.int64()),
        ("reward", pa.float64()),
        ("finish_reason", pa.string()),
        ("loss_mask", pa.list_(pa.int8())),
        ("turn_offsets", pa.list_(pa.int32())),  # empty: a single-turn sample
        ("turn_rewards", pa.list_(pa.float64())),
        ("segment_offsets", pa.list_(pa.int32())),  # empty: a single segment
    ]
)
OPTIONAL_COLUMNS = frozenset({"segment_offsets"})  # absent from objects written before it existed: read as empty
_MAX_WRITE_ATTEMPTS = 1000
GROUPS_METADATA = "asyncrl-groups"  # S3 user metadata of a group object: how many groups it holds


def metadata_groups(metadata: Mapping[str, str] | None) -> int | None:
    """The group count an object's metadata states, or None (absent or not a positive integer)."""
    raw = (metadata or {}).get(GROUPS_METADATA, "")
    return int(raw) if raw.isdigit() and int(raw) > 0 else None


def encode_groups(groups: Iterable[Group]) -> bytes:
    """Parquet bytes holding every sample of `groups` (each validated first), in order."""
    rows: dict[str, list] = {name: [] for name in GROUP_SCHEMA.names}
    count = 0
    for g in groups:
        g.validate()
        count += 1
        for s in g.samples:
            rows["group_id"].append(g.group_id)
            rows["prompt_index"].append(g.prompt_index)
            rows["task"].append(g.task)
            rows["sample_index"].append(s.sample_index)
            rows["prompt_token_ids"].append(s.prompt_token_ids)
            rows["token_ids"].append(s.token_ids)
            rows["logprobs"].append(s.logprobs)
            rows["token_versions"].append(s.token_versions)
            rows["start_version"].append(s.start_version)
            rows["reward"].append(s.reward)
            rows["finish_reason"].append(s.finish_reason)
            rows["loss_mask"].append(s.mask())
            rows["turn_offsets"].append(s.turn_offsets or [])
            rows["turn_rewards"].append(s.turn_rewards or [])
            rows["segment_offsets"].append(s.segment_offsets or [])
    if count == 0:
        raise ValueError("encode_groups: expected at least one group")
    table = pa.table(rows, schema=GROUP_SCHEMA)
    buf = io.BytesIO()
    pq.write_table(table, buf, compression="zstd")
    return buf.getvalue()


def encode_group(group: Group) -> bytes:
    """Parquet bytes of one group (the default: one group per object)."""
    return encode_groups([group])


def _same_type(actual: pa.DataType, expected: pa.DataType) -> bool:
    """Type equality that ignores list item field names ('item' vs 'element')."""
    if pa.types.is_list(expected):
        return pa.types.is_list(actual) and _same_type(actual.value_type, expected.value_type)
    return actual.equals(expected)


def _check_table(table: pa.Table, source: str) -> None:
    for field in GROUP_SCHEMA:
        if field.name not in table.column_names:
            if field.name in OPTIONAL_COLUMNS:
                continue
            raise ValueError(f"{source}: missing column {field.name!r} (expected {field.type})")
        col = table.column(field.name)
        if not _same_type(col.type, field.type):
            raise ValueError(f"{source}: column {field.name!r} has type {col.type}, expected {field.type}")
        if col.null_count:
            raise ValueError(f"{source}: column {field.name!r} has {col.null_count} null value(s)")
        if pa.types.is_list(field.type):
            for chunk in col.chunks:
                if chunk.values.null_count:
                    raise ValueError(f"{source}: column {field.name!r} has null list element(s)")


def decode_groups(data: bytes, source: str) -> list[Group]:
    """The groups of one Parquet object, in order of first appearance; ValueError naming `source`."""
    try:
        table = pq.read_table(pa.BufferReader(data))
    except (pa.ArrowException, OSError) as e:
        raise ValueError(f"{source}: not a readable Parquet file: {e}") from e
    _check_table(table, source)
    if table.num_rows == 0:
        raise ValueError(f"{source}: no samples")
    cols = table.to_pydict()
    for name in OPTIONAL_COLUMNS - set(cols):
        cols[name] = [[] for _ in range(table.num_rows)]
    groups: dict[str, Group] = {}
    for i in range(table.num_rows):
        gid = cols["group_id"][i]
        g = groups.get(gid)
        if g is None:
            g = groups[gid] = Group(group_id=gid, prompt_index=cols["prompt_index"][i], task=cols["task"][i])
        elif g.prompt_index != cols["prompt_index"][i] or g.task != cols["task"][i]:
            raise ValueError(f"{source}: group {gid!r} rows disagree on prompt_index/task (row {i})")
        g.samples.append(
            Sample(
                group_id=gid,
                sample_index=cols["sample_index"][i],
                prompt_token_ids=cols["prompt_token_ids"][i],
                token_ids=cols["token_ids"][i],
                logprobs=cols["logprobs"][i],
                token_versions=cols["token_versions"][i],
                start_version=cols["start_version"][i],
                reward=cols["reward"][i],
                finish_reason=cols["finish_reason"][i],
                loss_mask=None if all(cols["loss_mask"][i]) else cols["loss_mask"][i],  # all ones reads as None
                turn_offsets=cols["turn_offsets"][i] or None,
                turn_rewards=cols["turn_rewards"][i] or None,
                segment_offsets=cols["segment_offsets"][i] or None,
            )
        )
    for g in groups.values():
        try:
            g.validate()
        except ValueError as e:
            raise ValueError(f"{source}: {e}") from e
    return list(groups.values())


def decode_group(data: bytes, source: str) -> Group:
    """The single group of one Parquet object; ValueError if it holds several."""
    groups = decode_groups(data, source)
    if len(groups) != 1:
        raise ValueError(f"{source}: expected exactly one group, found {len(groups)}")
    return groups[0]


def count_groups(data: bytes | None) -> int | None:
    """How many groups an object holds (distinct group ids); None when it does not read as a group object."""
    if data is None:
        return None
    try:
        table = pq.read_table(pa.BufferReader(data), columns=["group_id"])
    except (pa.ArrowException, OSError, ValueError):
        return None
    n = len(set(table.column("group_id").to_pylist()))
    return n or None


class GroupWriter:
    """Writes one writer's stream `groups/<writer_id>/<seq>.parquet`, seq = the stream index of the object's first
    group (the next object starts at seq + its groups).

    Never overwrites: every PUT is conditional. On first use it resumes after the highest object already in S3
    (a restarted writer continues its stream: `next_seq` is then the number of groups the stream holds); a lost race
    (ObjectExists) moves past the object found there and retries, except when that object holds exactly our bytes
    (our own earlier PUT).
    """

    def __init__(self, store: S3Store, paths: RunPaths, writer_id: str) -> None:
        self.store = store
        self.paths = paths
        self.writer_id = check_id("writer_id", writer_id)
        self._next_seq: int | None = None

    @property
    def next_seq(self) -> int:
        if self._next_seq is None:
            self._next_seq = self._resume_seq()
        return self._next_seq

    def _resume_seq(self) -> int:
        highest = -1
        for key in self.store.list_keys(self.paths.groups_prefix(self.writer_id)):
            parsed = self.paths.parse_group_key(key)
            if parsed is not None and parsed[0] == self.writer_id:
                highest = max(highest, parsed[1])
        if highest < 0:
            return 0
        resume = highest + self._groups_at(highest)
        log.info("group writer %s resumes at seq %d", self.writer_id, resume)
        return resume

    def _groups_at(self, seq: int, got: tuple[bytes, dict[str, str]] | None = None) -> int:
        """The number of groups of the object at `seq`: its metadata says, else its decoded rows (1 when neither
        does: logged)."""
        key = self.paths.group(self.writer_id, seq)
        got = got or self.store.get_with_metadata(key)
        n = metadata_groups(got[1]) or count_groups(got[0]) if got is not None else None
        if n is None:
            log.warning("group object %s does not decode; writer %s counts it as one group", key, self.writer_id)
            return 1
        return n

    def write(self, group: Group) -> str:
        """Write one group; return its key."""
        return self.write_many([group])

    def write_many(self, groups: list[Group]) -> str:
        """Write consecutive groups as one object; return its key."""
        data = encode_groups(groups)
        seq = self.next_seq
        for _ in range(_MAX_WRITE_ATTEMPTS):
            key = self.paths.group(self.writer_id, seq)
            try:
                self.store.put_bytes(key, data, if_absent=True, metadata={GROUPS_METADATA: str(len(groups))})
            except ObjectExists:
                there = self.store.get_with_metadata(key)
                if there is not None and there[0] == data:
                    log.debug("group object %s already holds our bytes (retried PUT)", key)
                else:
                    seq += self._groups_at(seq, there)
                    log.warning("group object %s already exists; writer %s moves on to seq %d", key, self.writer_id, seq)
                    continue
            self._next_seq = seq + len(groups)
            return key
        raise RuntimeError(f"writer {self.writer_id}: {_MAX_WRITE_ATTEMPTS} consecutive sequence numbers taken")


@dataclass(frozen=True)
class QuarantineRecord:
    """One group object moved aside: its stream position, both keys and why it did not decode."""

    writer: str
    seq: int
    key: str
    quarantine_key: str
    reason: str
    groups: int | None = None  # how many groups it held (its metadata, or where the next object starts); None: unknown yet


@dataclass(frozen=True)
class GapRecord:
    """Seqs [first_missing, resumed_at) of `writer` were skipped after waiting `waited_s` for them."""

    writer: str
    first_missing: int
    resumed_at: int
    waited_s: float


class GroupReader:
    """Reads every writer's stream in sequence order, by exact key, round-robin across writers.

    Invariants: `cursors[w]` is the next seq of writer w not yet returned, quarantined or skipped;
    a group is returned once; every object the cursor moves past without returning it is in
    `quarantined` or `gaps_skipped` (and logged). Gap checks (one listing of at most one key) run at
    most every `gap_check_interval_s` per writer, and only when that writer's cursor object is missing.
    Writers are the ones given plus those discovered: `poll` lists `groups/` on its first call and then at
    most every `rediscover_interval_s` (a late writer is picked up within that time). Not thread-safe:
    one thread polls.
    """

    def __init__(
        self,
        store: S3Store,
        paths: RunPaths,
        writers: Iterable[str] = (),
        gap_wait_s: float = 60.0,
        gap_check_interval_s: float = 5.0,
        clock: Callable[[], float] = time.monotonic,
        rediscover_interval_s: float = 5.0,
    ) -> None:
        self.store = store
        self.paths = paths
        self._cursors: dict[str, int] = {check_id("writer", w): 0 for w in writers}
        self._turn = 0
        self.gap_wait_s = gap_wait_s
        self.gap_check_interval_s = gap_check_interval_s
        self._clock = clock
        self.quarantined: list[QuarantineRecord] = []
        self.gaps_skipped: list[GapRecord] = []
        self._gap_seen: dict[str, tuple[int, float]] = {}  # writer -> (missing seq, first seen)
        self._last_gap_check: dict[str, float] = {}
        self.rediscover_interval_s = rediscover_interval_s
        self._last_discovery: float | None = None  # clock time of the last listing of groups/
        self._maybe_inside: set[str] = set()  # restored cursors that may point inside an object
        self._stuck: dict[str, int] = {}  # writer -> the seq of a quarantined object its cursor waits at

    @property
    def cursors(self) -> dict[str, int]:
        """A copy of {writer: next seq to read}; JSON-able, for checkpoints."""
        return dict(self._cursors)

    def restore(self, cursors: Mapping[str, int]) -> None:
        """Continue from saved cursors (writers not named keep their cursors)."""
        for w, seq in cursors.items():
            check_id("writer", w)
            if isinstance(seq, bool) or not isinstance(seq, int) or seq < 0:
                raise ValueError(f"cursors[{w!r}]: expected a non-negative integer, got {seq!r}")
            self._cursors[w] = seq
            self._gap_seen.pop(w, None)
            if seq > 0:
                self._maybe_inside.add(w)

    def discover_writers(self) -> list[str]:
        """Add every writer that has a folder under groups/ (cursor 0 for new ones); return all writers."""
        self._last_discovery = self._clock()
        base = self.paths.groups_prefix()
        for prefix in self.store.list_subprefixes(base):
            name = prefix[len(base) :].rstrip("/")
            try:
                check_id("writer", name)
            except ValueError:
                log.warning("ignoring unexpected folder %s", prefix)
                continue
            self._cursors.setdefault(name, 0)
        return sorted(self._cursors)

    def discovery_due(self) -> bool:
        """True before the first discovery and once `rediscover_interval_s` has passed since the last."""
        last = self._last_discovery
        return last is None or self._clock() - last >= self.rediscover_interval_s

    def _quarantine(self, writer: str, seq: int, key: str, data: bytes, reason: str, groups: int | None) -> None:
        qkey = self.paths.quarantine_group(writer, seq)
        try:
            self.store.put_bytes(qkey, data, if_absent=True)
        except ObjectExists:
            log.info("quarantine copy %s already exists (object quarantined before a restart)", qkey)
        self.quarantined.append(QuarantineRecord(writer, seq, key, qkey, reason, groups))
        log.warning("quarantined undecodable group object %s (copy at %s; skipped): %s", key, qkey, reason)

    def _containing(self, writer: str, seq: int) -> int | None:
        """The seq of the object that starts before `seq` and is the last to do so (a listing of the writer's
        objects: only after a restore), or None."""
        before = [p[1] for k in self.store.list_keys(self.paths.groups_prefix(writer))
                  if (p := self.paths.parse_group_key(k)) is not None and p[0] == writer and p[1] < seq]
        return max(before) if before else None

    def _next_existing(self, writer: str, seq: int) -> int | None:
        """The lowest seq > `seq` of `writer` that has an object, or None."""
        later = self.store.first_key_after(self.paths.groups_prefix(writer), self.paths.group(writer, seq))
        parsed = self.paths.parse_group_key(later) if later is not None else None
        return parsed[1] if parsed is not None and parsed[0] == writer and parsed[1] > seq else None

    def _after_miss(self, writer: str, seq: int) -> int | None:
        """Called when `group(writer, seq)` is missing: the seq to skip to once a gap has waited
        `gap_wait_s` (recorded and logged), else None (keep waiting, as for a stream's end)."""
        now = self._clock()
        seen = self._gap_seen.get(writer)
        if seen is not None and seen[0] != seq:
            seen = None
        if seen is None:
            if now - self._last_gap_check.get(writer, float("-inf")) < self.gap_check_interval_s:
                return None
            self._last_gap_check[writer] = now
            later = self._next_existing(writer, seq)
            if later is None:
                return None
            self._gap_seen[writer] = (seq, now)
            log.warning("gap in writer %s: %s is missing while seq %d exists; waiting up to %.0fs for it",
                        writer, self.paths.group(writer, seq), later, self.gap_wait_s)
            return None
        if now - seen[1] < self.gap_wait_s:
            return None
        later = self._next_existing(writer, seq)
        if later is None:  # the later objects vanished too: this is the stream's end again
            del self._gap_seen[writer]
            return None
        del self._gap_seen[writer]
        self.gaps_skipped.append(GapRecord(writer, seq, later, now - seen[1]))
        log.error("writer %s: seqs %d..%d never appeared within %.0fs; skipping them (groups lost)",
                  writer, seq, later - 1, now - seen[1])
        return later

    def poll(self, max_groups: int | None = None, discover: bool = True) -> list[tuple[str, int, Group]]:
        """Read the groups available now: (writer, seq, group) in round-robin order across writers.

        With `discover`, writers are discovered first when `discovery_due()`. For each writer it GETs
        `groups/<w>/<cursor>.parquet` until one is missing (one miss per writer per poll). An object that
        does not decode is quarantined and skipped, never raised; a gap is waited for, then skipped (see
        the module docstring). The groups of one object are returned with their stream indexes (writer,
        seq + i, group), i = 0, 1, ...; a restored cursor inside an object returns that object from it on.
        A StorageError (the store unreachable past its deadline) ends the poll: the groups already read
        are returned (their cursors moved), else the error propagates; either way no cursor moves past a
        group that is not returned.
        """
        if max_groups is not None and max_groups < 1:
            raise ValueError(f"max_groups: expected >= 1 or None, got {max_groups}")
        if discover and self.discovery_due():
            self.discover_writers()
        writers = sorted(self._cursors)
        if not writers:
            return []
        out: list[tuple[str, int, Group]] = []
        try:
            self._poll_into(out, writers, max_groups)
        except StorageError:
            if not out:
                raise
            # the groups already read have moved their cursors: hand them over, the error will recur
            log.warning("store error after %d group(s) of this poll; returning those first", len(out), exc_info=True)
        return out

    def _poll_into(self, out: list[tuple[str, int, Group]], writers: list[str], max_groups: int | None) -> None:
        active = set(writers)
        while active and (max_groups is None or len(out) < max_groups):
            for i in range(len(writers)):
                w = writers[(self._turn + i) % len(writers)]
                if w not in active:
                    continue
                seq = self._cursors[w]
                if self._stuck.get(w) == seq:  # past a quarantined object: its groups end where the next begins
                    later = self._next_existing(w, seq)
                    if later is None:
                        active.discard(w)
                    else:
                        del self._stuck[w]
                        self._cursors[w] = later
                        for i in range(len(self.quarantined) - 1, -1, -1):  # its record learns how many it held
                            r = self.quarantined[i]
                            if r.writer == w and r.groups is None:
                                self.quarantined[i] = dataclasses.replace(r, groups=later - r.seq)
                                break
                    continue
                start, skip = seq, 0
                key = self.paths.group(w, seq)
                got = self.store.get_with_metadata(key)
                if got is None and w in self._maybe_inside:
                    inside = self._containing(w, seq)
                    if inside is not None:
                        start, skip, key = inside, seq - inside, self.paths.group(w, inside)
                        got = self.store.get_with_metadata(key)
                self._maybe_inside.discard(w)
                if got is None:
                    skip_to = self._after_miss(w, seq)
                    if skip_to is None:
                        active.discard(w)
                    else:
                        self._cursors[w] = skip_to
                    continue
                self._gap_seen.pop(w, None)
                data, metadata = got
                try:
                    groups = decode_groups(data, key)
                except ValueError as e:
                    held = metadata_groups(metadata)
                    self._quarantine(w, start, key, data, str(e), held)
                    if held is not None and start + held > seq:
                        self._cursors[w] = start + held
                    else:  # how many it held shows where the writer's next object starts
                        self._stuck[w] = seq
                    continue
                if skip >= len(groups):  # the restored cursor is at (or past) this object's end: nothing new yet
                    if start + len(groups) != seq:
                        log.warning("writer %s: restored cursor %d is past object %s (%d groups)", w, seq, key,
                                    len(groups))
                    active.discard(w)
                    continue
                out.extend((w, start + i, g) for i, g in enumerate(groups) if i >= skip)
                self._cursors[w] = start + len(groups)
                self._turn = (writers.index(w) + 1) % len(writers)
                break
