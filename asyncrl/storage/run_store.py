"""Open a run's storage from its URL: the one way every process that is handed `s3://BUCKET/PREFIX/RUN_ID` (a role,
finalize, `asyncrl tracking replay`) reaches the run's objects.

The S3 endpoint comes from `AWS_ENDPOINT_URL` and the credentials from the usual AWS variables, as the pipeline's
tasks and the embedded launcher set them; nothing about the endpoint travels in the URL.
"""

from __future__ import annotations

import os

from asyncrl.storage.run_layout import RunPaths, parse_run_url
from asyncrl.storage.s3 import S3Store

CALL_TIMEOUT_S = 30.0


def open_run(url: str, retry_deadline_s: float = 120.0) -> tuple[S3Store, RunPaths]:
    """The store of the run's bucket and the run's paths. ValueError naming what is wrong: a malformed URL, or
    `AWS_ENDPOINT_URL` not set. `retry_deadline_s`: how long one storage call is retried."""
    bucket, prefix, run_id = parse_run_url(url)
    endpoint = os.environ.get("AWS_ENDPOINT_URL", "")
    if not endpoint:
        raise ValueError("AWS_ENDPOINT_URL is not set: expected the S3 endpoint of the run")
    return S3Store(endpoint, bucket, timeout_s=CALL_TIMEOUT_S, retry_deadline_s=retry_deadline_s), RunPaths(prefix, run_id)
