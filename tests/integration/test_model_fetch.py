"""A model folder on S3 (`model.path: s3://...`): fetched once into the cache from a real SeaweedFS server, code-
carrying files refused before anything is downloaded, a missing config named."""

import pytest

from asyncrl.config import load_config
from asyncrl.models.fetch import fetch_model, select_files
from asyncrl.models.tiny import resolve_model_path

pytestmark = pytest.mark.integration


def _upload(store, prefix: str, files: dict[str, bytes]) -> None:
    for name, data in files.items():
        store.put_bytes(f"{prefix}/{name}", data)


def test_fetch_resolves_an_s3_model_path_once(s3_server, s3_store, tmp_path):
    files = {"config.json": b'{"model_type": "qwen2"}', "model.safetensors": b"weights",
             "tokenizer.json": b"{}", "chat_template.jinja": b"{{ x }}", "sub/extra.json": b"[]"}
    _upload(s3_store, "models/tiny", files)
    uri = f"s3://{s3_store.bucket}/models/tiny"
    cfg = load_config(None, [f"model.path={uri}", f"cache_dir={tmp_path}",
                             f"storage.endpoint_url={s3_server.endpoint_url}"])
    path = resolve_model_path(cfg)
    assert {p.relative_to(path).as_posix() for p in path.rglob("*") if p.is_file()} == set(files)
    assert (path / "model.safetensors").read_bytes() == b"weights"
    s3_store.put_bytes("models/tiny/model.safetensors", b"changed")  # cached: not fetched again
    assert fetch_model(uri, tmp_path, s3_server.endpoint_url) == path
    assert (path / "model.safetensors").read_bytes() == b"weights"
    assert not [p for p in path.parent.iterdir() if p.name.startswith(".fetch-")]


def test_pickle_files_are_refused_before_download(s3_server, s3_store, tmp_path):
    _upload(s3_store, "models/unsafe", {"config.json": b"{}", "pytorch_model.bin": b"\x80\x04", "x.safetensors": b""})
    with pytest.raises(ValueError, match=r"can run code when loaded: \['pytorch_model.bin'\]"):
        fetch_model(f"s3://{s3_store.bucket}/models/unsafe", tmp_path, s3_server.endpoint_url)
    assert not (tmp_path / "models" / "s3").exists() or not any((tmp_path / "models" / "s3").iterdir())


def test_selection_errors_name_what_is_missing():
    with pytest.raises(FileNotFoundError, match=r"s3://b/m/config.json"):
        select_files(["m/model.safetensors"], "m/", "s3://b/m/")
    with pytest.raises(FileNotFoundError, match=r"\*.safetensors"):
        select_files(["m/config.json"], "m/", "s3://b/m/")
    assert select_files(["m/config.json", "m/a.safetensors", "m/readme.bin.txt", "m/x.onnx"], "m/", "s3://b/m/") == [
        "a.safetensors", "config.json", "readme.bin.txt"]
    with pytest.raises(ValueError, match="model.path: expected s3://bucket/path"):
        fetch_model("s3://bucket-only", "/tmp", "")
