"""Shared pytest fixtures: one embedded S3 server per test session, a fresh bucket per test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator

import pytest

from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.s3 import S3Store
from tests.helpers.env_vars import restored_env
from tests.helpers.s3_buckets import drop_bucket


@pytest.fixture(scope="session")
def s3_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[EmbeddedS3]:
    """A real SeaweedFS server on loopback; its credentials are exported to os.environ for boto3."""
    server = EmbeddedS3(tmp_path_factory.mktemp("s3") / "data")
    server.start(timeout_s=90)
    with restored_env(("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY")):
        os.environ["AWS_ACCESS_KEY_ID"] = server.access_key
        os.environ["AWS_SECRET_ACCESS_KEY"] = server.secret_key
        try:
            yield server
        finally:
            server.stop()


@pytest.fixture
def s3_store(s3_server: EmbeddedS3) -> Iterator[S3Store]:
    """An S3Store on a fresh, empty bucket of the session server, deleted afterwards (each bucket holds a SeaweedFS
    volume of its own: a session's worth of leftover buckets would fill the server's volume slots)."""
    store = S3Store(s3_server.endpoint_url, f"test-{uuid.uuid4().hex[:16]}", timeout_s=15.0)
    store.ensure_bucket()
    try:
        yield store
    finally:
        drop_bucket(store)
        store.close()
