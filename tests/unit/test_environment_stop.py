"""The environment role's stop ends within a few seconds whatever is in flight (asyncrl/roles/environment.py
`run_role`, asyncrl/roles/bounded_stop.py): the real role (run_until_over, run_environment, RolloutDriver,
SingleTurnKind) against stand-in servers and an in-memory S3, stopped while its generation requests are in flight,
and:
- each request drops the first cancellation (its answer arrives with it, which Python 3.11's `asyncio.wait_for`
  lets through) and goes on to score the sample on a reward role that never answers (it is stopping too);
- or its stats upload does not return (an S3 call in a thread, retried until its own deadline);
- or both;
- or a periodic evaluation is in flight and drops the first cancellation too."""

from __future__ import annotations

import asyncio
import gc
import signal
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import RunConfig
from asyncrl.generation.client import Generated
from asyncrl.models.tokenizer import build_tokenizer
from asyncrl.roles import environment
from asyncrl.roles.context import RoleContext
from asyncrl.roles.periodic_eval import PeriodicEval
from asyncrl.roles.stop_signal import StopSignal
from asyncrl.storage.retry import StoreStats
from asyncrl.storage.run_layout import RunPaths

GRACE_S = 30.0  # the pod's grace period: SIGKILL after it
STOP_WITHIN_S = 12.0  # what this test allows the stop (its waits have deadlines of a few seconds)


class Store:
    """The S3 calls the role makes, in memory; with `blocks`, every stats upload after the first waits for
    `release` (`uploading` says one does)."""

    def __init__(self, paths: RunPaths, release: threading.Event, blocks: bool) -> None:
        self.stats_key, self.blocks = paths.rollout_stats("env0"), blocks
        self.json: dict[str, Any] = {}
        self.stats = StoreStats()
        self.release, self.uploading = release, threading.Event()

    def exists(self, key: str) -> bool:
        return key in self.json

    def get_json(self, key: str) -> Any:
        return self.json.get(key)

    def list_keys(self, prefix: str) -> list[str]:
        return sorted(k for k in self.json if k.startswith(prefix))

    def put_json(self, key: str, obj: Any, **_: Any) -> None:
        if key == self.stats_key and key in self.json:
            self.uploading.set()
            if self.blocks:
                self.release.wait()
        self.json[key] = obj


IN_FLIGHT: list[str] = []  # the generation requests the role sent


class Server:
    batch_calls = requests = 0
    drops_cancel = True

    async def generate(self, request_id: str, prompt_token_ids: list[int], **_: Any) -> Generated:
        IN_FLIGHT.append(request_id)
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            if not self.drops_cancel:
                raise
            # the answer came with the cancellation: returned, the cancellation dropped
        return Generated(prompt_token_ids[-1:], [-0.5], [0], "stop", 0)

    async def abort(self, request_id: str) -> bool:
        return False

    async def health(self, timeout_s: float | None = None) -> dict[str, Any]:
        return {}

    async def wait_version(self, after: int, wait_s: float) -> int:
        await asyncio.sleep(wait_s)
        return after


class Servers(list):  # GenerationServers' interface
    def __init__(self, ctx: RoleContext, client: Any, docs: list[dict[str, Any]], timeout_s: float) -> None:
        super().__init__(Server() for _ in docs)

    async def returned(self, down: list[int], min_version: int) -> list[int]:
        return []


class Reward:  # RewardClient's interface: a reward role that is stopping too never answers
    retries = calls = items = 0

    def __init__(self, *_: Any, **__: Any) -> None:
        pass

    async def score(self, *_: Any) -> tuple[float, dict[str, Any]]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


class Signals(StopSignal):
    """What SIGTERM does to the role (`StopSignal.on_loop`), sent from the test's thread: a handler can only be
    installed in the main thread."""

    def __init__(self) -> None:
        super().__init__()
        self.ready = threading.Event()

    def on_loop(self, loop: asyncio.AbstractEventLoop, stop: asyncio.Event) -> None:
        self.loop, self.stop = loop, stop
        self.ready.set()

    def send(self) -> None:
        self.loop.call_soon_threadsafe(lambda: self.note(signal.SIGTERM) and self.stop.set())


