"""The launcher's step lines carry each step's own figures: a `versions/latest.json` written ahead of its push holds
the previous step's metrics (`metrics_version`), and is printed under that step's number, never the new one's."""

from typing import Any

import pytest

from asyncrl.config import RunConfig
from asyncrl.local import launcher
from asyncrl.local.launcher import EmbeddedRun
from asyncrl.storage.run_layout import RunPaths


def _metrics(reward: float) -> dict[str, float]:
    return {"reward/mean": reward, "reward/accuracy": reward, "train/loss": 0.0, "staleness/mean": 0.0,
            "staleness/max": 0.0, "throughput/samples_per_s": 1.0, "time/wait_s": 0.0, "time/train_s": 0.0,
            "time/sync_s": 0.0}


class _Store:
    """Answers versions/latest.json from a script, one document per read; `done` once the script is spent."""

    def __init__(self, docs: list[dict[str, Any]]) -> None:
        self.docs = docs

    def get_json(self, key: str) -> dict[str, Any] | None:
        return self.docs.pop(0) if len(self.docs) > 1 else self.docs[0]

    def exists(self, key: str) -> bool:
        return len(self.docs) == 1

    def list_keys(self, prefix: str) -> list[str]:
        return []  # no held-out evaluation points


def test_a_document_published_ahead_prints_the_step_its_figures_belong_to(monkeypatch: pytest.MonkeyPatch,
                                                                          capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(launcher, "FOLLOW_POLL_S", 0.0)
    run = EmbeddedRun.__new__(EmbeddedRun)
    run.cfg = RunConfig.model_validate({"training": {"steps": 3}, "eval": {"every_steps": 0}})
    run.paths = RunPaths("runs", "r")
    run.check_children = lambda: None  # type: ignore[method-assign]
    docs = [{"version": 1, "metrics_version": 1, "metrics": _metrics(0.1)},
            {"version": 2, "metrics_version": 1, "metrics": _metrics(0.1)},  # ahead of step 2's push
            {"version": 2, "metrics_version": 2, "metrics": _metrics(0.2)},
            {"version": 3, "metrics": _metrics(0.3)},  # a document without the field: its own version's
            {"version": 3, "metrics": _metrics(0.3)}]
    run.follow(_Store(docs))  # type: ignore[arg-type]
    lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("step")]
    assert [(line.split()[1], line.split()[3]) for line in lines] == [("1/3", "0.100"), ("2/3", "0.200"),
                                                                      ("3/3", "0.300")]
