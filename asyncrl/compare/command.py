"""`asyncrl compare`: runs side by side from MLflow, as a table, PNG plots and one HTML page.

    asyncrl compare [--experiment E] [--runs ID ...] [--filter "params.rollout.mode = 'sync'"] [--children]
                    [--metric reward/accuracy --metric eval/accuracy] [--x step|samples|wall_s] [--out DIR]
                    [--tracking-uri URI | --runs-dir runs] [--log-to RUN_ID]

The tracking store is `--tracking-uri`, else $MLFLOW_TRACKING_URI, else the embedded runs' store
(`sqlite:///<runs-dir>/mlflow.db`, as `asyncrl run` writes it). Prints the table; writes `<out>/<metric>.png` for
each metric, `<out>/table.tsv`, `<out>/index.html` and `<out>/plots.json` (per plot: each run's line and
its number of points); with `--log-to RUN_ID` logs them as artifacts of that run
(under `compare/`). An experiment's jobs are compared (their runs); `--children` adds their role instances' child
runs (`asyncrl.tracking.child_runs`). Exit 2 with a message naming the option on a bad selection.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import sys
from pathlib import Path
from typing import Any

from asyncrl.compare.table import X_AXES

DEFAULT_METRICS = ["reward/mean", "reward/accuracy", "eval/accuracy"]


def add_parser(sub: Any) -> None:
    p = sub.add_parser("compare", help="compare MLflow runs: a table, one PNG per metric, an HTML page")
    p.add_argument("--experiment", default="asyncrl", help="the MLflow experiment whose runs to compare")
    p.add_argument("--runs", nargs="+", default=[], metavar="RUN_ID", help="compare these runs (any experiment)")
    p.add_argument("--filter", default="", help="an MLflow search filter, e.g. \"params.rollout.mode = 'sync'\"")
    p.add_argument("--children", action="store_true",
                   help="also compare the jobs' child runs (one per role instance: generation-0, ...)")
    p.add_argument("--metric", action="append", default=[],
                   help=f"a metric to compare; repeatable (default: {' '.join(DEFAULT_METRICS)})")
    p.add_argument("--x", choices=X_AXES, default="step", help="the plots' x axis")
    p.add_argument("--out", default="compare", help="folder for the PNGs, table.tsv and index.html")
    p.add_argument("--tracking-uri", default=os.environ.get("MLFLOW_TRACKING_URI", ""),
                   help="the MLflow store (default $MLFLOW_TRACKING_URI, else sqlite:///<runs-dir>/mlflow.db)")
    p.add_argument("--runs-dir", default="runs", help="embedded runs' folder, for the default store")
    p.add_argument("--log-to", default="", metavar="RUN_ID", help="also log the outputs as artifacts of this run")
    p.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))


def main(args: argparse.Namespace) -> None:
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    from asyncrl.compare.fetch import CompareError, load_history, select_runs
    from asyncrl.compare.report import html_page, metric_file_name, plot_metric
    from asyncrl.compare.table import comparison_table, text_table
    from asyncrl.tracking.mlflow_tracker import embedded_tracking_uri

    uri = args.tracking_uri
    if not uri:
        db = Path(args.runs_dir) / "mlflow.db"
        if not db.is_file():
            _fail(f"--runs-dir {args.runs_dir}: no MLflow store {db}; give --tracking-uri or run a job first")
        uri = embedded_tracking_uri(args.runs_dir)
    metrics = list(dict.fromkeys(args.metric or DEFAULT_METRICS))
    client = MlflowClient(tracking_uri=uri)
    try:
        runs = [load_history(client, r, metrics) for r in select_runs(client, args.experiment, args.runs, args.filter,
                                                                 args.children)]
    except CompareError as err:
        _fail(str(err))
    missing = [m for m in metrics if not any(r.history.get(m) for r in runs)]
    if len(missing) == len(metrics):
        logged = sorted({k for r in runs for k in r.latest})
        _fail(f"--metric {' '.join(missing)}: logged by none of the {len(runs)} runs; they log {logged[:40]}")
    header, rows = comparison_table(runs, metrics)
    print(text_table(header, rows))
    for m in missing:
        print(f"note: no run logged {m}", file=sys.stderr)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    plots, drawn = [], {}
    for m in metrics:
        plots.append(out / metric_file_name(m))
        drawn[m] = {"file": plots[-1].name, "x": args.x, "lines": plot_metric(runs, m, args.x, plots[-1])}
    (out / "plots.json").write_text(json.dumps(drawn, indent=2) + "\n")
    (out / "table.tsv").write_text("\n".join("\t".join(r) for r in [header, *rows]) + "\n")
    command = "asyncrl compare " + shlex.join(sys.argv[2:] if sys.argv[1:2] == ["compare"] else [])
    title = f"asyncrl compare: {args.experiment if not args.runs else ', '.join(r.label for r in runs)}"
    (out / "index.html").write_text(html_page(title, command.strip(), header, rows, plots))
    print(f"wrote {len(plots)} plot(s), table.tsv, plots.json and index.html to {out}")
    if args.log_to:
        try:
            for path in [*plots, out / "table.tsv", out / "index.html", out / "plots.json"]:
                client.log_artifact(args.log_to, str(path), artifact_path="compare")
        except MlflowException as err:
            _fail(f"--log-to {args.log_to}: {err.message.splitlines()[0]}")
        print(f"logged them to run {args.log_to} under compare/")


def _fail(message: str) -> None:
    print(f"asyncrl compare: {message}", file=sys.stderr)
    sys.exit(2)
