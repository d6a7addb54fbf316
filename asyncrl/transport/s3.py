"""`S3Store`: the one object-store client every role uses, over boto3, for one bucket.

Invariants:
- every call has a deadline (botocore connect/read timeouts) and a bounded number of retries;
- path-style addressing (works with SeaweedFS, MinIO and AWS alike);
- credentials come from the environment / the default boto3 chain, never from arguments or logs;
- every botocore failure surfaces as `StorageError` naming the bucket and key; a conditional write
  that loses (HTTP 412) surfaces as `ObjectExists`, and the existing object is left untouched;
- `list_keys` follows continuation tokens to the end and returns keys sorted: SeaweedFS lists keys
  containing characters that sort before '/' out of S3 (byte) order, so listing order is not used.
"""

from __future__ import annotations

import json
import logging
from typing import Any

import boto3
from botocore.config import Config
from botocore.exceptions import BotoCoreError, ClientError

log = logging.getLogger(__name__)

_MISSING_CODES = {"404", "NoSuchKey", "NotFound"}
_EXISTS_CODES = {"BucketAlreadyOwnedByYou", "BucketAlreadyExists"}


class StorageError(RuntimeError):
    """An object-store call failed; the message names the bucket and key."""


class ObjectExists(StorageError):
    """A write with if_absent=True found the key already there (HTTP 412); nothing was overwritten."""


def _code(err: ClientError) -> str:
    return str(err.response.get("Error", {}).get("Code", ""))


def _status(err: ClientError) -> int:
    return int(err.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)


class S3Store:
    """Objects of one bucket. Thread-safe for concurrent calls (boto3 clients are)."""

    def __init__(
        self,
        endpoint_url: str,
        bucket: str,
        region: str = "us-east-1",
        timeout_s: float = 30.0,
        max_attempts: int = 4,
    ) -> None:
        self.endpoint_url = endpoint_url
        self.bucket = bucket
        self.timeout_s = timeout_s
        config = Config(
            connect_timeout=min(timeout_s, 10.0),
            read_timeout=timeout_s,
            retries={"max_attempts": max_attempts, "mode": "standard"},
            s3={"addressing_style": "path"},
            # Only send/verify checksums when the operation requires them (S3-compatible servers vary).
            request_checksum_calculation="when_required",
            response_checksum_validation="when_required",
        )
        # A session per store: boto3's default session caches the credentials it first resolved, so a
        # store made after the environment changed would silently keep the old ones.
        session = boto3.session.Session()
        self._client = session.client("s3", endpoint_url=endpoint_url or None, region_name=region, config=config)

    def __repr__(self) -> str:
        return f"S3Store(endpoint_url={self.endpoint_url!r}, bucket={self.bucket!r})"

    def _where(self, key: str) -> str:
        return f"s3://{self.bucket}/{key}"

    def ensure_bucket(self) -> None:
        """Create the bucket if it does not exist (idempotent)."""
        try:
            self._client.head_bucket(Bucket=self.bucket)
            return
        except ClientError as e:
            if _code(e) not in _MISSING_CODES and _status(e) != 404:
                raise StorageError(f"head bucket s3://{self.bucket}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"head bucket s3://{self.bucket} at {self.endpoint_url}: {e}") from e
        try:
            self._client.create_bucket(Bucket=self.bucket)
        except ClientError as e:
            if _code(e) not in _EXISTS_CODES:
                raise StorageError(f"create bucket s3://{self.bucket}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"create bucket s3://{self.bucket} at {self.endpoint_url}: {e}") from e

    def put_bytes(self, key: str, data: bytes, *, if_absent: bool = False) -> None:
        """Write `data` at `key`. With if_absent, write only if no object is there (else ObjectExists)."""
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": key, "Body": data}
        if if_absent:
            kwargs["IfNoneMatch"] = "*"
        try:
            self._client.put_object(**kwargs)
        except ClientError as e:
            if if_absent and (_status(e) == 412 or _code(e) == "PreconditionFailed"):
                raise ObjectExists(f"{self._where(key)} already exists") from e
            raise StorageError(f"put {self._where(key)}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"put {self._where(key)}: {e}") from e

    def get_bytes(self, key: str) -> bytes | None:
        """The object's bytes, or None when there is no object at `key`."""
        try:
            resp = self._client.get_object(Bucket=self.bucket, Key=key)
            return resp["Body"].read()
        except ClientError as e:
            if _code(e) in _MISSING_CODES or _status(e) == 404:
                return None
            raise StorageError(f"get {self._where(key)}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"get {self._where(key)}: {e}") from e

    def exists(self, key: str) -> bool:
        try:
            self._client.head_object(Bucket=self.bucket, Key=key)
            return True
        except ClientError as e:
            if _code(e) in _MISSING_CODES or _status(e) == 404:
                return False
            raise StorageError(f"head {self._where(key)}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"head {self._where(key)}: {e}") from e

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

    def list_keys(self, prefix: str, page_size: int = 1000) -> list[str]:
        """Every key under `prefix`, sorted; follows continuation tokens until the listing ends."""
        keys: list[str] = []
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "MaxKeys": page_size}
        seen_tokens: set[str] = set()
        while True:
            try:
                resp = self._client.list_objects_v2(**kwargs)
            except ClientError as e:
                if _code(e) == "NoSuchBucket":
                    raise StorageError(f"list {self._where(prefix)}*: bucket {self.bucket} does not exist") from e
                raise StorageError(f"list {self._where(prefix)}*: {e}") from e
            except BotoCoreError as e:
                raise StorageError(f"list {self._where(prefix)}*: {e}") from e
            keys.extend(obj["Key"] for obj in resp.get("Contents", []))
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token:
                break
            if token in seen_tokens:  # a server bug must not become an endless loop
                raise StorageError(f"list {self._where(prefix)}*: continuation token repeated ({token!r})")
            seen_tokens.add(token)
            kwargs["ContinuationToken"] = token
        return sorted(set(keys))

    def list_subprefixes(self, prefix: str) -> list[str]:
        """The "folders" directly under `prefix` (full prefixes ending in '/'), sorted; one listing
        with Delimiter='/', so it stays cheap however many objects lie below."""
        found: set[str] = set()
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Prefix": prefix, "Delimiter": "/", "MaxKeys": 1000}
        seen_tokens: set[str] = set()
        while True:
            try:
                resp = self._client.list_objects_v2(**kwargs)
            except (ClientError, BotoCoreError) as e:
                raise StorageError(f"list {self._where(prefix)}*/: {e}") from e
            found.update(p["Prefix"] for p in resp.get("CommonPrefixes", []))
            token = resp.get("NextContinuationToken")
            if not resp.get("IsTruncated") or not token or token in seen_tokens:
                break
            seen_tokens.add(token)
            kwargs["ContinuationToken"] = token
        return sorted(found)

    def delete(self, key: str) -> None:
        """Delete `key` (no error if it is already gone)."""
        try:
            self._client.delete_object(Bucket=self.bucket, Key=key)
        except ClientError as e:
            if _code(e) in _MISSING_CODES:
                return
            raise StorageError(f"delete {self._where(key)}: {e}") from e
        except BotoCoreError as e:
            raise StorageError(f"delete {self._where(key)}: {e}") from e

    def close(self) -> None:
        self._client.close()
