"""The environment role's structure: the `RolloutDriver` with a stand-in sample kind (decision order, admission,
group writing, stats), and the import graph (no circle between the role's modules; `asyncrl.rollout` stays pure)."""

from __future__ import annotations

import ast
import asyncio
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asyncrl.config import RunConfig
from asyncrl.roles.context import RoleContext
from asyncrl.roles.rollout_driver import RolloutDriver
from asyncrl.rollout.scheduler import Abort, DropGroup, DropSample, EmitGroup, Start
from asyncrl.storage.retry import StoreStats
from asyncrl.storage.run_layout import RunPaths
from asyncrl.types import Group, Sample

ROOT = Path(__file__).resolve().parents[2]


class MemoryStore:
    """The S3Store calls the driver makes, in memory."""

    def __init__(self) -> None:
        self.objects: dict[str, bytes] = {}
        self.metadata: dict[str, dict[str, str]] = {}
        self.json: dict[str, Any] = {}
        self.stats = StoreStats()  # the real counters; these fakes count nothing

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.objects if k.startswith(prefix))

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False, metadata: Any = None) -> None:
        assert not (if_absent and key in self.objects)
        self.objects[key] = data
        self.metadata[key] = dict(metadata or {})

    def get_with_metadata(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        return (self.objects[key], self.metadata[key]) if key in self.objects else None

    def get_json(self, key: str) -> Any:
        return self.json.get(key)

    def put_json(self, key: str, obj: Any) -> None:
        self.json[key] = obj


class FakeServer:
    batch_calls = 0
    requests = 0

    def __init__(self, log: list[str]) -> None:
        self.log = log

    async def abort(self, request_id: str) -> None:
        self.log.append(f"abort {request_id}")

    async def health(self) -> dict[str, Any]:
        return {}


class FakeServers(list):
    async def returned(self, down: list[int], min_version: int) -> list[int]:
        return []


@dataclass
class Record:
    prompt_index: int
    prompt_tokens: int


class RecordingKind:
    """A sample kind that records what the driver asks of it."""

    skipped_long_prompts = 3

    def __init__(self, driver: RolloutDriver, log: list[str], local_first: bool) -> None:
        self.driver, self.log, self.local_decisions_first = driver, log, local_first
        self.records: dict[str, Record] = {}
        self.seqs: list[int] = []
        self.closed = False

    def next_group(self, seq: int) -> Record:
        self.seqs.append(seq)
        return Record(100 + seq, 5)

    def admitted(self, group_id: str, record: Record) -> None:
        self.records[group_id] = record

    def start(self, d: Start) -> asyncio.Task | None:
        self.log.append(f"start {d.request_id}")
        return None

    def drop_group(self, d: DropGroup) -> None:
        self.log.append(f"drop group {d.group_id}")

    def drop_sample(self, d: DropSample) -> None:
        self.log.append(f"drop sample {d.group_id}/{d.sample_index}")

    def group_for_emit(self, d: EmitGroup) -> Group:
        self.log.append(f"emit {d.group_id}")
        return make_group(d.group_id, d.prompt_index)

    def extra_metrics(self) -> dict[str, float]:
        return {"kind/metric": 1.0}

    def extra_stats(self) -> dict[str, Any]:
        return {"kind_doc": [1]}

    async def close(self) -> None:
        self.closed = True


def make_group(gid: str, prompt_index: int) -> Group:
    sample = Sample(group_id=gid, sample_index=0, prompt_token_ids=[1, 2], token_ids=[3, 4], logprobs=[-0.5, -0.25],
                    token_versions=[0, 0], start_version=0, reward=1.0, finish_reason="stop")
    return Group(gid, prompt_index, "arithmetic", [sample])


def make_driver(local_first: bool = False, store: MemoryStore | None = None
                ) -> tuple[RolloutDriver, list[str], MemoryStore]:
    log: list[str] = []
    store = store or MemoryStore()
    cfg = RunConfig()
    paths = RunPaths("prefix", "run")
    ctx = RoleContext("environment", "env0", "s3://bucket/prefix/run", store, paths, cfg)  # type: ignore[arg-type]
    gens = FakeServers(FakeServer(log) for _ in range(cfg.generation.num_servers))

    class Reward:
        retries = calls = items = 0

    driver = RolloutDriver(ctx, gens, Reward(), lambda d: RecordingKind(d, log, local_first))  # type: ignore[arg-type]
    return driver, log, store


BATCH = [Abort("g0", 0, 0, "g0-0-0", "stale"), Start("g1", 1, 0, 0, 0), EmitGroup("g2", 2, 0, (0,)),
         DropGroup("g3", "stale"), DropSample("g4", 1, "done")]


def test_decisions_are_performed_in_order_by_default() -> None:
    driver, log, _ = make_driver(local_first=False)
    asyncio.run(driver.apply(BATCH))
    assert log == ["abort g0-0-0", "start g1-0-0", "emit g2", "drop group g3", "drop sample g4/1"]


def test_a_kind_can_have_local_decisions_applied_before_the_awaited_ones() -> None:
    driver, log, _ = make_driver(local_first=True)
    asyncio.run(driver.apply(BATCH))
    assert log == ["start g1-0-0", "drop group g3", "drop sample g4/1", "abort g0-0-0", "emit g2"]


def test_admission_offers_the_kinds_groups_until_the_scheduler_stops_admitting() -> None:
    driver, _, _ = make_driver()
    decisions = driver.admit()
    starts = [d for d in decisions if isinstance(d, Start)]
    kind = driver.kind
    assert isinstance(kind, RecordingKind)
    assert set(kind.records) == {d.group_id for d in starts} and len(kind.records) == driver.sched.stats.admitted
    assert kind.seqs == list(range(len(kind.records)))
    assert {d.prompt_index for d in starts} == {r.prompt_index for r in kind.records.values()}
    assert not driver.sched.can_admit()


def test_groups_emitted_together_share_one_object() -> None:
    driver, _, store = make_driver()

    async def emit_three() -> None:
        await driver.apply([EmitGroup(f"g{i}", i, 0, (0,)) for i in range(2)])  # one after the other
        await asyncio.gather(driver.write_group(make_group("a", 7)), driver.write_group(make_group("b", 8)))

    asyncio.run(emit_three())
    assert driver.written == 4 and driver.objects_written == 3 and len(store.objects) == 3


def test_stats_carry_the_kinds_metrics_and_documents() -> None:
    driver, _, store = make_driver()
    metrics = asyncio.run(driver.publish_stats())
    assert metrics["rollout/skipped_long_prompts"] == 3 and metrics["kind/metric"] == 1.0
    assert list(metrics)[-2:] == ["rollout/replaced_samples", "kind/metric"]
    (doc,) = store.json.values()
    assert doc["writer"] == "env0" and doc["kind_doc"] == [1] and doc["metrics"] == metrics


def test_a_restarted_writer_counts_its_written_groups_and_the_ones_lost_at_the_stop() -> None:
    first, _, store = make_driver()
    asyncio.run(first.apply([EmitGroup(f"g{i}", i, 0, (0,)) for i in range(2)]))
    store.put_json(first.ctx.paths.rollout_stats("env0"),
                   {"metrics": {"rollout/live_groups": 5, "rollout/lost_at_restart_groups": 1}})
    again, _, _ = make_driver(store=store)
    assert again.written_before == 2 and again.sched.stats.admitted == again.sched.stats.emitted == 2
    assert again.lost_at_restart == 6
    assert again.kind.seqs == [] and again.admit() and again.kind.seqs[0] == 2  # type: ignore[attr-defined]


def test_shutdown_closes_the_kind() -> None:
    driver, _, _ = make_driver()
    asyncio.run(driver.shutdown())
    assert driver.kind.closed  # type: ignore[attr-defined]


def imports(path: Path) -> set[str]:
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text())):  # every import, at any depth (a lazy one too)
        if isinstance(node, ast.Import):
            found |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.add(node.module)
    return found


