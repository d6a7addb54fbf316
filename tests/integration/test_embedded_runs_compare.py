"""`asyncrl compare` on two real embedded runs (the smoke run and the algorithms run of this session, in one MLflow
store: tests/integration/conftest.py): the table has a row per run and names the parameters that differ, each PNG
decodes and shows both runs' lines in their own colours, plots.json says which lines each plot drew, the HTML page
holds the table and every plot inline, and `--log-to` logs them as artifacts of a run; the runs' role instances'
child runs are left out unless `--children` asks for them."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import matplotlib.image
import mlflow
import numpy as np
import pytest

from tests.integration.conftest import ALGORITHMS_RUN_ID, SMOKE_RUN_ID, mlflow_run

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
# matplotlib's first two line colours (the default cycle): one per run
LINE_COLOURS = {"C0": (0x1F, 0x77, 0xB4), "C1": (0xFF, 0x7F, 0x0E)}


def _has_colour(png: np.ndarray, rgb: tuple[int, int, int], min_pixels: int = 30) -> bool:
    pixels = (png[..., :3] * 255).round().astype(int)
    return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) <= 6).sum()) >= min_pixels


def test_compare_two_real_runs(smoke_run, algorithms_run, tmp_path):
    runs_dir = algorithms_run.parent
    assert smoke_run[0].parent == runs_dir
    smoke = mlflow_run(runs_dir, SMOKE_RUN_ID)
    out = tmp_path / "compare"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "compare", "--runs-dir", str(runs_dir), "--experiment", "asyncrl",
         "--metric", "reward/mean", "--metric", "train/loss", "--x", "samples", "--out", str(out),
         "--log-to", smoke.info.run_id], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    table = (out / "table.tsv").read_text().splitlines()
    header = table[0].split("\t")
    rows = {r.split("\t")[0].split(" (")[0]: dict(zip(header, r.split("\t"), strict=True)) for r in table[1:]}
    assert set(rows) == {SMOKE_RUN_ID, ALGORITHMS_RUN_ID}
    assert "training.loss" in header  # the algorithms run uses CISPO, the smoke run the default loss
    assert rows[ALGORITHMS_RUN_ID]["training.loss"] == "cispo"
    assert rows[ALGORITHMS_RUN_ID]["steps"] == "3" and rows[ALGORITHMS_RUN_ID]["status"] == "FINISHED"
    assert float(rows[SMOKE_RUN_ID]["samples/s"]) > 0
    for name in rows:  # the terminal table too
        assert name in proc.stdout

    drawn = json.loads((out / "plots.json").read_text())
    assert set(drawn) == {"reward/mean", "train/loss"}
    for metric, plot in drawn.items():
        assert len(plot["lines"]) == 2, metric
        assert all(n >= 2 for n in plot["lines"].values()), (metric, plot["lines"])
        png = matplotlib.image.imread(out / plot["file"])
        assert png.shape[0] > 300 and png.shape[1] > 500
        assert all(_has_colour(png, rgb) for rgb in LINE_COLOURS.values()), metric

    page = (out / "index.html").read_text()
    assert page.count("data:image/png;base64,") == 2 and SMOKE_RUN_ID in page and "training.loss" in page

    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{runs_dir / 'mlflow.db'}")
    logged = {Path(a.path).name for a in client.list_artifacts(smoke.info.run_id, "compare")}
    assert {"reward_mean.png", "train_loss.png", "table.tsv", "index.html", "plots.json"} <= logged


def test_compare_children_adds_the_role_instances_runs(smoke_run, algorithms_run, tmp_path):
    out = tmp_path / "children"
    proc = subprocess.run(
        [sys.executable, "-m", "asyncrl.cli", "compare", "--runs-dir", str(algorithms_run.parent), "--children",
         "--filter", "tags.`asyncrl.role` = 'generation'", "--metric", "generation/tokens_generated", "--out",
         str(out)], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    names = {r.split("\t")[0].split(" (")[0] for r in (out / "table.tsv").read_text().splitlines()[1:]}
    assert names == {f"{SMOKE_RUN_ID}/generation-0", f"{ALGORITHMS_RUN_ID}/generation-0"}


def test_compare_names_a_bad_selection(smoke_run, tmp_path):
    runs_dir = smoke_run[0].parent
    for args, expected in ((["--experiment", "no-such"], "--experiment 'no-such': no such experiment"),
                           (["--runs", "0123456789abcdef"], "--runs 0123456789abcdef: no such MLflow run"),
                           (["--metric", "no/such"], "--metric no/such: logged by none of the")):
        proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "compare", "--runs-dir", str(runs_dir),
                               "--out", str(tmp_path / "x"), *args], cwd=ROOT, capture_output=True, text=True,
                              timeout=300)
        assert proc.returncode == 2 and expected in proc.stderr, (args, proc.stderr[-2000:])
