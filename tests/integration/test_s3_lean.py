"""The lean signed-HTTP path of S3Store's GET and PUT (asyncrl.storage.s3_lean) against a real SeaweedFS server:
it reads and writes exactly what boto3 does, maps errors the same way, and survives a dropped kept-alive
connection without spending a retry."""

from __future__ import annotations

import socket

import pytest

from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.s3 import ObjectExists, S3Store, StorageError, lean_client
from asyncrl.storage.s3_lean import LeanObjectClient

pytestmark = pytest.mark.integration

KEYS = ["plain/key.bin", "with space/and+plus=eq&amp", "unicode/é ü 字", "tilde~/(paren)/!star*'"]


@pytest.fixture()
def boto_only(s3_store: S3Store, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    monkeypatch.setenv("ASYNCRL_S3_BOTO_ONLY", "1")
    store = S3Store(s3_store.endpoint_url, s3_store.bucket, timeout_s=15.0)
    assert store._lean is None
    return store


def test_the_lean_path_is_used_with_an_endpoint_and_credentials(s3_store: S3Store) -> None:
    assert isinstance(s3_store._lean, LeanObjectClient)


@pytest.mark.parametrize("key", KEYS)
def test_lean_and_boto3_read_each_others_objects_exactly(s3_store: S3Store, boto_only: S3Store, key: str) -> None:
    payload = bytes(range(256)) * 40
    s3_store.put_bytes(key, payload, metadata={"asyncrl-groups": "3", "note": "x"})
    assert boto_only.get_with_metadata(key) == (payload, {"asyncrl-groups": "3", "note": "x"})
    assert s3_store.get_with_metadata(key) == (payload, {"asyncrl-groups": "3", "note": "x"})
    boto_only.put_bytes(key + ".b", b"", metadata={"k": "v"})
    assert s3_store.get_with_metadata(key + ".b") == (b"", {"k": "v"})
    assert s3_store.list_keys(key) == sorted([key, key + ".b"])


def test_conditional_put_and_missing_objects(s3_store: S3Store) -> None:
    before, total = dict(s3_store.stats.requests), s3_store.stats.requests_total()
    assert s3_store.get_with_metadata("absent") is None
    s3_store.put_bytes("once", b"a", if_absent=True)
    with pytest.raises(ObjectExists):
        s3_store.put_bytes("once", b"b", if_absent=True)
    assert s3_store.get_bytes("once") == b"a"
    assert s3_store.stats.retries == 0
    # every request counted by kind: two GETs (one found nothing), two PUTs (the refused one too)
    grew = {k: n - before.get(k, 0) for k, n in s3_store.stats.requests.items() if n != before.get(k, 0)}
    assert grew == {"get": 2, "get_missing": 1, "put": 2}
    assert s3_store.stats.requests_total() == total + 4


def test_lean_and_boto3_agree_on_what_exists(s3_store: S3Store, boto_only: S3Store) -> None:
    for key in KEYS:
        s3_store.put_bytes(key, b"x")
    for key in [*KEYS, "absent", "plain/key.bin.not"]:
        assert s3_store.exists(key) == boto_only.exists(key) == (key in KEYS), key
    assert s3_store.stats.requests.get("head") == len(KEYS) + 2  # the lean HEADs counted like any request


def test_wrong_credentials_fail_at_once_with_the_key(s3_server: EmbeddedS3, s3_store: S3Store,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    s3_store.put_bytes("guarded", b"1")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "wrong-" + s3_server.secret_key)
    intruder = S3Store(s3_server.endpoint_url, s3_store.bucket, retry_deadline_s=30.0)
    assert intruder._lean is not None
    for call in (lambda: intruder.get_bytes("guarded"), lambda: intruder.put_bytes("guarded", b"2"),
                 lambda: intruder.exists("guarded")):
        with pytest.raises(StorageError, match=f"s3://{s3_store.bucket}/guarded"):
            call()
    assert intruder.stats.retries == 0  # a 403 is not transient
    assert s3_store.get_bytes("guarded") == b"1"


def test_a_connection_the_server_dropped_is_replaced_without_a_retry(s3_store: S3Store) -> None:
    s3_store.put_bytes("k", b"v")
    assert s3_store.get_bytes("k") == b"v"
    lean = s3_store._lean
    assert lean is not None
    conn = lean._local.conn
    conn.sock.shutdown(socket.SHUT_RDWR)  # as a server closing an idle kept-alive connection
    assert s3_store.get_bytes("k") == b"v"
    assert lean._local.conn is not conn and s3_store.stats.retries == 0
    lean._local.conn.sock.shutdown(socket.SHUT_RDWR)
    s3_store.put_bytes("k2", b"w")  # a PUT is not re-sent inside the call: the store's retry sends it again
    assert s3_store.get_bytes("k2") == b"w" and s3_store.stats.retries == 1


def test_a_dead_endpoint_is_a_storage_error_naming_the_key() -> None:
    dead = S3Store("http://127.0.0.1:9", "bucket", timeout_s=2.0, max_attempts=2, retry_base_s=0.01, retry_cap_s=0.01)
    with pytest.raises(StorageError, match="s3://bucket/some/key"):
        dead.get_bytes("some/key")
    assert dead.stats.retries == 1


def test_boto3_is_kept_where_the_lean_path_would_differ(monkeypatch: pytest.MonkeyPatch) -> None:
    from botocore.credentials import Credentials

    creds = Credentials("AK", "SK")
    assert lean_client("http://127.0.0.1:1", "b", "us-east-1", creds, 5.0) is not None
    assert lean_client("", "b", "us-east-1", creds, 5.0) is None  # AWS's own endpoint resolution
    assert lean_client("http://127.0.0.1:1", "b", "us-east-1", None, 5.0) is None
    monkeypatch.setenv("HTTPS_PROXY", "http://proxy:3128")
    assert lean_client("http://127.0.0.1:1", "b", "us-east-1", creds, 5.0) is None
    with pytest.raises(ValueError, match="endpoint_url"):
        LeanObjectClient("ftp://x", "b", "us-east-1", creds, 5.0)
