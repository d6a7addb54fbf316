"""The S3 key layout of one run (the layout below is the contract every role relies on; docs/architecture.md); pure
string logic, no I/O.

Under `<prefix>/<run_id>/` (prefix may be empty):
    config.json
    tracking.json                             MLflow tracking URI and run id
    data/dataset.json                         a materialised task's rows: source, counts, sha256 of each split
    data/train.jsonl, data/eval.jsonl         its splits as JSON Lines, written once before any role starts
    rendezvous/<role>/<id>.json
    groups/<writer>/<seq:012d>.parquet        written once, never rewritten
    quarantine/groups/<writer>/<seq:012d>.parquet   copy of a group object that did not decode
    versions/latest.json
    stats/<writer>.json                       latest rollout metrics of an environment writer
    heartbeats/<role>/<id>.json               a role's liveness (seq, state) and its own metrics
    checkpoints/<version>/<name>              committed by writing COMMITTED last
    done
Invariants: run ids, role ids and writer ids match `[A-Za-z0-9_-]+` (run ids may also hold '.');
sequence numbers and versions are non-negative integers; zero-padded sequence numbers make
lexicographic and numeric order agree.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_ID = re.compile(r"^[A-Za-z0-9_-]+$")
_RUN_ID = re.compile(r"^[A-Za-z0-9._-]+$")
_PREFIX = re.compile(r"^[A-Za-z0-9._/-]*$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9.-]+[a-z0-9]$")
SEQ_DIGITS = 12
COMMITTED = "COMMITTED"


def check_id(kind: str, value: str) -> str:
    """Return `value` if it is a valid role/writer/server id, else ValueError naming `kind`."""
    if not isinstance(value, str) or not _ID.match(value):
        raise ValueError(f"{kind}: expected letters, digits, '_' or '-' only, got {value!r}")
    return value


def _check_int(kind: str, value: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise ValueError(f"{kind}: expected a non-negative integer, got {value!r}")
    return value


def _normalise_prefix(prefix: str) -> str:
    if not _PREFIX.match(prefix):
        raise ValueError(f"prefix: expected letters, digits, '.', '_', '-' and '/' only, got {prefix!r}")
    parts = [p for p in prefix.split("/") if p]
    if any(p in (".", "..") for p in parts):
        raise ValueError(f"prefix: '.' and '..' segments are not allowed, got {prefix!r}")
    return "/".join(parts)


@dataclass(frozen=True)
class RunPaths:
    """Key builder for one run. `root` is `<prefix>/<run_id>` (or `<run_id>` with an empty prefix)."""

    prefix: str
    run_id: str

    def __post_init__(self) -> None:
        object.__setattr__(self, "prefix", _normalise_prefix(self.prefix))
        if not isinstance(self.run_id, str) or not _RUN_ID.match(self.run_id) or self.run_id in (".", ".."):
            raise ValueError(f"run_id: expected letters, digits, '.', '_' or '-' only, got {self.run_id!r}")

    @property
    def root(self) -> str:
        """`<prefix>/<run_id>` (no trailing '/'); every key of the run starts with `root + "/"`."""
        return f"{self.prefix}/{self.run_id}" if self.prefix else self.run_id

    def file(self, name: str) -> str:
        """A top-level document of the run: `<root>/<name>` (e.g. run_summary.json)."""
        if not name or name.startswith("/") or ".." in name.split("/"):
            raise ValueError(f"run file name: expected a relative key such as 'run_summary.json', got {name!r}")
        return f"{self.root}/{name}"

    def config(self) -> str:
        return self.file("config.json")

    def tracking(self) -> str:
        """`tracking.json`: the MLflow tracking URI and run id, for roles that log to the run."""
        return self.file("tracking.json")

    def model(self) -> str:
        """`model.json`: where the run's starting model folder is ({"path": local folder or s3:// URI, ...}),
        written by the launcher (embedded) or the pipeline's setup step before any role starts."""
        return self.file("model.json")

    def task_data(self) -> str:
        """`data/dataset.json`: the document of a reasoning_gym or file task's rows (source, parameters, and each
        split's key, row count and sha256), written after both splits (`asyncrl.tasks.run_copy`)."""
        return self.file("data/dataset.json")

    def task_split(self, split: str) -> str:
        """`data/train.jsonl` or `data/eval.jsonl`: one split of a materialised task as JSON Lines."""
        if split not in ("train", "eval"):
            raise ValueError(f"split: expected 'train' or 'eval', got {split!r}")
        return self.file(f"data/{split}.jsonl")

    def model_prefix(self) -> str:
        """`<root>/model/`: the built-in tiny model's files, uploaded by the cluster's setup step."""
        return f"{self.root}/model/"

    def rendezvous_prefix(self, role: str) -> str:
        return f"{self.root}/rendezvous/{check_id('role', role)}/"

    def rendezvous(self, role: str, id: str) -> str:
        return f"{self.rendezvous_prefix(role)}{check_id('rendezvous id', id)}.json"

    def groups_prefix(self, writer: str | None = None) -> str:
        if writer is None:
            return f"{self.root}/groups/"
        return f"{self.root}/groups/{check_id('writer', writer)}/"

    def group(self, writer: str, seq: int) -> str:
        return f"{self.groups_prefix(writer)}{_check_int('seq', seq):0{SEQ_DIGITS}d}.parquet"

    def parse_group_key(self, key: str) -> tuple[str, int] | None:
        """(writer, seq) of a key built by `group()`, or None for any other key."""
        base = self.groups_prefix()
        if not key.startswith(base):
            return None
        rest = key[len(base) :].split("/")
        if len(rest) != 2 or not _ID.match(rest[0]):
            return None
        m = re.fullmatch(rf"(\d{{{SEQ_DIGITS}}})\.parquet", rest[1])
        return (rest[0], int(m.group(1))) if m else None

    def quarantine_prefix(self) -> str:
        """`<root>/quarantine/`: copies of objects moved aside because they could not be decoded."""
        return self.file("quarantine/")

    def quarantine_group(self, writer: str, seq: int) -> str:
        """Where the copy of the undecodable group object `group(writer, seq)` is kept."""
        return f"{self.quarantine_prefix()}groups/{check_id('writer', writer)}/{_check_int('seq', seq):0{SEQ_DIGITS}d}.parquet"

    def versions_latest(self) -> str:
        return self.file("versions/latest.json")

    def rollout_stats(self, writer: str) -> str:
        """The latest rollout metrics of one environment writer (overwritten; read by the trainer for MLflow)."""
        return self.file(f"stats/{check_id('writer', writer)}.json")

    def heartbeats_prefix(self) -> str:
        return self.file("heartbeats/")

    def heartbeat(self, role: str, id: str) -> str:
        """A role's heartbeat document (overwritten every `timeouts.heartbeat_s`; see `asyncrl.roles.liveness`)."""
        return self.file(f"heartbeats/{check_id('role', role)}/{check_id('id', id)}.json")

    def checkpoints_root(self) -> str:
        return self.file("checkpoints/")

    def checkpoint_prefix(self, version: int) -> str:
        return f"{self.checkpoints_root()}{_check_int('version', version)}/"

    def checkpoint(self, version: int, name: str) -> str:
        if not name or "/" in name or name in (".", ".."):
            raise ValueError(f"checkpoint file name: expected a plain file name, got {name!r}")
        return self.checkpoint_prefix(version) + name

    def checkpoint_committed(self, version: int) -> str:
        return self.checkpoint(version, COMMITTED)

    def done(self) -> str:
        return self.file("done")


def parse_run_url(url: str) -> tuple[str, str, str]:
    """`s3://bucket/prefix/.../run_id` -> (bucket, prefix, run_id); the prefix may be empty."""
    if not url.startswith("s3://"):
        raise ValueError(f"run url: expected s3://bucket/prefix/run_id, got {url!r}")
    parts = [p for p in url[len("s3://") :].split("/") if p]
    if len(parts) < 2:
        raise ValueError(f"run url: expected s3://bucket/prefix/run_id (bucket and run id at least), got {url!r}")
    bucket, run_id, prefix = parts[0], parts[-1], "/".join(parts[1:-1])
    if not _BUCKET.match(bucket):
        raise ValueError(f"run url {url!r}: bucket {bucket!r} is not a valid S3 bucket name")
    paths = RunPaths(prefix, run_id)  # validates prefix and run id
    return bucket, paths.prefix, paths.run_id


def run_url(bucket: str, prefix: str, run_id: str) -> str:
    """The inverse of `parse_run_url`."""
    if not _BUCKET.match(bucket):
        raise ValueError(f"bucket: expected a valid S3 bucket name, got {bucket!r}")
    paths = RunPaths(prefix, run_id)
    return f"s3://{bucket}/{paths.root}"
