"""What `asyncrl compare` computes from the runs' histories: series against an x axis, the comparison table.

Pure: no MLflow, no files. `RunHistory` is one run as read from MLflow (`asyncrl.compare.fetch`); `series` turns one
metric of one run into (x, value) points against the training step, the samples trained so far, or the wall-clock
seconds since the run started; `comparison_table` gives one row per run with each metric's final and best value, the
run's samples/s, mean staleness and wall time, and the parameters whose values differ between the runs.

Invariants: points are ordered by step, one per step (MLflow may hold a step twice after a replay or a resume: the
later value wins); "best" is the highest value, except for metrics whose name says lower is better (`loss`, `kl`,
`staleness`, `time/`, `dropped`), where it is the lowest; a metric a run never logged shows as missing, not as 0.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Literal

XAxis = Literal["step", "samples", "wall_s"]
X_AXES: tuple[XAxis, ...] = ("step", "samples", "wall_s")
X_LABELS = {"step": "training step", "samples": "samples trained", "wall_s": "wall-clock seconds since the run started"}
# per-step metrics the training role logs, from which the samples trained so far are rebuilt when a run has no
# `progress/samples_trained` (runs from before it was logged)
SAMPLES_TOTAL = "progress/samples_trained"
THROUGHPUT, STEP_TIME = "throughput/samples_per_s", "time/step_s"
LOWER_IS_BETTER = ("loss", "kl", "staleness", "time/", "dropped")
# parameters that differ between any two runs by construction: not a difference of the experiment
IGNORED_PARAMS = ("run_id", "runs_dir")
IGNORED_PARAM_PREFIXES = ("storage.", "tracking.")


@dataclass(frozen=True)
class Point:
    step: int
    value: float
    timestamp_ms: int


@dataclass
class RunHistory:
    """One run: its identity, parameters, last values, and the per-step history of the metrics asked for."""

    run_id: str
    name: str
    status: str
    start_ms: int
    end_ms: int | None
    params: dict[str, str] = field(default_factory=dict)
    latest: dict[str, float] = field(default_factory=dict)  # the run's last value of every metric
    history: dict[str, list[Point]] = field(default_factory=dict)

    @property
    def label(self) -> str:
        return f"{self.name} ({self.run_id[:8]})"

    @property
    def wall_s(self) -> float | None:
        return (self.end_ms - self.start_ms) / 1000.0 if self.end_ms else None


def lower_is_better(metric: str) -> bool:
    return any(word in metric for word in LOWER_IS_BETTER)


def by_step(points: list[Point]) -> list[Point]:
    """One point per step, in step order; of two points at one step, the later-logged wins."""
    last: dict[int, Point] = {}
    for p in sorted(points, key=lambda p: (p.step, p.timestamp_ms)):
        last[p.step] = p
    return [last[s] for s in sorted(last)]


def samples_by_step(run: RunHistory) -> dict[int, float]:
    """Samples trained up to and including each step: `progress/samples_trained` where logged, else rebuilt as the
    running sum of throughput × step time (both logged every step)."""
    logged = by_step(run.history.get(SAMPLES_TOTAL, []))
    if logged:
        return {p.step: p.value for p in logged}
    rate = {p.step: p.value for p in by_step(run.history.get(THROUGHPUT, []))}
    seconds = {p.step: p.value for p in by_step(run.history.get(STEP_TIME, []))}
    total, out = 0.0, {}
    for step in sorted(set(rate) & set(seconds)):
        total += rate[step] * seconds[step]
        out[step] = round(total)
    return out


def series(run: RunHistory, metric: str, x: XAxis) -> list[tuple[float, float]]:
    """(x, value) points of `metric` in `run`; NaN values and steps with no x (no samples count) are left out."""
    points = [p for p in by_step(run.history.get(metric, [])) if not math.isnan(p.value)]
    if x == "step":
        return [(float(p.step), p.value) for p in points]
    if x == "wall_s":
        return [((p.timestamp_ms - run.start_ms) / 1000.0, p.value) for p in points]
    samples = samples_by_step(run)
    return [(samples[p.step], p.value) for p in points if p.step in samples]


def final_and_best(run: RunHistory, metric: str) -> tuple[float | None, float | None]:
    points = [p.value for p in by_step(run.history.get(metric, [])) if not math.isnan(p.value)]
    if not points:
        return None, None
    return points[-1], (min(points) if lower_is_better(metric) else max(points))


def differing_params(runs: list[RunHistory]) -> list[str]:
    """The parameter names whose values are not the same in every run (absent counts as a value), sorted."""
    keys = sorted({k for r in runs for k in r.params})
    out = []
    for k in keys:
        if k in IGNORED_PARAMS or k.endswith(tuple(f".{i}" for i in IGNORED_PARAMS)) or k.startswith(IGNORED_PARAM_PREFIXES):
            continue
        if len({r.params.get(k) for r in runs}) > 1:
            out.append(k)
    return out


def _first(latest: dict[str, float], *names: str) -> float | None:
    for n in names:
        if n in latest and not math.isnan(latest[n]):
            return latest[n]
    return None


def comparison_table(runs: list[RunHistory], metrics: list[str]) -> tuple[list[str], list[list[str]]]:
    """(header, rows): per run its label and status, each metric's final and best value, samples/s (steady state
    where the run's summary has it), mean staleness, wall time, then the parameters that differ between runs."""
    params = differing_params(runs)
    header = ["run", "status", "steps"]
    for m in metrics:
        header += [f"{m} final", f"{m} best"]
    header += ["samples/s", "staleness mean", "wall s", *params]
    rows = []
    for r in runs:
        steps = max((p.step for pts in r.history.values() for p in pts), default=None)
        row = [r.label, r.status, _fmt(steps)]
        for m in metrics:
            final, best = final_and_best(r, m)
            row += [_fmt(final), _fmt(best)]
        row += [_fmt(_first(r.latest, "steady_samples_per_s", "samples_per_s", THROUGHPUT)),
                _fmt(_first(r.latest, "staleness_mean", "staleness/mean")), _fmt(r.wall_s)]
        row += [r.params.get(k, "—") for k in params]
        rows.append(row)
    return header, rows


def _fmt(v: float | int | None) -> str:
    if v is None:
        return "—"
    if isinstance(v, int) or float(v).is_integer() and abs(v) >= 1:
        return str(int(v))
    return f"{v:.4g}"


def text_table(header: list[str], rows: list[list[str]]) -> str:
    """A fixed-width table for the terminal."""
    widths = [max(len(h), *(len(r[i]) for r in rows)) for i, h in enumerate(header)] if rows else [len(h) for h in header]
    lines = ["  ".join(h.ljust(w) for h, w in zip(header, widths, strict=True)),
             "  ".join("-" * w for w in widths)]
    lines += ["  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)) for r in rows]
    return "\n".join(lines)