def test_the_environment_roles_modules_import_each_other_one_way() -> None:
    roles = ROOT / "asyncrl" / "roles"
    assert not imports(roles / "rollout_driver.py") & {"asyncrl.roles.environment", "asyncrl.roles.single_turn",
                                                        "asyncrl.roles.agentic"}
    for kind in ("single_turn.py", "agentic.py"):
        assert not imports(roles / kind) & {"asyncrl.roles.environment", "asyncrl.roles.single_turn",
                                            "asyncrl.roles.agentic"}


def test_the_rollout_package_is_pure() -> None:
    io = ("httpx", "asyncio", "boto3", "botocore", "socket", "asyncrl.storage", "asyncrl.rpc", "asyncrl.weights", "asyncrl.roles", "asyncrl.envs",
          "asyncrl.generation", "asyncrl.evaluation")
    for path in sorted((ROOT / "asyncrl" / "rollout").glob("*.py")):
        bad = [m for m in imports(path) if m.startswith(io)]
        assert not bad, f"{path.name} imports {bad}"


def test_a_server_reporting_a_new_version_makes_the_writer_read_latest_json_at_once() -> None:
    """The version watch is a hint: it wakes the main loop and shortens the poll of latest.json while the file lags
    behind the servers, but the scheduler's version still comes from latest.json alone."""
    from asyncrl.roles import rollout_driver

    driver, _, store = make_driver()
    asked: list[int] = []
    release = asyncio.Event()

    async def wait_version(after: int, wait_s: float) -> int:
        asked.append(after)
        if len(asked) > 1:
            await release.wait()
        return 3

    driver.gens[0].wait_version = wait_version  # type: ignore[attr-defined]

    async def scenario() -> None:
        watch = asyncio.create_task(driver.watch_versions())
        await asyncio.wait_for(driver._task_ended.wait(), 5)
        assert driver.version_hint == 3 and driver.sched.version == 0
        assert driver.hinted(rollout_driver.time.monotonic())
        await driver.follow_trainer()  # latest.json not written yet: nothing changes
        assert driver.sched.version == 0
        store.json[driver.ctx.paths.versions_latest()] = {"version": 3, "consumed": {}, "trained": {}}
        await driver.follow_trainer()
        assert driver.sched.version == 3 and not driver.hinted(rollout_driver.time.monotonic())
        assert asked == [0, 3]  # the next long poll waits for a version above the one seen
        watch.cancel()
        await asyncio.gather(watch, return_exceptions=True)

    asyncio.run(scenario())


