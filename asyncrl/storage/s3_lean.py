"""A lean signed-HTTP path for the object store's hot calls: GET of an object with its metadata, PUT, and HEAD.

The trainer polls the next group object of every writer many times a second, and the environment role reads the
trainer's version document as often; through boto3 each such call costs ~2.2-2.6 ms of CPU (request building, the
event system, response parsing), against ~0.7 ms for the same request signed with botocore's own SigV4 signer and
sent on a kept-alive `http.client` connection (measured on this machine against the embedded SeaweedFS). Every
role also asks once a second whether the run's `done` marker exists (a HEAD). Every other call (LIST, DELETE, bucket
creation) stays on boto3.

Owns: one kept-alive connection per thread, request signing, and turning responses into what `S3Store` expects.

Invariants:
- requests are signed by botocore's `S3SigV4Auth` with the credentials the store's boto3 session resolved (frozen
  per request, so refreshed credentials are used); path-style URLs, the key percent-encoded;
- an HTTP error answer raises botocore's `ClientError` with the status and the S3 error code (read from at most the
  first 4 KiB of the body with a pattern, no XML parser), so `S3Store`'s retry policy and error mapping apply
  unchanged; a connection failure raises `ConnectionError` (transient) and drops that thread's connection;
- a GET that fails on a connection reused from an earlier request, before any answer, is sent once more at once on
  a new connection (the server may have closed the idle one); a PUT never is (its first attempt may have landed:
  `S3Store`'s retry decides, knowing it was a retry);
- nothing read from the network is unpickled or evaluated; bodies are bytes.
"""

from __future__ import annotations

import http.client
import os
import re
import ssl
import threading
import time
import urllib.parse
from typing import Any

from botocore.auth import S3SigV4Auth
from botocore.awsrequest import AWSRequest
from botocore.credentials import Credentials
from botocore.exceptions import ClientError

IDLE_RECONNECT_S = 5.0  # a connection idle longer than this is replaced before use (servers close idle ones)
_ERROR_CODE = re.compile(rb"<Code>([A-Za-z0-9.]{1,100})</Code>")
_META = "x-amz-meta-"


