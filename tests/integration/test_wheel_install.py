"""`pip install "asyncrl[cluster]"` from the wheel gives a working CLI: the wheel is built from this checkout, installed
with the lock as constraints into a fresh venv (no system site-packages, packages from PyPI), and the installed
commands run from a folder outside the checkout: `asyncrl pipeline compile`, `asyncrl validate`, `--help` of every
subcommand, `asyncrl pipeline upload` finding the shipped YAML (then failing clearly on an unreachable host) and
`asyncrl-task`. Needs PyPI (or the configured index); the [cluster] extra pulls no torch (checked)."""

from __future__ import annotations

import os
import subprocess
import venv
from pathlib import Path

import pytest

from asyncrl.cli import _parser
from tests.unit.test_packaging import build_wheel

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def run(argv: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    return subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


def subcommands() -> list[str]:
    parser = _parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    return sorted(sub.choices)


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(the venv's bin folder, a working folder outside the checkout)."""
    tmp = tmp_path_factory.mktemp("wheel-install")
    wheel = build_wheel(tmp)
    env_dir = tmp / "venv"
    venv.EnvBuilder(with_pip=True, system_site_packages=False, clear=True).create(env_dir)
    bin_dir = env_dir / "bin"
    proc = run([str(bin_dir / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check",
                f"{wheel}[cluster]", "-c", str(ROOT / "requirements.lock")], cwd=tmp, timeout=1200)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    work = tmp / "work"
    work.mkdir()
    return bin_dir, work


def test_installed_environment_is_isolated_and_torch_free(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    proc = run([str(bin_dir / "python"), "-c", "import asyncrl, importlib.util as u; print(asyncrl.__file__); "
                "print([m for m in ('torch', 'vllm', 'deepspeed') if u.find_spec(m)])"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    first, second = proc.stdout.splitlines()
    assert str(bin_dir.parent) in first and str(ROOT) not in first  # the installed package, not this checkout
    assert second == "[]"
    cfg = (bin_dir.parent / "pyvenv.cfg").read_text()
    assert "include-system-site-packages = false" in cfg


def test_pipeline_compile_from_the_installed_package(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    out = work / "compiled" / "asyncrl.yaml"
    proc = run([str(bin_dir / "asyncrl"), "pipeline", "compile", "--out", str(out)], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert out.read_text() == (ROOT / "asyncrl/cluster/pipeline/asyncrl.yaml").read_text()


def test_validate_the_default_config(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    proc = run([str(bin_dir / "asyncrl"), "validate", str(ROOT / "configs/default.yaml"), "--set",
                "training.steps=3"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert '"steps": 3' in proc.stdout
    bad = run([str(bin_dir / "asyncrl"), "validate", str(ROOT / "configs/default.yaml"), "--set",
               "training.steps=many"], cwd=work)
    assert bad.returncode == 2 and "training.steps" in bad.stderr


@pytest.mark.parametrize("command", subcommands())
def test_help_of_every_subcommand(installed: tuple[Path, Path], command: str) -> None:
    bin_dir, work = installed
    proc = run([str(bin_dir / "asyncrl"), command, "--help"], cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith(f"usage: asyncrl {command}")


def test_upload_finds_the_shipped_pipeline_and_fails_clearly_without_a_cluster(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    proc = run([str(bin_dir / "asyncrl"), "pipeline", "upload", "--host", "http://127.0.0.1:9", "--api-timeout", "20"],
               cwd=work)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "not compiled yet" not in proc.stderr
    assert "Kubeflow Pipelines API at http://127.0.0.1:9" in proc.stderr


def test_task_entrypoint_is_installed(installed: tuple[Path, Path]) -> None:
    bin_dir, work = installed
    ok = run([str(bin_dir / "asyncrl-task"), "--check", "asyncrl.cluster.pipeline.components", "kfp.dsl"], cwd=work)
    assert ok.returncode == 0, ok.stderr
    assert str(bin_dir.parent) in ok.stdout  # its interpreter is the venv's
    helped = run([str(bin_dir / "asyncrl-task"), "asyncrl.cli", "validate", "--help"], cwd=work)
    assert helped.returncode == 0 and helped.stdout.startswith("usage: "), helped.stderr

