"""Rehearsal of the committed Kubeflow pipeline: the compiled tasks' exact commands (setup, a generation replica,
training under its launcher, reward, environment, then finalize through kfp's executor) run as local processes
against an embedded S3 server, for two training steps with the built-in tiny model and LoRA adapters. Proves the
commands, their arguments, the secret/config-map/POD_IP env and the S3 rendezvous work without a cluster; the
registered model is the adapters and their description, and merges onto its base; every role exits by itself once
the run is done, and no process is left."""

from pathlib import Path

import mlflow
import psutil
import pytest
import torch
from safetensors.torch import load_file

from asyncrl.adapters.safetensors_folder import read_folder_tensors
from asyncrl.cluster.pipeline_cli import DEFAULT_YAML
from asyncrl.cluster.rehearsal_runner import RehearsalFailed, rehearse
from asyncrl.models.lora_export import merge_checkpoint, read_description
from asyncrl.tracking.child_runs import child_runs

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]
STEPS = 2
ROLES = ["environment-env0", "generation-0", "reward", "training"]
LORA = '{"rank": 4, "alpha": 8}'


@pytest.fixture(scope="module")
def rehearsal(tmp_path_factory):
    work = tmp_path_factory.mktemp("rehearsal")
    db = work / "mlflow.db"
    params = {
        "steps": STEPS, "prompts_per_step": 4, "samples_per_prompt": 4, "mlflow_uri": f"sqlite:///{db}",
        "mlflow_experiment": "rehearsal", "s3_bucket": "rehearsal", "model_path": "",
        # one generation replica and one training rank, under torchrun as always (the loop's expansion to several
        # replicas is checked in tests/unit/test_rehearsal.py, several ranks in test_multirank_training.py and the
        # fault suite; each more would cost CI most of a minute)
        "generation_replica_ids": ["0"], "training_gpus": 1,
        # LoRA adapters (issue 38): the cluster path serves, pushes, checkpoints and registers them; the full-weight
        # path is the one of every other embedded run
        "overrides": [f"cache_dir={ROOT / '.cache' / 'asyncrl'}", "generation.max_model_len=32",
                      "training.micro_batch_size=16", "training.checkpoint_every=2", f"training.lora={LORA}"],
    }

    def inspect(store, paths):
        ckpt = work / "checkpoint"  # the registered checkpoint's files, read while the S3 server is up
        ckpt.mkdir()
        for key in store.list_keys(paths.checkpoint_prefix(STEPS)):
            (ckpt / key.rsplit("/", 1)[-1]).write_bytes(store.get_bytes(key))
        return {"checkpoint": ckpt, "config": store.get_json(paths.config()),
                "tracking": store.get_json(paths.tracking()),
                "generation": [store.get_json(paths.rendezvous("generation", "0"))],
                "latest": store.get_json(paths.versions_latest()), "done": store.exists(paths.done()),
                "final": store.get_json(paths.file("final_status.json")),
                "summary": store.get_json(paths.file("run_summary.json"))}

    result = rehearse(DEFAULT_YAML, params, workdir=work / "run", timeout_s=420, exit_grace_s=90, inspect=inspect)
    return result, db


def test_every_task_ran_in_order_and_exited_zero(rehearsal):
    result, _ = rehearsal
    assert result.exit_codes == {name: 0 for name in ["setup", *ROLES, "finalize"]}
    assert all(result.started_s[r] >= result.ended_s["setup"] for r in ROLES)  # roles after setup
    assert result.started_s["finalize"] >= max(result.ended_s[r] for r in ROLES)  # the exit task last
    assert result.done_s is not None and all(result.ended_s[r] <= result.done_s + 90 for r in ROLES)


def test_s3_holds_config_rendezvous_versions_done_and_final_status(rehearsal):
    result, _ = rehearsal
    s3 = result.inspection
    cfg = s3["config"]
    assert cfg["run_id"] == result.run_id and cfg["training"]["steps"] == STEPS
    assert cfg["training"]["num_processes"] == 1  # training_gpus → torchrun ranks
    assert cfg["generation"]["num_servers"] == 1 and cfg["rollout"]["num_writers"] == 1
    for doc in s3["generation"]:  # advertised through POD_IP from the platform spec's field path
        assert doc is not None and doc["host"] == "127.0.0.1" and int(doc["port"]) > 0
    assert s3["latest"]["version"] == STEPS
    assert s3["done"] is True
    assert s3["final"]["status"] == "SUCCEEDED" and s3["final"]["final_version"] == STEPS
    summary = s3["summary"]  # finalize writes the training summary `asyncrl run` reports (asyncrl.run.summary)
    assert summary["status"] == "SUCCEEDED" and summary["final_version"] == STEPS and summary["samples_trained"] > 0
    assert summary["groups_written"] == summary["groups_consumed"] + summary["groups_left_unconsumed"]


