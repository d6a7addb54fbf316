"""A stand-in for the Kubeflow Pipelines v2beta1 REST API, for tests of `asyncrl pipeline upload|run`.

No KFP cluster is available to the tests, so this small real HTTP server (port 0, its own thread) answers the
endpoints those commands call, with the JSON shapes of KFP's API, keeps the pipelines, versions, experiments
and runs it was given in memory, and records every request (method, path, query, JSON body or uploaded file) so
a test checks exactly what the kfp client sent. It is an injected stand-in, not a model of KFP's behaviour beyond
those endpoints.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit

API = "/apis/v2beta1"


@dataclass
class Request:
    method: str
    path: str
    query: dict[str, str]
    body: Any = None
    upload: str = ""  # the uploaded pipeline package's text


@dataclass
class KfpState:
    pipelines: dict[str, dict[str, Any]] = field(default_factory=dict)  # id -> {display_name, namespace, ...}
    versions: dict[str, list[dict[str, Any]]] = field(default_factory=dict)  # pipeline id -> versions
    experiments: dict[str, dict[str, Any]] = field(default_factory=dict)
    runs: list[dict[str, Any]] = field(default_factory=list)
    requests: list[Request] = field(default_factory=list)

    def calls(self, method: str, path: str) -> list[Request]:
        return [r for r in self.requests if r.method == method and r.path == path]


def _name_filter(query: dict[str, str]) -> str | None:
    if "filter" not in query:
        return None
    (pred,) = json.loads(query["filter"])["predicates"]
    assert pred["key"] == "display_name" and pred["operation"] in ("EQUALS", 1), pred
    return pred["stringValue"]


def _multipart_file(headers: Any, body: bytes) -> str:
    msg = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(
        b"Content-Type: " + headers["Content-Type"].encode() + b"\r\n\r\n" + body)
    for part in msg.iter_parts():
        if part.get_param("name", header="content-disposition") == "uploadfile":
            return part.get_payload(decode=True).decode()
    raise AssertionError("no uploadfile part")


class _Handler(BaseHTTPRequestHandler):
    state: KfpState

    def log_message(self, *args: Any) -> None:  # quiet
        pass

    def _reply(self, doc: Any, code: int = 200) -> None:
        data = json.dumps(doc).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _record(self) -> Request:
        parts = urlsplit(self.path)
        query = {k: v[-1] for k, v in parse_qs(parts.query).items()}
        length = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(length) if length else b""
        req = Request(self.command, parts.path, query)
        if raw and self.headers.get("Content-Type", "").startswith("multipart/form-data"):
            req.upload = _multipart_file(self.headers, raw)
        elif raw:
            req.body = json.loads(raw)
        self.state.requests.append(req)
        return req

    def do_GET(self) -> None:  # noqa: N802 - http.server's name
        req, s = self._record(), self.state
        if req.path == f"{API}/healthz":
            return self._reply({"multi_user": False})
        if req.path == f"{API}/pipelines":
            name = _name_filter(req.query)
            found = [p for p in s.pipelines.values() if name in (None, p["display_name"])
                     and req.query.get("namespace") in (None, p.get("namespace"))]
            return self._reply({"pipelines": found, "total_size": len(found)} if found else {})
        if req.path.startswith(f"{API}/pipelines/") and req.path.endswith("/versions"):
            pid = req.path.split("/")[-2]
            name = _name_filter(req.query)
            found = [v for v in s.versions.get(pid, []) if name in (None, v["display_name"])]
            return self._reply({"pipeline_versions": found, "total_size": len(found)} if found else {})
        if req.path == f"{API}/experiments":
            name = _name_filter(req.query)
            found = [e for e in s.experiments.values() if name in (None, e["display_name"])
                     and req.query.get("namespace") in (None, e.get("namespace"))]
            return self._reply({"experiments": found, "total_size": len(found)} if found else {})
        return self._reply({"error": f"no route {req.path}", "code": 5}, 404)

    def _version(self, pid: str, name: str, description: str, spec: str) -> dict[str, Any]:
        v = {"pipeline_id": pid, "pipeline_version_id": str(uuid.uuid4()), "display_name": name,
             "description": description, "created_at": "2026-01-01T00:00:00Z"}
        self.state.versions.setdefault(pid, []).append({**v, "_spec": spec})
        return v

    def do_POST(self) -> None:  # noqa: N802
        req, s = self._record(), self.state
        if req.path == f"{API}/pipelines/upload":
            pid = str(uuid.uuid4())
            p = {"pipeline_id": pid, "display_name": req.query["name"], "description": req.query.get("description", ""),
                 "created_at": "2026-01-01T00:00:00Z"}
            if "namespace" in req.query:
                p["namespace"] = req.query["namespace"]
            s.pipelines[pid] = p
            self._version(pid, req.query["name"], req.query.get("description", ""), req.upload)
            return self._reply(p)
        if req.path == f"{API}/pipelines/upload_version":
            pid = req.query["pipelineid"]
            if any(v["display_name"] == req.query["name"] for v in s.versions.get(pid, [])):
                return self._reply({"error": "version name exists", "code": 6}, 409)
            return self._reply(self._version(pid, req.query["name"], req.query.get("description", ""), req.upload))
        if req.path == f"{API}/experiments":
            e = {**req.body, "experiment_id": str(uuid.uuid4()), "storage_state": "AVAILABLE"}
            s.experiments[e["experiment_id"]] = e
            return self._reply(e)
        if req.path == f"{API}/runs":
            run = {**req.body, "run_id": str(uuid.uuid4()), "state": "PENDING"}
            s.runs.append(run)
            return self._reply(run)
        return self._reply({"error": f"no route {req.path}", "code": 5}, 404)


@contextmanager
def kfp_api_server() -> Iterator[tuple[str, KfpState]]:
    """(host URL, state) of a running stand-in server on 127.0.0.1, port 0; stopped and closed on exit."""
    state = KfpState()
    handler = type("Handler", (_Handler,), {"state": state})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=server.serve_forever, name="kfp-api-stand-in", daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}", state
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=10)
