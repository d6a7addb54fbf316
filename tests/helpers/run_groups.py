"""Read a finished embedded run's data back: its first writer's rollout stats and every group it wrote."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from asyncrl.config import load_config
from asyncrl.local.seaweed import EmbeddedS3
from asyncrl.storage.groups import GroupReader
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store


def stats_and_groups(run_dir: Path, config: Path, monkeypatch: pytest.MonkeyPatch) -> tuple[dict[str, Any], list]:
    """(env0's rollout stats document, the run's groups), served again from the run's own S3 data folder."""
    cfg = load_config(config)
    summary = json.loads((run_dir / "run_summary.json").read_text())
    with EmbeddedS3(run_dir / "s3") as s3:
        for k, v in s3.env().items():
            monkeypatch.setenv(k, v)
        store = S3Store(s3.endpoint_url, cfg.storage.bucket)
        paths = RunPaths(cfg.storage.prefix, summary["run_id"])
        stats = store.get_json(paths.rollout_stats("env0"))
        groups = [g for _, _, g in GroupReader(store, paths).poll()]
    return stats, groups