def test_the_hint_expires_when_latest_json_never_shows_it() -> None:
    driver, _, _ = make_driver()
    driver.version_hint, driver._hint_until = 5, 100.0
    assert driver.hinted(99.0) and not driver.hinted(100.0)


def test_latest_json_is_read_slowly_only_while_the_version_watch_is_healthy() -> None:
    """The trainer publishes latest.json after each push, so while a server's long poll answers and that server is
    not behind the file, the periodic read is only a safety net (`WATCHED_POLL_S`); without a watch, after its
    error, or with its server behind the file (left out of the weight group), every `POLL_S`."""
    from asyncrl.roles import rollout_driver as rd
    from asyncrl.rpc.http import RemoteError

    driver, _, store = make_driver()
    answers: list[int | Exception] = [2, RemoteError("gone", lost=True)]
    opened = asyncio.Event()

    async def wait_version(after: int, wait_s: float) -> int:
        if not answers:
            opened.set()
            await asyncio.Event().wait()  # a long poll that has not answered yet
        answer = answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer

    driver.gens[0].wait_version = wait_version  # type: ignore[attr-defined]
    now = rd.time.monotonic
    assert driver.follow_interval(now()) == rd.POLL_S  # no watch yet

    async def scenario() -> None:
        real_sleep = asyncio.sleep
        rd.asyncio.sleep = lambda s: real_sleep(0)  # type: ignore[assignment]  (the watch's 1 s pause after an error)
        try:
            watch = asyncio.create_task(driver.watch_versions())
            await asyncio.wait_for(driver._task_ended.wait(), 5)  # the watch reported version 2: a hint
            assert driver.follow_interval(now()) == rd.HINT_POLL_S
            store.json[driver.ctx.paths.versions_latest()] = {"version": 2, "consumed": {}, "trained": {}}
            await driver.follow_trainer()
            await asyncio.wait_for(opened.wait(), 5)  # after an error, the next long poll is open and answering
            assert driver._watch_seen == -1 and driver.follow_interval(now()) == rd.POLL_S  # answered nothing yet
            driver._watch_seen = 2  # as if that poll had answered with the file's version
            assert driver.follow_interval(now()) == rd.WATCHED_POLL_S
            store.json[driver.ctx.paths.versions_latest()] = {"version": 3, "consumed": {}, "trained": {}}
            await driver.follow_trainer()  # the file moved past the watched server: it is behind
            assert driver.follow_interval(now()) == rd.POLL_S
            driver._watch_seen = 3
            assert driver.follow_interval(now()) == rd.WATCHED_POLL_S
            assert driver.follow_interval(now() + rd.VERSION_WAIT_S + 6) == rd.POLL_S  # a poll that never answers
            assert not watch.done()
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        finally:
            rd.asyncio.sleep = real_sleep  # type: ignore[assignment]

    asyncio.run(scenario())


def test_latest_json_is_read_every_poll_s_while_no_server_is_live_to_watch() -> None:
    """A poll that answered before every server was marked down does not keep the slow reading: with nothing to
    watch, the file is read every `POLL_S`."""
    from asyncrl.roles import rollout_driver as rd

    driver, _, _ = make_driver()
    paused = asyncio.Event()

    async def wait_version(after: int, wait_s: float) -> int:
        driver.sched._down.update(range(len(driver.gens)))  # every server lost while this poll was open
        return driver.sched.version

    async def pause(s: float) -> None:
        paused.set()
        await asyncio.Event().wait()

    driver.gens[0].wait_version = wait_version  # type: ignore[attr-defined]

    async def scenario() -> None:
        real_sleep = asyncio.sleep
        rd.asyncio.sleep = pause  # type: ignore[assignment]
        try:
            watch = asyncio.create_task(driver.watch_versions())
            await asyncio.wait_for(paused.wait(), 5)
            assert driver._watch_seen == driver.sched.version  # the poll answered, its server not behind the file
            assert driver.follow_interval(rd.time.monotonic()) == rd.POLL_S
            watch.cancel()
            await asyncio.gather(watch, return_exceptions=True)
        finally:
            rd.asyncio.sleep = real_sleep  # type: ignore[assignment]

    asyncio.run(scenario())
