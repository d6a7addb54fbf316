"""The fault tests talk to their own runs' S3 servers with those runs' credentials, which they put in os.environ
(boto3 reads them there): each test gets the credentials and the role token back as they were before it, so a test
after it that uses the session's S3 server (tests/conftest.py) is not left with another server's keys."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.helpers.env_vars import restored_env

RESTORED = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "ASYNCRL_ROLE_TOKEN")


@pytest.fixture(autouse=True)
def _credentials_restored() -> Iterator[None]:
    with restored_env(RESTORED):
        yield