async def published(store: Any, paths: RunPaths, role: str, count: int, timeout_s: float) -> list[dict[str, Any]]:
    return [{"host": "127.0.0.1", "port": 9, "id": str(i)} for i in range(count)]


async def evaluate_once(self: PeriodicEval) -> dict[str, Any]:
    """The warm start's evaluation answers; the next one is in flight at the stop and drops a cancellation."""
    if self.points:
        IN_FLIGHT.append("eval")
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            await asyncio.Event().wait()
    return {"accuracy": 1.0, "correct": 1, "n": 1, "versions": [0]}


IN_FLIGHT_AT_THE_STOP = {  # (requests drop the cancellation, the stats upload blocks, an evaluation runs)
    "requests that drop the cancellation": (True, False, False), "an upload that does not return": (False, True, False),
    "both": (True, True, False), "an evaluation that drops the cancellation": (False, False, True)}


@pytest.fixture(params=list(IN_FLIGHT_AT_THE_STOP))
def role(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Any:
    drops, blocks, evaluates = IN_FLIGHT_AT_THE_STOP[request.param]
    IN_FLIGHT.clear()
    monkeypatch.setattr(Server, "drops_cancel", drops)
    monkeypatch.setattr(environment, "wait_for_rendezvous_async", published)
    monkeypatch.setattr(environment, "GenerationServers", Servers)
    monkeypatch.setattr(environment, "RewardClient", Reward)
    monkeypatch.setattr(PeriodicEval, "evaluate_once", evaluate_once)
    build_tokenizer(tmp_path / "model")
    cfg = RunConfig()
    cfg.eval.every_steps = 1 if evaluates else 0
    cfg.rollout.stats_interval_s = 0.05
    paths, release = RunPaths("prefix", "run"), threading.Event()
    store = Store(paths, release, blocks)
    ctx = RoleContext("environment", "env0", "s3://bucket/prefix/run", store, paths, cfg)  # type: ignore[arg-type]
    monkeypatch.setattr(ctx, "model_folder", lambda: tmp_path / "model")
    if evaluates:  # the trainer is past the warm start: the next point is due
        store.json[paths.versions_latest()] = {"version": 1, "trained": {}, "consumed": {}}
    thresholds = gc.get_threshold()
    yield ctx, store, evaluates
    release.set()  # the blocked upload ends, so no thread outlives the test session
    gc.unfreeze()  # the role froze the start-up's objects and made collections rarer: undone for the next tests
    gc.set_threshold(*thresholds)


def test_the_role_exits_within_seconds_of_sigterm_whatever_is_in_flight(role: Any) -> None:
    ctx, store, evaluates = role
    signals, out = Signals(), []

    def run() -> None:
        try:
            out.append(environment.run_role(ctx, signals))
        except BaseException as err:  # noqa: BLE001 - shown by the assertion below
            out.append(err)

    thread = threading.Thread(target=run, name="environment-role", daemon=True)  # a hang must not hold pytest
    thread.start()
    deadline = time.monotonic() + 60
    def in_flight() -> bool:
        return store.uploading.is_set() and bool(IN_FLIGHT) and (not evaluates or "eval" in IN_FLIGHT)

    while not in_flight() and time.monotonic() < deadline:
        time.sleep(0.02)
    assert in_flight(), f"the role never had its requests, upload and evaluation in flight: {out}"
    signals.send()
    t0 = time.monotonic()
    thread.join(STOP_WITHIN_S)
    took = time.monotonic() - t0
    assert not thread.is_alive(), f"the role still runs {took:.0f} s after SIGTERM (SIGKILL at {GRACE_S:.0f} s)"
    assert out == [None] and signals.signum == signal.SIGTERM
