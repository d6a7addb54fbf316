"""What `asyncrl compare` writes: one PNG per metric (one line per run) and a self-contained HTML page.

Each PNG plots one metric against the chosen x axis, one labelled line per run (`name (id prefix)`), with axis
labels, a title and a legend; a run that never logged the metric is listed in the legend as "(not logged)" so
its absence is visible. Each run has its own colour, line style and (hollow) marker, so runs with the same values
(a sync run and its fair twin train on the same samples) stay visible on top of each other. The legend sits below
the axes, never over the data; the part of the names every run shares (a benchmark's stamp) is its title, once. The HTML page holds the table and the plots inline (base64), so it can be mailed or logged
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


LINE_STYLES = ("-", "--", "-.", ":")
MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*")
_NAME_CUTS = "-_/ ."


def legend_labels(labels: list[str]) -> tuple[str, list[str]]:
    """(shared, short): the prefix every label shares, cut after its last separator (`-_/ .`), and each label
    without it; ("", labels) when there is one label or no shared prefix that leaves every label a rest."""
    if len(labels) < 2:
        return "", list(labels)
    prefix = labels[0]
    for label in labels[1:]:
        while not label.startswith(prefix):
            prefix = prefix[:-1]
    cut = max(prefix.rfind(c) for c in _NAME_CUTS) + 1
    shared = prefix[:cut]
    if not shared or any(len(label) == cut for label in labels):
        return "", list(labels)
    return shared, [label[cut:] for label in labels]


def plot_metric(runs: list[RunHistory], metric: str, x: XAxis, out: Path) -> dict[str, int]:
    """Write the plot of `metric` to `out`; returns each run's line label with its number of points (0: not
    logged), which `asyncrl compare` records in `plots.json`."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=110)
    lines: dict[str, int] = {}
    shared, labels = legend_labels([run.label for run in runs])
    try:
        for i, (run, label) in enumerate(zip(runs, labels, strict=True)):
            points = series(run, metric, x)
            lines[run.label] = len(points)
            style = {"color": f"C{i % 10}", "linestyle": LINE_STYLES[i % len(LINE_STYLES)]}
            if not points:
                ax.plot([], [], label=f"{label} (not logged)", **style)
                continue
            xs, ys = zip(*points, strict=True)
            marker = MARKERS[i % len(MARKERS)] if len(points) <= 30 else None
            ax.plot(xs, ys, marker=marker, markersize=5, fillstyle="none", linewidth=1.6, label=label, **style)
        ax.set_xlabel(X_LABELS[x])
        ax.set_ylabel(metric)
        ax.set_title(f"{metric} against {X_LABELS[x].split(' since')[0]}")
        ax.grid(True, alpha=0.3)
        widest = max((len(label) for label in labels), default=1) + 8
        columns = max(1, min(4, 100 // widest))
        rows = -(-len(labels) // columns)
        ax.legend(fontsize=8, title=f"{shared}…" if shared else None, title_fontsize=8, loc="upper center",
                  bbox_to_anchor=(0.5, -0.14), ncol=-(-len(labels) // rows), frameon=False)
        out.parent.mkdir(parents=True, exist_ok=True)
        fig.savefig(out, bbox_inches="tight")
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
