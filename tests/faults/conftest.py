"""The fault tests talk to their own runs' S3 servers with those runs' credentials, which they put in os.environ
(boto3 reads them there): each test gets the credentials and the role token back as they were before it, so a test
after it that uses the session's S3 server (tests/conftest.py) is not left with another server's keys."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest

RESTORED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "ASYNCRL_ROLE_TOKEN")


@pytest.fixture(autouse=True)
def _credentials_restored() -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in RESTORED}
    yield
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
