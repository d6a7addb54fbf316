"""S3Store, EmbeddedS3 and the group streams against a real SeaweedFS server."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from asyncrl.local.seaweed import MAX_VOLUMES, EmbeddedS3, sweep_stale_socket_dirs
from asyncrl.storage.groups import GROUPS_METADATA, GroupReader, GroupWriter, encode_group
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import ObjectExists, S3Store, StorageError
from asyncrl.types import Group, Sample

pytestmark = pytest.mark.integration


def group(gid: str, reward: float = 1.0) -> Group:
    s = Sample(gid, 0, [1, 2], [3, 4], [-0.5, -0.25], [0, 1], start_version=0, reward=reward)
    return Group(gid, prompt_index=0, task="arithmetic", samples=[s])


def test_put_get_exists_delete(s3_store: S3Store) -> None:
    assert s3_store.get_bytes("a/x") is None
    assert not s3_store.exists("a/x")
    s3_store.put_bytes("a/x", b"\x00\x01payload")
    assert s3_store.get_bytes("a/x") == b"\x00\x01payload"
    assert s3_store.exists("a/x")
    s3_store.put_json("a/doc.json", {"b": [1, 2], "a": "z"})
    assert s3_store.get_json("a/doc.json") == {"a": "z", "b": [1, 2]}
    assert s3_store.get_json("a/none.json") is None
    s3_store.delete("a/x")
    assert not s3_store.exists("a/x")
    s3_store.delete("a/x")  # idempotent


def test_get_json_names_key_on_bad_json(s3_store: S3Store) -> None:
    s3_store.put_bytes("bad.json", b"{not json")
    with pytest.raises(ValueError, match=f"s3://{s3_store.bucket}/bad.json: expected a UTF-8 JSON document"):
        s3_store.get_json("bad.json")


def test_conditional_write_never_overwrites(s3_store: S3Store) -> None:
    s3_store.put_bytes("once", b"first", if_absent=True)
    with pytest.raises(ObjectExists, match="once already exists"):
        s3_store.put_bytes("once", b"second", if_absent=True)
    with pytest.raises(ObjectExists):
        s3_store.put_json("once", {"x": 1}, if_absent=True)
    assert s3_store.get_bytes("once") == b"first"
    s3_store.put_bytes("once", b"third")  # an unconditional write does replace
    assert s3_store.get_bytes("once") == b"third"


def test_list_keys_paginates_and_sorts(s3_store: S3Store) -> None:
    # keys whose characters sort before '/' ('!', '-', '.') are listed out of S3 order by SeaweedFS
    names = [f"p/{i:04d}" for i in range(1005)] + ["p/a!/1", "p/a-", "p/a.b/1", "p/a/1", "p/a/2", "p/a0"]
    for name in names:
        s3_store.put_bytes(name, b"")
    s3_store.put_bytes("q/outside", b"")
    assert s3_store.list_keys("p/") == sorted(names)
    assert s3_store.list_keys("p/", page_size=7) == sorted(names)
    assert s3_store.list_keys("p/a", page_size=2) == ["p/a!/1", "p/a-", "p/a.b/1", "p/a/1", "p/a/2", "p/a0"]
    assert s3_store.list_keys("nothing/") == []
    assert s3_store.list_subprefixes("p/") == ["p/a!/", "p/a.b/", "p/a/"]


def test_errors_name_the_key(s3_server: EmbeddedS3) -> None:
    store = S3Store(s3_server.endpoint_url, "no-such-bucket-xyz", timeout_s=5.0)
    with pytest.raises(StorageError, match="s3://no-such-bucket-xyz/k"):
        store.put_bytes("k", b"1")
    dead = S3Store("http://127.0.0.1:9", "bucket", timeout_s=2.0, max_attempts=1)
    with pytest.raises(StorageError, match="s3://bucket/some/key"):
        dead.get_bytes("some/key")


def test_volume_slots_do_not_depend_on_the_free_disk(s3_server: EmbeddedS3) -> None:
    """Every bucket takes a volume of its own; derived from the free disk the slots were 69 here, and the 69th bucket's
    PUTs failed with HTTP 500 for the whole retry deadline."""
    with urllib.request.urlopen(f"http://127.0.0.1:{s3_server.ports['master']}/dir/status", timeout=10) as answer:
        topology = json.load(answer)["Topology"]
    assert topology["Max"] == MAX_VOLUMES


def test_credentials_are_enforced(s3_server: EmbeddedS3, s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> None:
    s3_store.put_bytes("secret-obj", b"1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3_server.secret_key)
    intruder = S3Store(s3_server.endpoint_url, s3_store.bucket, max_attempts=1)
    with pytest.raises(StorageError, match="secret-obj"):
        intruder.get_bytes("secret-obj")
    assert s3_server.secret_key not in repr(s3_server)
    assert s3_server.env()["AWS_SECRET_ACCESS_KEY"] == s3_server.secret_key


def test_data_survives_sigterm_and_kill9(tmp_path: Path) -> None:
    data = tmp_path / "data"
    keys = {"AWS_ACCESS_KEY_ID": os.environ["AWS_ACCESS_KEY_ID"], "AWS_SECRET_ACCESS_KEY": os.environ["AWS_SECRET_ACCESS_KEY"]}
    server = EmbeddedS3(data, keys["AWS_ACCESS_KEY_ID"], keys["AWS_SECRET_ACCESS_KEY"])
    try:
        store = S3Store(server.start(), "persist")
        store.ensure_bucket()
        store.put_bytes("a", b"before-term")
        pid = server.pid
        t0 = time.monotonic()
        server.stop()
        assert time.monotonic() - t0 < 8.0
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert (tmp_path / "weed.log").stat().st_size > 0

        store = S3Store(server.start(), "persist")  # new ports, same folder
        assert store.get_bytes("a") == b"before-term"
        store.put_bytes("b", b"before-kill")
        server.kill()  # SIGKILL: no clean shutdown

        store = S3Store(server.start(), "persist")
        assert store.get_bytes("b") == b"before-kill"
        assert store.list_keys("") == ["a", "b"]
        with pytest.raises(ObjectExists):
            store.put_bytes("a", b"x", if_absent=True)
    finally:
        server.stop()


def test_failed_start_leaves_no_process(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("a file where the data folder should be")
    server = EmbeddedS3(blocker / "data")
    with pytest.raises((OSError, RuntimeError, TimeoutError)):
        server.start(timeout_s=10)
    assert server.pid is None
    # a server that cannot become ready in time is killed, not left behind
    server = EmbeddedS3(tmp_path / "slow")
    with pytest.raises(TimeoutError, match="not ready"):
        server.start(timeout_s=0.01)
    assert not server.running()


def test_group_streams_two_writers_and_resume(s3_store: S3Store) -> None:
    paths = RunPaths("runs", "r1")
    wa, wb = GroupWriter(s3_store, paths, "envA"), GroupWriter(s3_store, paths, "envB")
    assert [wa.write(group(f"a{i}")) for i in range(3)] == [paths.group("envA", i) for i in range(3)]
    assert wb.write(group("b0")) == paths.group("envB", 0)

    reader = GroupReader(s3_store, paths)
    got = reader.poll()
    assert [(w, s, g.group_id) for w, s, g in got] == [
        ("envA", 0, "a0"), ("envB", 0, "b0"), ("envA", 1, "a1"), ("envA", 2, "a2")
    ]
    assert reader.cursors == {"envA": 3, "envB": 1}
    assert reader.poll() == []

    # a restarted writer continues after its highest object, never overwriting
    wa2 = GroupWriter(s3_store, paths, "envA")
    assert wa2.write(group("a3")) == paths.group("envA", 3)
    # a stale writer object (its seq behind) moves past existing objects instead of overwriting
    assert wa.next_seq == 3
    assert wa.write(group("a4")) == paths.group("envA", 4)
    assert [g.group_id for _, _, g in reader.poll(max_groups=1)] == ["a3"]

    # a new reader restored from saved cursors resumes exactly there
    r2 = GroupReader(s3_store, paths)
    r2.restore({"envA": 4, "envB": 1})
    wb.write(group("b1"))
    assert [(w, s) for w, s, _ in r2.poll()] == [("envA", 4), ("envB", 1)]


def test_reader_quarantines_corrupt_group_naming_key(s3_store: S3Store) -> None:
    paths = RunPaths("runs", "r2")
    s3_store.put_bytes(paths.group("env0", 0), encode_group(group("ok")))
    s3_store.put_bytes(paths.group("env0", 1), b"garbage")
    reader = GroupReader(s3_store, paths, writers=["env0"])
    assert [g.group_id for _, _, g in reader.poll()] == ["ok"]  # a malformed object never raises out of poll
    [rec] = reader.quarantined
    assert rec.key.endswith("groups/env0/000000000001.parquet") and "not a readable Parquet" in rec.reason
    assert s3_store.get_bytes(paths.quarantine_group("env0", 1)) == b"garbage"
    # without its metadata (how many groups it held) the cursor waits at it until the writer's next object
    assert reader.cursors == {"env0": 1} and rec.groups is None
    s3_store.put_bytes(paths.group("env0", 2), encode_group(group("next")), metadata={GROUPS_METADATA: "1"})
    assert [g.group_id for _, _, g in reader.poll()] == ["next"]
    assert reader.cursors == {"env0": 3} and reader.quarantined[0].groups == 1
    # with its metadata it is skipped at once, by as many groups as it held
    s3_store.put_bytes(paths.group("env0", 3), b"garbage too", metadata={GROUPS_METADATA: "4"})
    assert reader.poll() == []
    assert reader.cursors == {"env0": 7} and reader.quarantined[1].groups == 4


def test_sigterm_stops_server_quickly(tmp_path: Path) -> None:
    server = EmbeddedS3(tmp_path / "d")
    server.start()
    pid = server.pid
    assert pid is not None
    os.kill(pid, signal.SIGTERM)
    t0 = time.monotonic()
    while server.running() and time.monotonic() - t0 < 10:
        time.sleep(0.05)
    assert not server.running()
    assert time.monotonic() - t0 < 5.0
    server.stop()


def test_server_dies_with_its_parent(tmp_path: Path) -> None:
    code = (
        "import sys, time; from asyncrl.local.seaweed import EmbeddedS3, sweep_stale_socket_dirs\n"
        "s = EmbeddedS3(sys.argv[1]); s.start(); print(s.pid, s._sock_dir, flush=True); time.sleep(120)\n"
    )
    parent = subprocess.Popen([sys.executable, "-c", code, str(tmp_path / "d")], stdout=subprocess.PIPE, text=True)
    try:
        assert parent.stdout is not None
        pid_text, sock_dir = parent.stdout.readline().split()
        weed_pid = int(pid_text)
        os.kill(weed_pid, 0)  # alive
        parent.kill()  # SIGKILL: no cleanup code runs in the parent
        parent.wait(timeout=10)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                os.kill(weed_pid, 0)
            except ProcessLookupError:
                break
            time.sleep(0.1)
        else:
            os.kill(weed_pid, signal.SIGKILL)
            pytest.fail("weed outlived its parent")
        # the next server start (or an explicit sweep) removes the dead server's socket folder
        assert Path(sock_dir).is_dir()
        sweep_stale_socket_dirs()
        assert not Path(sock_dir).exists()
    finally:
        if parent.poll() is None:
            parent.kill()
            parent.wait()
