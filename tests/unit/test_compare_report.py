"""`asyncrl compare`'s plots (asyncrl.compare.report): the legend's shared name prefix, and runs with the same
values all visible in the PNG (each its own colour, line style and hollow marker)."""

from __future__ import annotations

from pathlib import Path

import matplotlib.image
import numpy as np

from asyncrl.compare.report import legend_labels, plot_metric
from asyncrl.compare.table import Point, RunHistory

# matplotlib's first three line colours (the default cycle)
COLOURS = {"C0": (0x1F, 0x77, 0xB4), "C1": (0xFF, 0x7F, 0x0E), "C2": (0x2C, 0xA0, 0x2C)}


def _pixels(png: np.ndarray, rgb: tuple[int, int, int]) -> int:
    pixels = (png[..., :3] * 255).round().astype(int)
    return int((np.abs(pixels - np.array(rgb)).sum(axis=-1) <= 6).sum())


def _run(name: str, run_id: str, values: list[float]) -> RunHistory:
    points = [Point(step, v, 1_000 * step) for step, v in enumerate(values, start=1)]
    return RunHistory(run_id=run_id, name=name, status="FINISHED", start_ms=0, end_ms=10_000,
                      history={"reward/mean": points} if values else {})


def test_legend_labels_drop_the_shared_prefix_once():
    shared, short = legend_labels(["bench-1-sync (aa)", "bench-1-sync_fair (bb)", "bench-1-async_a1 (cc)"])
    assert shared == "bench-1-" and short == ["sync (aa)", "sync_fair (bb)", "async_a1 (cc)"]
    assert legend_labels(["only (aa)"]) == ("", ["only (aa)"])
    assert legend_labels(["alpha (aa)", "beta (bb)"]) == ("", ["alpha (aa)", "beta (bb)"])
    # a prefix that is a whole label would leave it empty: keep the full labels
    assert legend_labels(["a-", "a-b"]) == ("", ["a-", "a-b"])


def test_runs_with_the_same_values_stay_visible(tmp_path: Path):
    values = [0.3, 0.35, 0.32, 0.4, 0.45, 0.42]
    runs = [_run("bench-1-sync", "aaaaaaaa11", values), _run("bench-1-sync_fair", "bbbbbbbb22", values),
            _run("bench-1-async", "cccccccc33", [])]
    out = tmp_path / "reward_mean.png"
    lines = plot_metric(runs, "reward/mean", "step", out)
    assert lines == {"bench-1-sync (aaaaaaaa)": 6, "bench-1-sync_fair (bbbbbbbb)": 6, "bench-1-async (cccccccc)": 0}
    png = matplotlib.image.imread(out)
    assert png.shape[0] > 300 and png.shape[1] > 500
    # the first run lies under the second, same values: its colour still shows (dashes, hollow markers)
    assert _pixels(png, COLOURS["C0"]) >= 100, "the run drawn first is hidden under the second"
    assert _pixels(png, COLOURS["C1"]) >= 100
    assert _pixels(png, COLOURS["C2"]) > 0  # the "(not logged)" run's legend entry
