"""reasoning-gym's own venv, and running the generator script in it (`asyncrl.tasks.rgym_generate`).

reasoning-gym has many dependencies that asyncrl's environment must not carry, so it lives in a venv of its own,
`<cache_dir>/reasoning-gym-venv`, created on first use (`python -m venv` with this interpreter, then `pip install
reasoning-gym==<pinned>`), and asyncrl talks to it only through a subprocess: a JSON request on stdin, JSON Lines on
stdout (never pickle), under a deadline.

Invariants:
- the venv is used only once its marker file holds the pinned requirement, written after pip and an import check
  succeeded; a venv without it (a build that died, another version) is removed and built again;
- one process builds it at a time (an exclusive lock file beside it, waited on with a deadline); the others then find
  it ready;
- every subprocess has a deadline (the build `VENV_DEADLINE_S`, a generation `GENERATE_DEADLINE_S`); a failure or a
  timeout is a `DatasetError` that names `task.dataset`, what was run and the tail of its output;
- the generator runs with `-I` (isolated: neither the script's folder nor PYTHON* variables reach its sys.path), so
  it imports nothing of asyncrl.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.rgym_splits import GENERATOR

log = logging.getLogger(__name__)

VENV_NAME = "reasoning-gym-venv"
READY = ".asyncrl-ready"
VENV_DEADLINE_S = 1200.0
GENERATE_DEADLINE_S = 600.0
LOCK_POLL_S = 1.0
TAIL_CHARS = 2000
SCRIPT = Path(__file__).with_name("rgym_generate.py")


def venv_dir(cache_dir: str | Path) -> Path:
    return Path(cache_dir).expanduser().resolve() / VENV_NAME


def venv_python(venv: Path) -> Path:
    return venv / "bin" / "python"


def is_ready(venv: Path) -> bool:
    marker = venv / READY
    return marker.is_file() and marker.read_text().strip() == GENERATOR and venv_python(venv).exists()


def _tail(text: str) -> str:
    return text[-TAIL_CHARS:].strip()


def _run(argv: list[str], deadline_s: float, what: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(argv, input=stdin, capture_output=True, text=True, timeout=deadline_s)
    except subprocess.TimeoutExpired:
        raise DatasetError(f"task.dataset: {what} took longer than {deadline_s:.0f}s: {' '.join(argv)}") from None
    except OSError as err:
        raise DatasetError(f"task.dataset: {what}: cannot run {argv[0]}: {err}") from None
    return done


@contextlib.contextmanager
def _lock(path: Path, deadline_s: float) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        until = time.monotonic() + deadline_s
        while True:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > until:
                    raise DatasetError(f"task.dataset: {path}: another process held the reasoning-gym venv's lock "
                                       f"for over {deadline_s:.0f}s") from None
                time.sleep(LOCK_POLL_S)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def ensure_venv(cache_dir: str | Path, deadline_s: float = VENV_DEADLINE_S) -> Path:
    """The python of reasoning-gym's venv under `cache_dir`, built first when it is not ready (see the module
    docstring); `DatasetError` when it cannot be built."""
    venv = venv_dir(cache_dir)
    if is_ready(venv):
        return venv_python(venv)
    with _lock(venv.with_name(VENV_NAME + ".lock"), deadline_s):
        if is_ready(venv):  # another process built it while this one waited
            return venv_python(venv)
        if venv.exists():
            shutil.rmtree(venv)
        log.warning("creating reasoning-gym's venv %s (pip install %s; a few minutes, once)", venv, GENERATOR)
        t0 = time.monotonic()
        made = _run([sys.executable, "-m", "venv", str(venv)], deadline_s, "creating the reasoning-gym venv")
        if made.returncode != 0:
            raise DatasetError(f"task.dataset: `{sys.executable} -m venv {venv}` failed (exit {made.returncode}): "
                               f"{_tail(made.stderr + made.stdout)}")
        python = str(venv_python(venv))
        left = max(1.0, deadline_s - (time.monotonic() - t0))
        pip = _run([python, "-m", "pip", "install", "--disable-pip-version-check", "-q", GENERATOR], left,
                   f"pip install {GENERATOR}")
        if pip.returncode != 0:
            raise DatasetError(f"task.dataset: pip install {GENERATOR} into {venv} failed (exit {pip.returncode}; "
                               f"the first use of a reasoning_gym task needs PyPI): {_tail(pip.stderr + pip.stdout)}")
        check = _run([python, "-I", "-c", "import reasoning_gym"], 300.0, "importing reasoning_gym")
        if check.returncode != 0:
            raise DatasetError(f"task.dataset: {GENERATOR} was installed into {venv} but does not import: "
                               f"{_tail(check.stderr)}")
        (venv / READY).write_text(GENERATOR + "\n")
        log.warning("reasoning-gym's venv is ready (%.0fs)", time.monotonic() - t0)
    return venv_python(venv)


class GeneratorError(Exception):
    """The generator's own report of a failure: {"error": kind, "message": ...} plus the kind's details."""

    def __init__(self, kind: str, message: str, details: dict[str, Any]) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind, self.message, self.details = kind, message, details


def parse_output(stdout: str, num_jobs: int) -> list[list[dict[str, Any]]]:
    """Pure: the entries of each job from the generator's JSON Lines (see `asyncrl.tasks.rgym_generate`);
    `GeneratorError` for its error line, `ValueError` for output it cannot have written (truncated, not JSON)."""
    jobs: list[list[dict[str, Any]]] = [[] for _ in range(num_jobs)]
    done = False
    for number, line in enumerate(stdout.splitlines(), start=1):
        try:
            doc = json.loads(line)
        except ValueError:
            raise ValueError(f"line {number} is not JSON: {line[:200]!r}") from None
        if not isinstance(doc, dict):
            raise ValueError(f"line {number}: expected a JSON object, got {line[:200]!r}")
        if "error" in doc:
            raise GeneratorError(str(doc["error"]), str(doc.get("message", "")),
                                 {k: v for k, v in doc.items() if k not in ("error", "message")})
        if doc.get("done") is True:
            done = True
            continue
        job = doc.get("job")
        if done or not isinstance(job, int) or not 0 <= job < num_jobs:
            raise ValueError(f"line {number}: expected a row of job 0..{num_jobs - 1} before the last line, got "
                             f"{line[:200]!r}")
        jobs[job].append(doc)
    if not done:
        raise ValueError("the output ended before its last line {\"done\": true} (the generator stopped early)")
    return jobs


def run_generator(python: Path, request: dict[str, Any], deadline_s: float = GENERATE_DEADLINE_S
                  ) -> list[list[dict[str, Any]]]:
    """Run the generator script in reasoning-gym's venv on `request`; the entries of each of its jobs.
    `GeneratorError` when the generator reports one, `DatasetError` when it fails otherwise or times out."""
    done = _run([str(python), "-I", str(SCRIPT)], deadline_s, f"generating reasoning-gym {request['dataset']!r}",
                stdin=json.dumps(request))
    try:
        return parse_output(done.stdout, len(request["jobs"]))
    except GeneratorError:
        raise
    except ValueError as err:
        raise DatasetError(f"task.dataset: the reasoning-gym generator ({python} -I {SCRIPT}, exit "
                           f"{done.returncode}) gave no usable output: {err}; {_tail(done.stderr)}") from None
