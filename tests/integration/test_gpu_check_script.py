"""scripts/gpu_check.py, the one-GPU check of the trainer's and the weight sync's CUDA paths, on the CPU: the same code
with gloo and no CUDA (its NCCL checks say they were skipped), so the script still runs when a GPU machine is lent."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_gpu_check_runs_on_the_cpu(tmp_path: Path) -> None:
    out = tmp_path / "gpu_check.json"
    env = {**os.environ, "TORCH_EXTENSIONS_DIR": str(REPO / ".cache/torch_extensions")}
    proc = subprocess.run([sys.executable, "scripts/gpu_check.py", "--device", "cpu", "--zero-stages", "0", "3",
                           "--steps", "2", "--out", str(out)], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    checks = {c["check"]: c for c in json.loads(out.read_text())["checks"]}
    assert sorted(checks) == ["nccl_two_ranks_one_gpu", "nccl_world1", "push_gloo", "train_zero0", "train_zero3",
                              "train_zero_consistency"]
    assert checks["nccl_world1"]["skipped"] == "no CUDA"
    assert all(p["checksum_match"] for p in checks["push_gloo"]["pushes"].values())
    assert checks["train_zero3"]["changed_fraction"] == 1.0
    assert checks["train_zero_consistency"]["zero3_vs_zero0"]["logprobs_end"] < 2e-3
