"""The `asyncrl` command: run a job on this machine, build the built-in model, validate a configuration.

    asyncrl run configs/default.yaml [--set section.key=value ...]
    asyncrl build-model configs/default.yaml
    asyncrl validate configs/default.yaml [--set ...]    # prints the resolved configuration as JSON
    asyncrl simulate [--preset gpu-7b] [--set key=value ...] [--json PATH]   # simulated cluster (asyncrl.sim)
    asyncrl pipeline compile|upload|run [...]           # Kubeflow Pipelines (asyncrl.cluster.pipeline_cli)
    asyncrl plan --gpus 64 --model-size 7e9 --median-tokens 3000 --max-tokens 32768
    asyncrl sandbox-check                                # what isolates a tool call on this host (asyncrl.sandbox)
    asyncrl compare [--experiment E] [--runs ID ...] [--metric M ...] [--x step|samples|wall_s]   # asyncrl.compare
    asyncrl tracking replay --run-url s3://B/P/RUN [--end FINISHED]   # a run's leftover tracking spool to MLflow
    asyncrl model import SOURCE --out DIR [--dtype float32|bfloat16] [--no-check] [--force]   # a GGUF -> model folder
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import sys
from pathlib import Path

from asyncrl.config import ConfigError, RunConfig, load_config


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="asyncrl", description="Fully asynchronous RL post-training for language models")
    sub = p.add_subparsers(dest="command", required=True)
    for name, help_ in [("run", "run a job on this machine (embedded S3, MLflow, all roles as processes)"),
                        ("build-model", "build (or find cached) the built-in tiny model and its warm start"),
                        ("validate", "validate a configuration and print it resolved")]:
        s = sub.add_parser(name, help=help_)
        s.add_argument("config", nargs="?", default=None, help="YAML configuration (default: built-in defaults)")
        s.add_argument("--set", dest="overrides", action="append", default=[], metavar="SECTION.KEY=VALUE",
                       help="override one field; repeatable")
        s.add_argument("--log-level", default=os.environ.get("ASYNCRL_LOG_LEVEL", "WARNING"))
        if name == "run":
            s.add_argument("--resume", default="", metavar="RUN_ID",
                           help="continue the run RUN_ID (a folder under runs_dir) from its last committed checkpoint; "
                                "its own configuration is used (give no CONFIG and no --set, except runs_dir)")
    sub.add_parser("sandbox-check", help="print what isolation a tool call gets on this host (exit 1: none)")
    from asyncrl.cluster.pipeline_cli import add_parser
    from asyncrl.compare.command import add_parser as add_compare_parser
    from asyncrl.models.import_command import add_parser as add_model_parser
    from asyncrl.run.replay_command import add_parser as add_tracking_parser
    from asyncrl.sim.commands import add_parsers

    add_parsers(sub)
    add_parser(sub)
    add_compare_parser(sub)
    add_tracking_parser(sub)
    add_model_parser(sub)
    return p


def _load(args: argparse.Namespace) -> RunConfig:
    try:
        return load_config(args.config, args.overrides)
    except ConfigError as err:
        print(f"asyncrl: {err}", file=sys.stderr)
        sys.exit(2)


def _resume(args: argparse.Namespace) -> None:
    from asyncrl.local.launcher import run_embedded
    from asyncrl.run.resume import ResumeError, load_run_config

    extra = [o for o in args.overrides if not o.startswith("runs_dir=")]
    if args.config or extra:
        print(f"asyncrl run --resume: a resumed run keeps its own configuration; got "
              f"{args.config or ''} {' '.join(extra)}".rstrip(), file=sys.stderr)
        sys.exit(2)
    runs_dir = next((o.split("=", 1)[1] for o in args.overrides if o.startswith("runs_dir=")), RunConfig().runs_dir)
    try:
        cfg = load_run_config(runs_dir, args.resume)
    except (ResumeError, ConfigError) as err:
        print(f"asyncrl run: {err}", file=sys.stderr)
        sys.exit(2)
    _stop_on_signals()
    run_embedded(cfg, resume=True)


def _sigterm_as_interrupt(signum: int, frame: object) -> None:
    raise KeyboardInterrupt


def _stop_on_signals() -> None:
    """SIGINT and SIGTERM stop a run (every role, then exit 130). SIGINT explicitly: a process started in the
    background by a shell without job control inherits SIGINT ignored, and Python then installs no handler, so
    `kill -INT` (or a CI's Ctrl-C) would be dropped while the run went on."""
    signal.signal(signal.SIGINT, signal.default_int_handler)
    signal.signal(signal.SIGTERM, _sigterm_as_interrupt)


def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    if args.command == "sandbox-check":
        from asyncrl.sandbox.check import main as sandbox_check

        sys.exit(sandbox_check())
    logging.basicConfig(level=getattr(logging, args.log_level.upper(), logging.WARNING),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("asyncrl.models").setLevel(min(logging.INFO, logging.getLogger().level))
    for noisy in ("httpx", "httpcore", "botocore", "urllib3", "mlflow"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, logging.getLogger().level))
    if args.command == "compare":
        from asyncrl.compare.command import main as compare_main

        compare_main(args)
        return
    if args.command == "model":
        from asyncrl.models.import_command import run_import, run_merge

        sys.exit(run_merge(args) if args.model_command == "merge" else run_import(args))
    if args.command == "pipeline":
        from asyncrl.cluster.pipeline_cli import main as pipeline_main

        pipeline_main(args)
        return
    if args.command == "tracking":
        from asyncrl.run.replay_command import main as tracking_main

        try:
            sys.exit(tracking_main(args))
        except ValueError as err:
            print(f"asyncrl tracking {args.tracking_command}: {err}", file=sys.stderr)
            sys.exit(2)
    if args.command in ("simulate", "plan"):
        from asyncrl.sim.commands import run_plan, run_simulate

        try:
            (run_simulate if args.command == "simulate" else run_plan)(args)
        except ValueError as err:
            print(f"asyncrl {args.command}: {err}", file=sys.stderr)
            sys.exit(2)
        return
    if args.command == "run" and args.resume:
        _resume(args)
        return
    cfg = _load(args)
    if args.command in ("run", "build-model") and cfg.model.path and not cfg.model.path.startswith("s3://"):
        from asyncrl.models.folder import ModelFolderError, check_model_folder

        try:  # before anything starts: a model folder missing files is a config error, not a crash
            check_model_folder(Path(cfg.model.path))
        except ModelFolderError as err:
            print(f"asyncrl: {err}", file=sys.stderr)
            sys.exit(2)
    if cfg.env is None and cfg.task.name in ("jsonl", "reasoning_gym", "file"):
        from asyncrl.tasks.dataset_check import check_dataset
        from asyncrl.tasks.jsonl import DatasetError

        # the files are read (reasoning-gym rows generated) here, before any process starts; a run's roles then read
        # its copy of the rows (reasoning_gym, file) or re-read the files (jsonl)
        try:
            check_dataset(cfg)
        except DatasetError as err:
            print(f"asyncrl: {err}", file=sys.stderr)
            sys.exit(2)
    if args.command == "validate":
        print(json.dumps(cfg.model_dump(mode="json"), indent=2))
        try:
            from asyncrl.tasks.preview import prompt_preview
        except ImportError as err:  # the bare package (no `roles` extra) validates without a tokenizer
            print(f"asyncrl: no prompt preview: {err.name} is not installed (pip install 'asyncrl[roles]')",
                  file=sys.stderr)
            return
        try:  # to stderr: stdout is the resolved configuration, JSON
            preview = prompt_preview(cfg)
        except ValueError as err:
            print(f"asyncrl: {err}", file=sys.stderr)
            sys.exit(2)
        if preview:
            print(preview, file=sys.stderr)
        return
    if args.command == "build-model":
        from asyncrl.tiny_model.prepare import resolve_model_path

        print(resolve_model_path(cfg))
        return
    from asyncrl.local.launcher import run_embedded

    _stop_on_signals()
    run_embedded(cfg)


if __name__ == "__main__":
    main()
