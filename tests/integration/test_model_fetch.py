"""A model folder on S3 (`model.path: s3://...`): fetched once into the cache from a real SeaweedFS server, code-
carrying files refused before anything is downloaded, a missing config named."""

import pytest

from asyncrl.config import load_config
from asyncrl.models.fetch import fetch_model, select_files
from asyncrl.tiny_model.prepare import resolve_model_path

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


FOLDER = {"config.json": b'{"model_type": "qwen2"}', "model.safetensors": b"weights", "tokenizer.json": b"{}"}


def test_roles_find_the_run_model_only_through_model_json(s3_server, s3_store, tmp_path):
    from asyncrl.models.folder import ModelFolderError, model_document, run_model_folder
    from asyncrl.storage.run_layout import RunPaths

    paths = RunPaths("runs", "model-doc")
    with pytest.raises(ModelFolderError, match=r"runs/model-doc/model.json: expected .* before the roles start; "
                                               r"missing"):
        run_model_folder(s3_store, paths, tmp_path, s3_server.endpoint_url)
    s3_store.put_json(paths.model(), {"source": "model.path"})
    with pytest.raises(ModelFolderError, match=r'model.json: expected .*; got \{"source": "model.path"\}'):
        run_model_folder(s3_store, paths, tmp_path, s3_server.endpoint_url)
    local = tmp_path / "local"
    local.mkdir()
    for name, data in FOLDER.items():
        (local / name).write_bytes(data)
    s3_store.put_json(paths.model(), model_document(str(local), "model.path"))
    assert run_model_folder(s3_store, paths, tmp_path, s3_server.endpoint_url) == local
    (local / "tokenizer.json").unlink()
    with pytest.raises(ModelFolderError, match=r"model.json: .* tokenizer.json is missing"):
        run_model_folder(s3_store, paths, tmp_path, s3_server.endpoint_url)
    _upload(s3_store, paths.model_prefix().rstrip("/"), FOLDER)
    uri = f"s3://{s3_store.bucket}/{paths.model_prefix().rstrip('/')}"
    s3_store.put_json(paths.model(), model_document(uri, "built-in tiny model"))
    fetched = run_model_folder(s3_store, paths, tmp_path / "cache", s3_server.endpoint_url)
    assert fetched.is_relative_to(tmp_path / "cache") and (fetched / "model.safetensors").read_bytes() == b"weights"
    with pytest.raises(ValueError, match="model.json source"):
        model_document(uri, "somewhere")


def test_setup_records_the_model_once(s3_server, s3_store, tmp_path):
    from asyncrl.run.create import record_model
    from asyncrl.storage.run_layout import RunPaths

    paths = RunPaths("runs", "setup-model")
    uri = f"s3://{s3_store.bucket}/models/given"
    cfg = load_config(None, [f"model.path={uri}", f"cache_dir={tmp_path}", "run_id=setup-model"])
    doc = record_model(s3_store, paths, cfg)
    assert doc == {"path": uri, "source": "model.path", "model_path": uri} == s3_store.get_json(paths.model())
    other = load_config(None, [f"model.path={uri}-2", f"cache_dir={tmp_path}", "run_id=setup-model"])
    assert record_model(s3_store, paths, other) == doc  # a retried or resumed setup keeps what the roles load
