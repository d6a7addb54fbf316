"""`make compare`: the runs of the last `benchmarks/async_vs_sync.py` side by side, through `asyncrl compare`.

Reads where that benchmark's runs are (its JSON's `mlflow`: runs folder, experiment, and the filter that selects
the last invocation's runs) and draws reward, accuracy and step time against wall-clock seconds, into
benchmarks/results/compare-async_vs_sync/ (PNGs, table.tsv, index.html).

    .venv/bin/python benchmarks/compare_last_bench.py [--results benchmarks/results/async_vs_sync.json] [--x samples]
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
METRICS = ["reward/mean", "reward/accuracy", "eval/accuracy", "time/step_s", "staleness/mean"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--results", default=str(ROOT / "benchmarks/results/async_vs_sync.json"))
    p.add_argument("--x", default="wall_s", choices=["step", "samples", "wall_s"])
    p.add_argument("--out", default=str(ROOT / "benchmarks/results/compare-async_vs_sync"))
    args = p.parse_args()
    results = json.loads(Path(args.results).read_text())
    where = results.get("mlflow")
    if not where:
        raise SystemExit(f"{args.results}: no `mlflow` section (written by benchmarks/async_vs_sync.py since it logs "
                         "under its own experiment); run `make bench` first")
    cmd = [sys.executable, "-m", "asyncrl.cli", "compare", "--runs-dir", where["runs_dir"], "--experiment",
           where["experiment"], "--filter", where["filter"], "--x", args.x, "--out", args.out]
    for m in METRICS:
        cmd += ["--metric", m]
    print(" ".join(cmd), flush=True)
    raise SystemExit(subprocess.run(cmd, cwd=ROOT).returncode)


if __name__ == "__main__":
    main()
