"""`asyncrl run` / `asyncrl validate` with a bad configuration: exit code 2, the message naming the file / field and
what was expected on stderr, no traceback, nothing started (a subprocess each, as a user runs it)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]

CASES = [
    ("training:\n  lr: 0.1\n  steps: [1\nrollout:\n  x: 1\n", "run",
     "bad.yaml:4:8: not valid YAML: expected ',' or ']', but got ':'"),
    ("training:\n  lr: abc\n", "run", "training.lr: Input should be a valid number"),
    ("training:\n  lrr: 0.1\n", "run", "training.lrr: unknown field; did you mean 'training.lr'?"),
    ("training:\n  micro_batch_size: 7\n", "run",
     "training.micro_batch_size: expected a divisor of the batch of 64 samples, got 7"),
    ("training:\n  loss: ppoo\n", "validate", "training.loss: Input should be 'ppo', 'decoupled_ppo', 'tis', 'cispo', "
     "'topr' or 'gspo' (got 'ppoo'); did you mean 'ppo'?"),
    ("env:\n  name: nope\n", "run", "env.name: unknown environment 'nope'; expected one of ['frozenlake', "
     "'sokoban', 'tool_use', 'remote']"),
]


@pytest.mark.parametrize(("text", "command", "expected"), CASES)
def test_bad_config_exits_2_with_the_message(tmp_path: Path, text: str, command: str, expected: str) -> None:
    cfg = tmp_path / "bad.yaml"
    cfg.write_text(text)
    r = subprocess.run([sys.executable, "-m", "asyncrl.cli", command, "bad.yaml", "--set", f"runs_dir={tmp_path}/runs"],
                       cwd=tmp_path, env={**os.environ, "PYTHONPATH": str(ROOT)}, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 2, (r.returncode, r.stderr[-2000:])
    assert expected in r.stderr, r.stderr
    assert "Traceback" not in r.stderr
    assert not (tmp_path / "runs").exists()  # nothing started
