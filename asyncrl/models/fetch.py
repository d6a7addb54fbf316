"""A model folder from S3: `model.path: s3://bucket/prefix/to/model` is downloaded once into the cache.

Only data formats are fetched: JSON, safetensors, text and Jinja templates, sentencepiece models. Files that can
execute code when loaded (`*.bin`, `*.pt`, `*.pth`, `*.pkl`, `*.ckpt`, `*.py`) are refused with an error naming
them, before anything is downloaded: nothing read from S3 is unpickled, and no remote code runs. The folder must
hold `config.json` and at least one `*.safetensors` file.

The download goes to a temporary folder next to its destination and is renamed into place, so a concurrent fetch
(several ranks or roles in one pod) or a crash mid-download never leaves a half-written model behind. The
destination is keyed by the URI; a folder already there is used as it is.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import tempfile
from pathlib import Path

from asyncrl.storage.s3 import S3Store

log = logging.getLogger(__name__)

ALLOWED_SUFFIXES = (".json", ".safetensors", ".txt", ".jinja", ".model", ".tiktoken", ".md")
REFUSED_SUFFIXES = (".bin", ".pt", ".pth", ".pkl", ".pickle", ".ckpt", ".py", ".pyc", ".so")


def parse_s3_uri(uri: str) -> tuple[str, str]:
    """s3://bucket/some/prefix → ("bucket", "some/prefix/"); the field is named in the error."""
    rest = uri.removeprefix("s3://")
    bucket, _, prefix = rest.partition("/")
    if not uri.startswith("s3://") or not bucket or not prefix.strip("/"):
        raise ValueError(f"model.path: expected s3://bucket/path/to/model-folder, got {uri!r}")
    return bucket, prefix.strip("/") + "/"


def select_files(keys: list[str], prefix: str, uri: str) -> list[str]:
    """Pure: the relative names to fetch; errors name refused or unexpected files and a missing config/weights."""
    names = [k[len(prefix):] for k in keys if k.startswith(prefix) and not k.endswith("/")]
    refused = sorted(n for n in names if n.lower().endswith(REFUSED_SUFFIXES))
    if refused:
        raise ValueError(f"model.path: {uri} holds files that can run code when loaded: {refused[:5]}; expected "
                         f"safetensors weights (convert the checkpoint, or remove them)")
    chosen = sorted(n for n in names if n.lower().endswith(ALLOWED_SUFFIXES) and ".." not in n.split("/"))
    if "config.json" not in chosen:
        raise FileNotFoundError(f"model.path: expected {uri.rstrip('/')}/config.json (a Hugging Face model folder)")
    if not any(n.endswith(".safetensors") for n in chosen):
        raise FileNotFoundError(f"model.path: expected *.safetensors weights under {uri}")
    return chosen


def fetch_model(uri: str, cache_dir: Path | str, endpoint_url: str, region: str = "us-east-1",
                timeout_s: float = 60.0) -> Path:
    """The local folder of the model at `uri`, downloaded into `cache_dir/models/s3/` if not there yet
    (`endpoint_url` empty: AWS itself)."""
    bucket, prefix = parse_s3_uri(uri)
    dest = Path(cache_dir) / "models" / "s3" / hashlib.sha256(uri.encode()).hexdigest()[:16]
    if (dest / "config.json").is_file():
        return dest
    store = S3Store(endpoint_url, bucket, region=region, timeout_s=timeout_s)
    try:
        names = select_files(store.list_keys(prefix), prefix, uri)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=".fetch-", dir=dest.parent))
        try:
            for name in names:
                data = store.get_bytes(prefix + name)
                if data is None:
                    raise FileNotFoundError(f"model.path: {uri}{name} disappeared while it was being fetched")
                (tmp / name).parent.mkdir(parents=True, exist_ok=True)
                (tmp / name).write_bytes(data)
            try:
                os.rename(tmp, dest)
            except OSError:
                if not (dest / "config.json").is_file():  # not a concurrent fetch that won the race
                    raise
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    finally:
        store.close()
    log.info("fetched %d files of %s into %s", len(names), uri, dest)
    return dest
