"""Test buckets removed after use: on SeaweedFS a deleted bucket gives its volume back."""

from __future__ import annotations

import logging

from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)


def drop_bucket(store: S3Store) -> None:
    """Delete every object of `store`'s bucket, then the bucket; a failure is logged, not raised (a test that stopped
    the server on purpose leaves nothing to delete)."""
    try:
        for key in store.list_keys(""):
            store.delete(key)
        store._client.delete_bucket(Bucket=store.bucket)
    except Exception as err:  # noqa: BLE001 - cleanup must not mask the test's own outcome
        log.warning("test bucket %s not deleted: %s", store.bucket, str(err).splitlines()[0][:200])
