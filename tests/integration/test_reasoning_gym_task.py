"""`task.name: reasoning_gym` for real: reasoning-gym's own venv built by the code a user's first run goes through
(`python -m venv` + `pip install reasoning-gym==0.1.25` under the cache dir, with PyPI access), the generator run in it
as a subprocess, basic_arithmetic train and held-out splits of a few rows: deterministic (regenerated from scratch they
are the same rows), disjoint, cached; errors that name the field; and the rows materialised into a run (a real
SeaweedFS server) and read back by a role.

Slow the first time on a machine: building the venv takes about 2 minutes (pip downloads ~350 MB of reasoning-gym
and its dependencies). It is built under the repository's `.cache/asyncrl/reasoning-gym-venv`, shared with
`asyncrl run` there, so later sessions only generate (a few seconds: the venv's interpreter starts and imports
reasoning-gym once per generation round).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from asyncrl.config import RunConfig, load_config
from asyncrl.roles.context import RoleContext
from asyncrl.run.create import create_run
from asyncrl.storage.run_layout import RunPaths
from asyncrl.tasks import datasets
from asyncrl.tasks.datasets import load_split
from asyncrl.tasks.jsonl import DatasetError
from asyncrl.tasks.materialised import prepare
from asyncrl.tasks.rgym_task import cache_file, generate_splits
from asyncrl.tasks.rgym_venv import READY, ensure_venv, venv_dir

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
CACHE = ROOT / ".cache" / "asyncrl"
PARAMS = '{"min_terms": 2, "max_terms": 3, "max_digits": 2}'


def _cfg(*overrides: str) -> RunConfig:
    return load_config(None, ["task.name=reasoning_gym", "task.dataset=basic_arithmetic",
                              f"task.dataset_params={PARAMS}", "task.num_train=12", "task.num_eval=5",
                              f"cache_dir={CACHE}", *overrides])


def test_basic_arithmetic_splits_are_deterministic_disjoint_and_cached() -> None:
    python = ensure_venv(CACHE)  # built here on a fresh machine, exactly as a user's first run builds it
    assert python == venv_dir(CACHE) / "bin" / "python" and (venv_dir(CACHE) / READY).read_text().strip() == (
        "reasoning-gym==0.1.25")
    task = _cfg().task
    path = cache_file(task, CACHE)
    path.unlink(missing_ok=True)
    first = generate_splits(task, CACHE, 100_000)
    assert len(first.train) == 12 and len(first.eval) == 5 and first.info["rounds"] == 1
    assert not {r.prompt for r in first.train} & {r.prompt for r in first.eval}
    assert len({r.prompt for r in first.train}) == 12
    for row in first.train + first.eval:
        assert row.prompt.startswith("Calculate ") and re.fullmatch(r"-?\d+", row.answer), row
        assert row.metadata is not None and row.metadata["source_dataset"] == "basic_arithmetic"
    assert path.is_file() and generate_splits(task, CACHE, 100_000).train == first.train  # from the cache
    path.unlink()
    again = generate_splits(task, CACHE, 100_000)  # generated again from scratch: the same rows
    assert (again.train, again.eval) == (first.train, first.eval)
    more = generate_splits(task.model_copy(update={"num_train": 3}), CACHE, 100_000)
    # num_train never moves the held-out split; basic_arithmetic seeds entry i by seed + i, so a shorter train stream
    # is a prefix of the longer one
    assert more.eval == first.eval and more.train == first.train[:3]
    other = generate_splits(task.model_copy(update={"seed": 7}), CACHE, 100_000)
    assert other.eval != first.eval


def test_errors_name_the_field() -> None:
    with pytest.raises(DatasetError, match=r"^task.dataset: no reasoning-gym dataset named 'basic_arithmetc' \(close "
                                           r"matches: \['basic_arithmetic'"):
        generate_splits(_cfg("task.dataset=basic_arithmetc").task, CACHE, 100_000)
    with pytest.raises(DatasetError) as info:
        generate_splits(_cfg('task.dataset_params={"max_term": 3}').task, CACHE, 100_000)
    assert str(info.value).startswith("task.dataset_params: the reasoning-gym dataset 'basic_arithmetic' refuses "
                                      "{'max_term': 3}: TypeError: ")
    assert "'max_terms'" in str(info.value) and "'min_terms'" in str(info.value)  # the keys it accepts
    with pytest.raises(DatasetError, match=r"^task.dataset_params: .* AssertionError: min_terms must be positive"):
        generate_splits(_cfg('task.dataset_params={"min_terms": 0}').task, CACHE, 100_000)


def test_the_rows_are_materialised_into_the_run_and_read_back_by_a_role(s3_server, s3_store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(datasets, "_registered", {})
    cfg = _cfg("model.path=/models/elsewhere", f"storage.bucket={s3_store.bucket}", "run_id=rg-copy")
    made = prepare(cfg)
    assert made is not None
    paths = RunPaths(cfg.storage.prefix, cfg.run_id)
    doc = create_run(s3_store, paths, cfg, tracking_uri="", mode="cluster").task_data
    assert doc is not None and doc["splits"]["train"]["rows"] == 12 and doc["splits"]["eval"]["rows"] == 5
    assert doc["source"]["dataset"] == "basic_arithmetic" and doc["source"]["generator"] == "reasoning-gym==0.1.25"
    monkeypatch.setattr(datasets, "_registered", {})  # a role process: nothing generated there
    with pytest.raises(DatasetError, match="not prepared in this process"):
        load_split(cfg.task, "train")
    RoleContext("environment", "env0", "s3://x", s3_store, paths, cfg).load_task_data()
    assert [(p.prompt, p.answer) for p in load_split(cfg.task, "train")] == [(r.prompt, r.answer) for r in made.train]
    assert [p.index for p in load_split(cfg.task, "eval")] == [0, 1, 2, 3, 4]