class LeanObjectClient:
    """GET and PUT of single objects of one bucket over signed HTTP/1.1 (see the module docstring)."""

    def __init__(self, endpoint_url: str, bucket: str, region: str, credentials: Credentials, timeout_s: float) -> None:
        url = urllib.parse.urlsplit(endpoint_url)
        if url.scheme not in ("http", "https") or not url.hostname:
            raise ValueError(f"endpoint_url: expected http(s)://host[:port], got {endpoint_url!r}")
        self.scheme = url.scheme
        self.host = url.hostname
        self.port = url.port or (443 if url.scheme == "https" else 80)
        self.base = f"{url.scheme}://{url.netloc}"
        self.prefix = url.path.rstrip("/")
        self.bucket = bucket
        self.region = region
        self.credentials = credentials
        self.timeout_s = timeout_s
        self._local = threading.local()
        self._ssl: ssl.SSLContext | None = None
        if url.scheme == "https":
            self._ssl = ssl.create_default_context(cafile=os.environ.get("AWS_CA_BUNDLE") or None)

    # ---- connections ---------------------------------------------------------------------------------
    def _connection(self) -> tuple[http.client.HTTPConnection, bool]:
        """This thread's connection and whether it was used before (a fresh one after an idle spell)."""
        conn: http.client.HTTPConnection | None = getattr(self._local, "conn", None)
        last = getattr(self._local, "last_used", 0.0)
        if conn is not None and time.monotonic() - last > IDLE_RECONNECT_S:
            conn.close()
            conn = None
        if conn is None:
            if self._ssl is not None:
                conn = http.client.HTTPSConnection(self.host, self.port, timeout=self.timeout_s, context=self._ssl)
            else:
                conn = http.client.HTTPConnection(self.host, self.port, timeout=self.timeout_s)
            self._local.conn = conn
            return conn, False
        return conn, True

    def _drop(self) -> None:
        conn = getattr(self._local, "conn", None)
        self._local.conn = None
        if conn is not None:
            conn.close()

    def close(self) -> None:
        """Close this thread's connection (other threads' close when they are collected)."""
        self._drop()

    # ---- one request ---------------------------------------------------------------------------------
    def _path(self, key: str) -> str:
        return f"{self.prefix}/{self.bucket}/{urllib.parse.quote(key, safe='/~')}"

    def _signed_headers(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> dict[str, str]:
        request = AWSRequest(method=method, url=self.base + path, data=body, headers=headers)
        S3SigV4Auth(self.credentials.get_frozen_credentials(), "s3", self.region).add_auth(request)
        return dict(request.headers.items())

    def _send(self, method: str, key: str, body: bytes, headers: dict[str, str],
              resend_on_stale: bool) -> tuple[int, http.client.HTTPMessage, bytes]:
        path = self._path(key)
        signed = self._signed_headers(method, path, body, headers)
        for attempt in (1, 2):
            conn, reused = self._connection()
            try:
                conn.request(method, path, body=body or None, headers=signed)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                if attempt == 1 and reused and resend_on_stale and not isinstance(e, TimeoutError):
                    continue  # the server closed the kept-alive connection: once more on a new one
                raise ConnectionError(f"{method} {self.bucket}/{key}: {type(e).__name__}: {e}") from e
            try:
                data = response.read()
            except (OSError, http.client.HTTPException) as e:
                self._drop()
                raise ConnectionError(f"{method} {self.bucket}/{key}: response cut short: {e}") from e
            self._local.last_used = time.monotonic()
            if response.will_close:
                self._drop()
            return response.status, response.msg, data
        raise AssertionError("unreachable")

    @staticmethod
    def _error(method: str, status: int, data: bytes) -> ClientError:
        m = _ERROR_CODE.search(data[:4096])
        code = m.group(1).decode("ascii") if m else str(status)
        response: Any = {"Error": {"Code": code, "Message": f"HTTP {status}"},
                         "ResponseMetadata": {"HTTPStatusCode": status}}
        return ClientError(response, method)

    # ---- the calls ------------------------------------------------------------------------------------
    def get(self, key: str) -> tuple[bytes, dict[str, str]] | None:
        """The object's bytes and user metadata (names lower-cased, without `x-amz-meta-`), None on 404."""
        status, headers, data = self._send("GET", key, b"", {}, resend_on_stale=True)
        if status == 404:
            return None
        if status != 200:
            raise self._error("GetObject", status, data)
        length = headers.get("Content-Length")
        if length is not None and length.isdigit() and int(length) != len(data):
            raise ConnectionError(f"GET {self.bucket}/{key}: {len(data)} of {length} bytes")
        meta = {k.lower()[len(_META):]: v for k, v in headers.items() if k.lower().startswith(_META)}
        return data, meta

    def put(self, key: str, data: bytes, metadata: dict[str, str] | None, if_absent: bool) -> None:
        """Write the object; a refused condition raises `ClientError` with status 412."""
        headers = {"Content-Length": str(len(data))}
        for k, v in (metadata or {}).items():
            headers[_META + k] = v
        if if_absent:
            headers["If-None-Match"] = "*"
        status, _, answer = self._send("PUT", key, data, headers, resend_on_stale=False)
        if status not in (200, 201, 204):
            raise self._error("PutObject", status, answer)

    def head(self, key: str) -> bool:
        """Whether an object is at `key` (HEAD: no body either way); any answer but 200 or 404 raises `ClientError`
        with its status as the code (a HEAD's error answer has no body to read one from)."""
        status, _, data = self._send("HEAD", key, b"", {}, resend_on_stale=True)
        if status == 404:
            return False
        if status != 200:
            raise self._error("HeadObject", status, data)
        return True
