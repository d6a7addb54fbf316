"""`open_run`: the run's store and paths from its URL and AWS_ENDPOINT_URL, or an error naming what is wrong."""

import pytest

from asyncrl.storage.run_store import open_run


def test_the_store_and_paths_come_from_the_url_and_the_endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    store, paths = open_run("s3://my-bucket/team/runs/run-7", retry_deadline_s=5.0)
    try:
        assert (store.bucket, store.endpoint_url, paths.prefix, paths.run_id) == (
            "my-bucket", "http://127.0.0.1:9", "team/runs", "run-7")
        assert paths.config() == "team/runs/run-7/config.json"
    finally:
        store.close()


def test_no_endpoint_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("AWS_ENDPOINT_URL", raising=False)
    with pytest.raises(ValueError, match="AWS_ENDPOINT_URL is not set"):
        open_run("s3://my-bucket/runs/run-7")


def test_a_malformed_url_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    with pytest.raises(ValueError, match="expected s3://bucket/prefix/run_id"):
        open_run("http://my-bucket/runs/run-7")
