"""A run's lineage (asyncrl/run/lineage.py): the config digest, the git commit tag, the dataset inputs in a real
MLflow store."""

from __future__ import annotations

import json
import re

import mlflow

from asyncrl.config import load_config
from asyncrl.run.lineage import config_digest, dataset_inputs, git_commit, lineage_tags, log_dataset_inputs
from asyncrl.tracking.mlflow_tracker import Tracker


def test_config_digest_ignores_what_names_the_run():
    a = load_config(None, ["run_id=a", "runs_dir=/tmp/x", "storage.bucket=bucket-one", "tracking.experiment=e1"])
    b = load_config(None, ["run_id=b", "runs_dir=/tmp/y", "storage.bucket=bucket-two", "tracking.experiment=e2"])
    c = load_config(None, ["run_id=a", "training.lr=0.5"])
    assert config_digest(a) == config_digest(b) != config_digest(c)
    assert re.fullmatch(r"[0-9a-f]{64}", config_digest(a))


def test_git_commit_of_this_checkout_and_the_image_revision(monkeypatch, tmp_path):
    found = git_commit()
    assert found is not None and re.fullmatch(r"[0-9a-f]{40}", found[0])
    assert git_commit(tmp_path) is None  # not a checkout (an installed wheel): no tag
    monkeypatch.setenv("ASYNCRL_GIT_REVISION", "abc1234")
    assert lineage_tags(load_config(None, []))["mlflow.source.git.commit"] == "abc1234"
    monkeypatch.delenv("ASYNCRL_GIT_REVISION")
    tags = lineage_tags(load_config(None, []))
    assert tags["mlflow.source.git.commit"] == found[0] and tags["asyncrl.git.dirty"] in ("true", "false")


def test_dataset_inputs_of_the_built_in_task_and_a_missing_file(tmp_path, caplog):
    cfg = load_config(None, [])
    inputs = {d["context"]: d for d in dataset_inputs(cfg)}
    assert set(inputs) == {"train", "eval"}
    assert inputs["eval"]["size"] == cfg.task.num_eval and inputs["train"]["size"] > 0
    assert inputs["train"]["digest"] != inputs["eval"]["digest"]
    assert dataset_inputs(cfg) == list(inputs.values())  # deterministic
    train = tmp_path / "train.jsonl"
    train.write_text("".join(json.dumps({"prompt": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(5)))
    jsonl = load_config(None, ["task.name=jsonl", f"task.train_path={train}", f"task.eval_path={tmp_path / 'gone.jsonl'}"])
    got = dataset_inputs(jsonl)
    assert [(d["context"], d["size"], d["source"]) for d in got] == [("train", 5, str(train))]
    assert "eval split of task jsonl is not readable here" in caplog.text


def test_inputs_land_in_a_real_mlflow_store(tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    tracker = Tracker.create(uri, "lineage", "r1")
    cfg = load_config(None, [])
    log_dataset_inputs(tracker.client, tracker.run_id, cfg)
    run = mlflow.MlflowClient(tracking_uri=uri).get_run(tracker.run_id)
    got = {i.tags[0].value: (i.dataset.name, json.loads(i.dataset.profile)["num_rows"])
           for i in run.inputs.dataset_inputs}
    assert got == {"train": ("arithmetic-train", dataset_inputs(cfg)[0]["size"]),
                   "eval": ("arithmetic-eval", cfg.task.num_eval)}
