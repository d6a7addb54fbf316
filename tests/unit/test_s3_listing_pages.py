"""S3Store's listings follow continuation tokens page by page, and a server that repeats a token (a fault injected
here on purpose, in place of the server's pages) gets a StorageError from both listings, never an endless loop."""

from __future__ import annotations

from typing import Any

import pytest

from asyncrl.storage.s3 import S3Store, StorageError


class PagedStore(S3Store):
    def __init__(self, pages: list[dict[str, Any]]) -> None:
        super().__init__("http://127.0.0.1:9", "bucket")
        self.pages, self.asked = pages, []

    def _list_page(self, where: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        self.asked.append(kwargs.get("ContinuationToken"))
        return self.pages[len(self.asked) - 1]


def test_listings_join_every_page() -> None:
    store = PagedStore([{"Contents": [{"Key": "p/b"}], "IsTruncated": True, "NextContinuationToken": "t1"},
                        {"Contents": [{"Key": "p/a"}, {"Key": "p/b"}], "IsTruncated": False}])
    assert store.list_keys("p/") == ["p/a", "p/b"] and store.asked == [None, "t1"]
    store = PagedStore([{"CommonPrefixes": [{"Prefix": "p/y/"}], "IsTruncated": True, "NextContinuationToken": "t1"},
                        {"CommonPrefixes": [{"Prefix": "p/x/"}], "IsTruncated": True, "NextContinuationToken": "t2"},
                        {"IsTruncated": False}])
    assert store.list_subprefixes("p/") == ["p/x/", "p/y/"] and store.asked == [None, "t1", "t2"]


@pytest.mark.parametrize("listing", ["list_keys", "list_subprefixes"])
def test_a_repeated_continuation_token_is_an_error(listing: str) -> None:
    page = {"Contents": [], "CommonPrefixes": [], "IsTruncated": True, "NextContinuationToken": "same"}
    store = PagedStore([page, page, page])
    with pytest.raises(StorageError, match=r"continuation token repeated \('same'\)"):
        getattr(store, listing)("p/")
    assert store.asked == [None, "same"]
