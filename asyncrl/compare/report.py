"""What `asyncrl compare` writes: one PNG per metric (one line per run) and a self-contained HTML page.

Each PNG plots one metric against the chosen x axis, one labelled line per run (`name (id prefix)`), with axis
labels, a title and a legend; a run that never logged the metric is listed in the legend as "(not logged)" so
its absence is visible. The HTML page holds the table and the plots inline (base64), so it can be mailed or logged
as one artifact. matplotlib runs headless (the Agg backend).
"""

from __future__ import annotations

import base64
import html
import re
from pathlib import Path

from asyncrl.compare.table import X_LABELS, RunHistory, XAxis, series


def metric_file_name(metric: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", metric).strip("_") + ".png"


def plot_metric(runs: list[RunHistory], metric: str, x: XAxis, out: Path) -> dict[str, int]:
    """Write the plot of `metric` to `out`; returns each run's line label with its number of points (0: not
    logged), which `asyncrl compare` records in `plots.json`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    lines: dict[str, int] = {}
    try:
        for run in runs:
            points = series(run, metric, x)
            lines[run.label] = len(points)
            if not points:
                ax.plot([], [], label=f"{run.label} (not logged)")
                continue
            xs, ys = zip(*points, strict=True)
            ax.plot(xs, ys, marker="o" if len(points) <= 30 else None, markersize=3, linewidth=1.6, label=run.label)
        ax.set_xlabel(X_LABELS[x])
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against {X_LABELS[x].split(' since')[0]}")
        ax.grid(True, alpha=0.3)
        ax.legend(fontsize=8, loc="best")
        fig.tight_layout()
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out)
    finally:
        plt.close(fig)
    return lines


def html_page(title: str, command: str, header: list[str], rows: list[list[str]], plots: list[Path]) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in header)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(c)}</td>" for c in row) + "</tr>" for row in rows)
    figures = "".join(
        f'<figure><img alt="{html.escape(p.stem)}" src="data:image/png;base64,'
        f'{base64.b64encode(p.read_bytes()).decode()}"><figcaption>{html.escape(p.stem)}</figcaption></figure>'
        for p in plots)
    return f"""<!doctype html>
<html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse;font-size:13px}}
td,th{{border:1px solid #ccc;padding:3px 6px;text-align:left}}th{{background:#f3f3f3}}
figure{{display:inline-block;margin:1em}}code{{background:#f3f3f3;padding:2px 4px}}</style></head>
<body><h1>{html.escape(title)}</h1><p><code>{html.escape(command)}</code></p>
<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>
{figures}
</body></html>
"""
