"""`S3Store`: the one object-store client every role uses, over boto3, for one bucket.

The hot single-object calls (`get_with_metadata`, hence `get_bytes` / `get_json`, `put_bytes` / `put_json`, and
`exists`) go through `asyncrl.storage.s3_lean` (signed HTTP on a kept-alive connection, a third of boto3's CPU per
call) when the store has an explicit endpoint, credentials and no proxy; `ASYNCRL_S3_BOTO_ONLY=1` sends everything through
boto3. Both paths share the retry policy, the error mapping and the fault hook below.

Invariants:
- every call retries transient failures (connection errors, timeouts, throttling, HTTP 5xx) with
  exponential backoff and full jitter until a per-call deadline (`retry_deadline_s`, default 120 s),
  by our policy alone (`asyncrl.storage.retry`; botocore's own retries are off); each attempt has
  botocore connect/read timeouts; retries and give-ups are counted in `store.stats`;
- path-style addressing (works with SeaweedFS, MinIO and AWS alike);
- credentials come from the environment / the default boto3 chain, never from arguments or logs;
- every failure surfaces as `StorageError` naming the operation, bucket and key; a conditional write
  that loses (HTTP 412) surfaces as `ObjectExists`, and the existing object is left untouched;
- a conditional write retried after a lost response (the first attempt may have succeeded on the
  server) that then meets 412 reads the object back: our exact bytes mean success, anything else
  `ObjectExists`; a 412 on the first attempt is `ObjectExists` at once;
- `list_keys` follows continuation tokens to the end and returns keys sorted: SeaweedFS lists keys
  containing characters that sort before '/' out of S3 (byte) order, so listing order is not used.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterator
from typing import Any, Literal, TypeVar

import boto3
from botocore.config import Config
from botocore.credentials import Credentials
from botocore.exceptions import BotoCoreError, ClientError

from asyncrl.storage.retry import (
    GET_MISSING,
    RetryPolicy,
    StorageError,
    StoreStats,
    call_with_retry,
)
from asyncrl.storage.retry import error_code as _code
from asyncrl.storage.retry import error_status as _status
from asyncrl.storage.s3_lean import LeanObjectClient

log = logging.getLogger(__name__)

__all__ = ["FaultHook", "ObjectExists", "S3Store", "StorageError", "StoreStats"]

T = TypeVar("T")
_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_EXISTS_CODES = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}

FaultHook = Callable[[str, str, int, Literal["before", "after"]], None]
"""Test seam: `hook(op, where, attempt, phase)` (where = "s3://bucket/key") runs before and after each
attempt's request, inside the retry loop; raising a transient error "before" simulates a request that
never arrived, "after" one whose response was lost."""


def lean_client(endpoint_url: str, bucket: str, region: str, credentials: Credentials | None,
                timeout_s: float) -> LeanObjectClient | None:
    """The lean GET/PUT path (`asyncrl.storage.s3_lean`) where it behaves as boto3 would: an explicit http(s)
    endpoint, credentials resolved, no proxy configured; else None (every call through boto3)."""
    proxied = any(os.environ.get(v) for v in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy"))
    if not endpoint_url or credentials is None or proxied or os.environ.get("ASYNCRL_S3_BOTO_ONLY") == "1":
        return None
    return LeanObjectClient(endpoint_url, bucket, region, credentials, timeout_s)


class ObjectExists(StorageError):
    """A write with if_absent=True found the key already there (HTTP 412); nothing was overwritten."""


def _precondition_failed(err: ClientError) -> bool:
    return _status(err) == 412 or _code(err) == "PreconditionFailed"


class S3Store:
    """Objects of one bucket. Thread-safe for concurrent calls (boto3 clients are; `stats` is locked).

    `max_attempts` (None: unlimited) caps the attempts of one call in addition to `retry_deadline_s`;
    `max_attempts=1` means no retry at all (fail fast, e.g. for probes).
    """

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        region: str = "us-east-1",
        timeout_s: float = 30.0,
        max_attempts: int | None = None,
        retry_deadline_s: float = 120.0,
        retry_base_s: float = 0.2,
        retry_cap_s: float = 5.0,
        fault_hook: FaultHook | None = None,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.timeout_s = timeout_s
        self.policy = RetryPolicy(deadline_s=retry_deadline_s, base_s=retry_base_s, cap_s=retry_cap_s,
                                  max_attempts=max_attempts)
        self.stats = StoreStats()
        self.fault_hook = fault_hook
        config = Config(
            connect_timeout=min(timeout_s, 10.0),
            read_timeout=timeout_s,
            # one attempt per botocore call: the retry policy (and its deadline) is ours alone
            retries={"max_attempts": 1, "mode": "standard"},
            s3={"addressing_style": "path"},
            # Only send/verify checksums when the operation requires them (S3-compatible servers vary).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        # A session per store: boto3's default session caches the credentials it first resolved, so a
        # store made after the environment changed would silently keep the old ones.
        session = boto3.session.Session()
        self._client = session.client("s3", endpoint_url=endpoint_url or None, region_name=region, config=config)
        self._lean = lean_client(endpoint_url, bucket, region, session.get_credentials(), timeout_s)

    def __repr__(self) -> str:
        return f"S3Store(endpoint_url={self.endpoint_url!r}, bucket={self.bucket!r})"

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def _run(self, op: str, where: str, fn: Callable[[int], T]) -> T:
        """`fn(attempt)` under the retry policy; leftover botocore errors become StorageError naming `where`."""
        hook = self.fault_hook

        def attempt(n: int) -> T:
            self.stats.count(op)
            if hook is not None:
                hook(op, where, n, "before")
            out = fn(n)
            if hook is not None:
                hook(op, where, n, "after")
            return out

        try:
            return call_with_retry(attempt, op=op, where=where, policy=self.policy, stats=self.stats)
        except ClientError as e:
            raise StorageError(f"{op} {where}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"{op} {where} at {self.endpoint_url}: {e}") from e

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (idempotent)."""
        where = f"s3://{self.bucket}"

        def head(_: int) -> bool:
            try:
                self._client.head_bucket(Bucket=self.bucket)
                return True
            except ClientError as e:
                if _code(e) in _MISSING_CODES or _status(e) == 404:
                    return False
                raise

        if self._run("head bucket", where, head):
            return

        def create(_: int) -> None:
            try:
                self._client.create_bucket(Bucket=self.bucket)
            except ClientError as e:
                if _code(e) not in _EXISTS_CODES:  # also covers a create retried after a lost response
                    raise

        self._run("create bucket", where, create)

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False,
                  metadata: dict[str, str] | None = None) -> None:
        """Write `data` at `key` (with user `metadata`, if given). With if_absent, write only if no object is there
        (else ObjectExists)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data}
        if metadata:
            kwargs["Metadata"] = metadata
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        where = self._where(key)

        def put(n: int) -> bool:
            """True: written; False: 412 on a retry, so our own lost write may be what is there."""
            try:
                if self._lean is not None:
                    self._lean.put(key, data, metadata, if_absent)
                else:
                    self._client.put_object(**kwargs)
                return True
            except ClientError as e:
                if if_absent and _precondition_failed(e):
                    if n == 1:
                        raise ObjectExists(f"{where} already exists") from e
                    return False
                raise

        if self._run("put", where, put):
            return
        if self.get_bytes(key) == data:
            log.info("%s: conditional put retried after a lost response; the object holds our bytes", where)
            return
        raise ObjectExists(f"{where} already exists (with other bytes; found on a retried conditional put)")

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no object at `key`."""
        got = self.get_with_metadata(key)
        return None if got is None else got[0]

    def get_with_metadata(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        """The object's bytes and user metadata, or None when there is no object at `key`."""

        def get(_: int) -> tuple[bytes, dict[str, str]] | None:
            if self._lean is not None:
                return self._lean.get(key)
            try:
                resp = self._client.get_object(Bucket=self.bucket, Key=key)
            except ClientError as e:
                if _code(e) in _MISSING_CODES or _status(e) == 404:
                    return None
                raise
            body = resp["Body"].read()  # a body cut short raises IncompleteReadError: retried
            return body, {str(k).lower(): str(v) for k, v in (resp.get("Metadata") or {}).items()}

        got = self._run("get", self._where(key), get)
        if got is None:
            self.stats.count(GET_MISSING)
        return got

    def exists(self, key: str) -> bool:
        def head(_: int) -> bool:
            if self._lean is not None:
                return self._lean.head(key)
            try:
                self._client.head_object(Bucket=self.bucket, Key=key)
                return True
            except ClientError as e:
                if _code(e) in _MISSING_CODES or _status(e) == 404:
                    return False
                raise

        return self._run("head", self._where(key), head)

    def put_json(self, key: str, obj: Any, *, if_absent: bool = False) -> None:
        """Write `obj` as UTF-8 JSON (sorted keys, so equal documents have equal bytes)."""
        try:
            data = json.dumps(obj, sort_keys=True, allow_nan=False).encode()
        except (TypeError, ValueError) as e:
            raise ValueError(f"{self._where(key)}: object is not JSON-serialisable: {e}") from e
        self.put_bytes(key, data, if_absent=if_absent)

    def get_json(self, key: str) -> Any | None:
        """The parsed JSON document at `key`, or None when missing; ValueError naming the key if not JSON."""
        data = self.get_bytes(key)
        if data is None:
            return None
        try:
            return json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"{self._where(key)}: expected a UTF-8 JSON document, got {len(data)} bytes: {e}") from e

    def _list_page(self, where: str, kwargs: dict[str, Any]) -> dict[str, Any]:
        def page(_: int) -> dict[str, Any]:
            try:
                return self._client.list_objects_v2(**kwargs)
            except ClientError as e:
                if _code(e) == "NoSuchBucket":
                    raise StorageError(f"list {where}: bucket {self.bucket} does not exist") from e
                raise

        return self._run("list", where, page)

    def list_keys(self, prefix: str, page_size: int = 1000) -> list[str]:
        """Every key under `prefix`, sorted; follows continuation tokens until the listing ends."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
        pages = self._pages(f"{self._where(prefix)}*", kwargs)
        return sorted({obj["Key"] for resp in pages for obj in resp.get("Contents", [])})

    def _pages(self, where: str, kwargs: dict[str, Any]) -> Iterator[dict[str, Any]]:
        """Every page of one listing, following continuation tokens; a repeated token (a server bug) is a
        StorageError, never an endless loop."""
        seen_tokens: set[str] = set()
        while True:
            resp = self._list_page(where, kwargs)
            yield resp
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                return
            if token in seen_tokens:
                raise StorageError(f"list {where}: continuation token repeated ({token!r})")
            seen_tokens.add(token)
            kwargs = {**kwargs, "ContinuationToken": token}

    def first_key_after(self, prefix: str, start_after: str) -> str | None:
        """The first key under `prefix` that sorts after `start_after` (one cheap listing), or None.

        Relies on the server's listing order, so use it only under prefixes whose keys are uniform
        (e.g. one writer's zero-padded `<seq>.parquet` keys), not across '/'-sensitive names.
        """
        kwargs = {"Bucket": self.bucket, "Prefix": prefix, "StartAfter": start_after, "MaxKeys": 1}
        resp = self._list_page(f"{self._where(prefix)}* after {start_after}", kwargs)
        keys = sorted(obj["Key"] for obj in resp.get("Contents", []) if obj["Key"] > start_after)
        return keys[0] if keys else None

    def list_subprefixes(self, prefix: str) -> list[str]:
        """The "folders" directly under `prefix` (full prefixes ending in '/'), sorted; one listing
        with Delimiter='/', so it stays cheap however many objects lie below."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": 1000}
        pages = self._pages(f"{self._where(prefix)}*/", kwargs)
        return sorted({p["Prefix"] for resp in pages for p in resp.get("CommonPrefixes", [])})

    def delete(self, key: str) -> None:
        """Delete `key` (no error if it is already gone)."""

        def delete(_: int) -> None:
            try:
                self._client.delete_object(Bucket=self.bucket, Key=key)
            except ClientError as e:
                if _code(e) not in _MISSING_CODES:
                    raise

        self._run("delete", self._where(key), delete)

    def close(self) -> None:
        self._client.close()
        if self._lean is not None:
            self._lean.close()