def test_the_registered_model_is_the_adapters_with_their_base_and_merges(rehearsal, tmp_path):
    """With training.lora the registered version's checkpoint holds only the adapters and the description naming
    their base; `asyncrl model merge`'s function turns it into a plain model folder whose adapted layers moved."""
    result, db = rehearsal
    ckpt = result.inspection["checkpoint"]
    registered = result.inspection["final"]["registered_model"]
    version = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}").get_model_version(registered["name"],
                                                                                    registered["version"])
    assert version.source == registered["checkpoint_uri"] and registered["checkpoint_version"] == STEPS
    doc = read_description(ckpt)
    assert (doc["rank"], doc["alpha"], doc["scale"]) == (4, 8, 2.0)
    adapters = load_file(str(ckpt / "model.safetensors"))
    assert adapters and all(n.endswith((".lora_A", ".lora_B")) for n in adapters)
    assert any(float(t.abs().max()) > 0 for n, t in adapters.items() if n.endswith(".lora_B"))  # B moved from 0
    out = merge_checkpoint(ckpt, tmp_path / "merged")
    base = dict(read_folder_tensors(Path(out["base"])))
    merged = load_file(str(tmp_path / "merged" / "model.safetensors"))
    assert out["layers"] == len(adapters) // 2 and merged.keys() == base.keys()
    moved = {n for n in merged if not torch.equal(merged[n], base[n])}
    assert moved and all(n.removesuffix(".weight") + ".lora_A" in adapters for n in moved)


def test_mlflow_run_has_the_kfp_run_id_and_step_metrics(rehearsal):
    result, db = rehearsal
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{db}")
    run = client.get_run(result.inspection["tracking"]["mlflow_run_id"])
    assert run.data.tags["kfp.run_id"] == result.run_id
    assert run.data.tags["image.training"] == "asyncrl-training:dev"  # the committed image defaults
    assert run.info.status == "FINISHED"  # finalize ended it
    for name in ("train/loss", "reward/mean", "staleness/max"):
        assert sorted(m.step for m in client.get_metric_history(run.info.run_id, name)) == [1, 2], name
    # every other role's own figures, in its instance's child run (from their heartbeats; their values lag by up to
    # two heartbeats, so test_role_liveness checks the values and this checks the names), ended with the job's run
    children = {r.data.tags["asyncrl.child"]: r for r in child_runs(client, run.info.run_id)}
    for key, name in (("generation-0", "generation/tokens_generated"), ("reward-0", "reward/scored")):
        assert client.get_metric_history(children[key].info.run_id, name), name
        assert children[key].info.status == "FINISHED", key


def test_no_process_left(rehearsal):
    result, _ = rehearsal
    left = []
    for p in psutil.process_iter(["pid", "cmdline"]):
        try:
            env = p.environ()  # every task has ASYNCRL_RUN_DIR, the rehearsal's folder
        except (psutil.Error, OSError):
            env = {}
        if result.run_id in " ".join(p.info["cmdline"] or []) or any(str(result.workdir) in v for v in env.values()):
            left.append((p.info["pid"], p.info["cmdline"]))
    assert left == []


def test_a_failing_task_stops_the_rehearsal_and_is_named(tmp_path):
    work = tmp_path / "bad"
    with pytest.raises(RehearsalFailed, match=r"task setup: exited with code 2[\s\S]*async_ratio"):
        rehearse(DEFAULT_YAML, {"overrides": ["rollout.async_ratio=-1"], "mlflow_uri": ""}, workdir=work,
                 timeout_s=120)
    assert not (work / "logs" / "training.log").exists()  # nothing started after the failed setup
    assert [p.pid for p in psutil.process_iter() if _in_workdir(p, work)] == []


def _in_workdir(p: psutil.Process, work: Path) -> bool:
    try:
        return any(str(work) in v for v in p.environ().values())
    except (psutil.Error, OSError):
        return False


def test_setup_links_the_mlflow_run_in_its_markdown_output(rehearsal):
    """The setup step's output artifact `mlflow_run` (dsl.Markdown), shown on the KFP run page."""
    result, _ = rehearsal
    text = (result.workdir / "kfp_outputs" / "exit-handler-1" / "setup" / "mlflow_run").read_text()
    assert result.run_id in text and result.inspection["tracking"]["mlflow_run_id"] in text
