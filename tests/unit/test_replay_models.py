"""`asyncrl tracking replay --models auto`: how the run's mode is read from what it recorded in S3 (real S3)."""

from __future__ import annotations

import uuid

import pytest

from asyncrl.run import replay_command
from asyncrl.run.checkpoint_models import PUBLISHED
from asyncrl.run.replay_models import MODES, models_mode, replay_models
from asyncrl.storage.run_layout import RunPaths
from asyncrl.storage.s3 import S3Store

TRACKING = {"tracking_uri": "sqlite:///unused.db", "mlflow_run_id": "r1"}


def _paths() -> RunPaths:
    return RunPaths("runs", f"m-{uuid.uuid4().hex[:8]}")


@pytest.mark.parametrize(("mode", "expected"), [("cluster", "reference"), ("embedded", "artifacts")])
def test_the_mode_in_tracking_json_decides(s3_store: S3Store, mode: str, expected: str) -> None:
    assert models_mode(s3_store, _paths(), {**TRACKING, "mode": mode}) == (expected, f"tracking.json: mode {mode}")


def test_a_bad_mode_in_tracking_json_is_named(s3_store: S3Store) -> None:
    with pytest.raises(ValueError, match=r"tracking.json: mode: expected one of \['cluster', 'embedded'\], got 'k8s'"):
        models_mode(s3_store, _paths(), {**TRACKING, "mode": "k8s"})


def test_an_older_run_is_known_by_the_documents_of_its_end(s3_store: S3Store) -> None:
    paths = _paths()
    assert models_mode(s3_store, paths, TRACKING)[0] == "skip"
    s3_store.put_json(paths.file("final_status.json"), {"status": "SUCCEEDED"})
    assert models_mode(s3_store, paths, TRACKING)[0] == "reference"
    s3_store.put_json(paths.file(PUBLISHED), {"models_logged": []})  # only the embedded launcher writes it
    assert models_mode(s3_store, paths, TRACKING)[0] == "artifacts"


def test_skip_and_a_bad_choice(s3_store: S3Store) -> None:
    paths = _paths()
    out = replay_models(s3_store, paths, TRACKING, "auto", 1.0)
    assert out["models"] == "skip" and "pass --models reference (cluster)" in out["models_skipped"]
    assert replay_models(s3_store, paths, TRACKING, "skip", 1.0) == {"models": "skip", "models_skipped": "--models"}
    with pytest.raises(ValueError, match="--models: expected one of auto, reference, artifacts, skip, got 'copy'"):
        replay_models(s3_store, paths, TRACKING, "copy", 1.0)
    out = replay_models(s3_store, paths, TRACKING, "reference", 1.0)  # no config.json: the name is unknown
    assert out["models"] == "skip" and "config.json: no configuration" in out["models_skipped"]


def test_the_parser_offers_the_modes_replay_models_knows() -> None:
    assert replay_command.MODES == MODES
