"""The images' one entrypoint `asyncrl-task` (asyncrl/task_entrypoint.py): what it runs, how it fails, and that every
task of the compiled pipeline starts through it in an image whose Dockerfile installs and checks it (the finalize
step, a KFP Python component, through the `python3` its generated command names, checked in the light image)."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from asyncrl.cluster.pipeline import COMPILED
from asyncrl.cluster.rehearsal import load_compiled, resolve_parameters, task_commands
from tests.unit.test_dockerfiles import DOCKER, stages
from tests.unit.test_rehearsal import CONFIG_MAPS, SECRETS

ROOT = Path(__file__).resolve().parents[2]


def entrypoint(*args: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "asyncrl.task_entrypoint", *args], cwd=cwd, capture_output=True,
                          text=True, timeout=60)


def test_console_script_is_declared() -> None:
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert scripts["asyncrl-task"] == "asyncrl.task_entrypoint:main"


def test_runs_the_module_as_python_minus_m(tmp_path: Path) -> None:
    """The module runs as __main__ in a process that replaced the entrypoint (same pid), with its arguments as given,
    and its exit code is the process's."""
    (tmp_path / "probe_mod.py").write_text(
        "import json, os, sys\n"
        "print(json.dumps({'name': __name__, 'argv': sys.argv[1:], 'pid': os.getpid(), 'exe': sys.executable}))\n"
        "sys.exit(7)\n")
    proc = subprocess.Popen([sys.executable, "-m", "asyncrl.task_entrypoint", "probe_mod", "--id", "0", "a b"],
                            cwd=tmp_path, stdout=subprocess.PIPE, text=True,
                            env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    out, _ = proc.communicate(timeout=60)
    assert proc.returncode == 7
    doc = json.loads(out)
    assert doc == {"name": "__main__", "argv": ["--id", "0", "a b"], "pid": proc.pid, "exe": sys.executable}


def test_unknown_module_is_a_clear_error_before_anything_runs() -> None:
    proc = entrypoint("asyncrl.roles.no_such_role", "--id", "0")
    assert proc.returncode == 2 and "module 'asyncrl.roles.no_such_role' is not installed for" in proc.stderr
    bad = entrypoint("--id")
    assert bad.returncode == 2 and "'--id' is not a module name" in bad.stderr
    empty = entrypoint()
    assert empty.returncode == 2 and "usage: asyncrl-task MODULE" in empty.stderr


def test_check_mode() -> None:
    ok = entrypoint("--check", "asyncrl.cluster.finalize", "asyncrl.roles.reward")
    assert ok.returncode == 0 and "found" in ok.stdout
    bad = entrypoint("--check", "asyncrl.cluster.finalize", "no_such_pkg.mod")
    assert bad.returncode == 2 and "no_such_pkg.mod" in bad.stderr and "asyncrl.cluster.finalize" not in bad.stderr
    assert entrypoint("--check").returncode == 2


def checked_in_final_stage(dockerfile: str) -> tuple[set[str], set[str]]:
    """The modules the final stage's RUN lines check with `asyncrl-task --check` and with
    `python3 -m asyncrl.task_entrypoint --check` (the latter: what the `python3` on PATH finds)."""
    by_entrypoint: set[str] = set()
    by_python3: set[str] = set()
    for ins, args in stages(DOCKER / dockerfile)[-1]:
        if ins != "RUN":
            continue
        for cmd in args.split("&&"):
            words = cmd.split()
            if words[:2] == ["asyncrl-task", "--check"]:
                by_entrypoint.update(words[2:])
            if words[:4] == ["python3", "-m", "asyncrl.task_entrypoint", "--check"]:
                by_python3.update(words[4:])
    return by_entrypoint, by_python3


@pytest.fixture(scope="module")
def tasks():
    spec, platform = load_compiled(COMPILED)
    params = resolve_parameters(spec, {})
    return task_commands(spec, platform, params, "kfp-run-1", secrets=SECRETS,
                         config_maps=CONFIG_MAPS, outputs={}, defer_outputs=True)


def dockerfile_of(image: str) -> str:
    m = re.search(r"asyncrl-(generation|training|light)(?::|@|$)", image)
    assert m, f"image {image!r}: expected one of the asyncrl-{{generation,training,light}} images"
    return f"{m[1]}.Dockerfile"


def test_every_container_task_starts_through_the_entrypoint_its_image_checks(tasks) -> None:
    seen = set()
    for t in tasks:
        if t.role == "finalize":
            continue
        assert t.command[0] == "asyncrl-task" and len(t.command) == 2, f"{t.name}: command {t.command}"
        module = t.command[1]
        dockerfile = dockerfile_of(t.image)
        by_entrypoint, _ = checked_in_final_stage(dockerfile)
        assert module in by_entrypoint, f"{t.name}: {dockerfile} does not check `asyncrl-task --check {module}`"
        if module == "torch.distributed.run":
            module = t.args[t.args.index("-m") + 1]
            assert module in by_entrypoint, f"{t.name}: {dockerfile} does not check {module}"
        seen.add((t.role, dockerfile))
    assert seen == {("setup", "light.Dockerfile"), ("generation", "generation.Dockerfile"),
                    ("training", "training.Dockerfile"), ("reward", "light.Dockerfile"),
                    ("environment", "light.Dockerfile")}


def test_finalize_python_component_interpreter_is_checked_in_the_light_image(tasks) -> None:
    """finalize is a KFP Python component: KFP generates its command (`sh -ec ... python3 -m
    kfp.dsl.executor_main`), so it cannot name asyncrl-task; its `python3` must be the light image's venv
    interpreter with kfp and asyncrl, which the light Dockerfile checks at build time."""
    (final,) = [t for t in tasks if t.role == "finalize"]
    assert final.command[:2] == ("sh", "-ec")
    assert re.search(r"\bpython3 -m kfp\.dsl\.executor_main\b", final.command[2]), final.command[2]
    assert '"-m", "asyncrl.cluster.finalize"' in final.command[3]  # the body runs finalize with that interpreter
    dockerfile = dockerfile_of(final.image)
    assert dockerfile == "light.Dockerfile"
    _, by_python3 = checked_in_final_stage(dockerfile)
    assert {"kfp.dsl.executor_main", "asyncrl.cluster.finalize"} <= by_python3


@pytest.mark.parametrize("dockerfile", ["generation.Dockerfile", "training.Dockerfile", "light.Dockerfile"])
def test_each_dockerfile_installs_the_wheel_with_the_entrypoint(dockerfile: str) -> None:
    """The console script comes with the asyncrl package (pip install of the wheel or the source tree), and the
    final stage puts it on PATH: a stage copying /opt/venv sets PATH to /opt/venv/bin before the check runs."""
    text = (DOCKER / dockerfile).read_text()
    assert re.search(r"pip install [^\n]*(/src\b|asyncrl-[\d.]+-py3-none-any\.whl)", text), dockerfile
    final = stages(DOCKER / dockerfile)[-1]
    order = [ins for ins, _ in final]
    check_at = next(i for i, (ins, args) in enumerate(final) if ins == "RUN" and "asyncrl-task --check" in args)
    if any(ins == "COPY" and "/opt/venv" in args for ins, args in final):
        path_at = next(i for i, (ins, args) in enumerate(final) if ins == "ENV" and "PATH=/opt/venv/bin:" in args)
        assert path_at < check_at, f"{dockerfile}: PATH must hold /opt/venv/bin before the check ({order})"
