"""The run form's one precedence rule (defaults < config_yaml < form fields given < overrides; pod-shaping
parameters authoritative), through setup's own resolution and through the compiled pipeline as the rehearsal
resolves it; the image defaults the compile flags write."""

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.cluster.pipeline.images import (
    COMMITTED_TAG,
    IMAGE_NAMES,
    git_short_revision,
    image_refs,
    registry_prefix,
)
from asyncrl.cluster.pipeline_cli import DEFAULT_YAML, compile_pipeline
from asyncrl.cluster.rehearsal import load_compiled, resolve_parameters, task_commands
from asyncrl.cluster.setup import configuration, parse_args
from asyncrl.cluster.setup_config import PrecedenceError, resolve_run_config
from asyncrl.config import RunConfig

ROOT = Path(__file__).resolve().parents[2]
AGENTIC = (ROOT / "configs" / "agentic.yaml").read_text()
ENDPOINT = "http://127.0.0.1:9"
SECRETS = {"asyncrl-s3": {"AWS_ACCESS_KEY_ID": "AK", "AWS_SECRET_ACCESS_KEY": "SK"},
           "asyncrl-role-token": {"ASYNCRL_ROLE_TOKEN": "t"}}
CONFIG_MAPS = {"asyncrl-endpoints": {"AWS_ENDPOINT_URL": ENDPOINT}}


def _setup_args(*extra: str) -> list[str]:
    return ["--bucket", "asyncrl", "--prefix", "runs", "--run-id", "run-1", "--config-yaml", AGENTIC,
            "--generation-ids-json", '["0"]', "--environment-ids-json", '["env0"]', "--training-processes", "1",
            "--mlflow-uri", "http://mlflow:5000", *extra]


def _resolve(*extra: str):
    return configuration(parse_args(_setup_args(*extra)), ENDPOINT, "run-1")


def test_agentic_config_keeps_its_steps_and_prompts_when_the_form_leaves_them_empty():
    resolved = _resolve()
    cfg = resolved.cfg
    assert cfg.training.steps == 30 and cfg.rollout.prompts_per_step == 16 and cfg.rollout.samples_per_prompt == 8
    assert cfg.training.loss == "decoupled_ppo" and cfg.env.name == "frozenlake"
    assert cfg.storage.bucket == "asyncrl" and cfg.tracking.tracking_uri == "http://mlflow:5000"
    assert not any(line.startswith(("training.steps", "rollout.prompts_per_step")) for line in resolved.changes)


def test_a_form_field_given_wins_over_the_config_and_overrides_win_over_both_each_difference_logged():
    resolved = _resolve("--set", "training.steps=50", "--set", "rollout.prompts_per_step=32",
                        "--overrides-json", '["training.steps=70"]')
    assert resolved.cfg.training.steps == 70 and resolved.cfg.rollout.prompts_per_step == 32
    assert "training.steps: 30 -> 50 (form field)" in resolved.changes
    assert "training.steps: 50 -> 70 (overrides)" in resolved.changes
    assert "rollout.prompts_per_step: 16 -> 32 (form field)" in resolved.changes
    assert "tracking.tracking_uri: '' -> 'http://mlflow:5000' (pipeline parameter mlflow_uri)" in resolved.changes


def test_pod_shaping_parameters_are_authoritative_and_a_contradiction_names_both_values():
    with pytest.raises(PrecedenceError) as err:  # agentic.yaml says generation.num_servers: 1
        _resolve("--generation-ids-json", '["0","1"]')
    assert str(err.value).startswith(
        "generation.num_servers: the configuration (config_yaml or overrides) says 1, but the pipeline parameter "
        "generation_replica_ids = [\"0\",\"1\"] makes it 2")
    agreed = _resolve("--generation-ids-json", '["0","1"]', "--overrides-json", '["generation.num_servers=2"]')
    assert agreed.cfg.generation.num_servers == 2
    four = _resolve("--training-processes", "4")  # agentic.yaml leaves training.num_processes out
    assert four.cfg.training.num_processes == 4
    assert "training.num_processes: 1 -> 4 (pipeline parameter training_gpus)" in four.changes
    with pytest.raises(PrecedenceError, match=r"training.num_processes: .* says 2, .* training_gpus = 4 makes it 4"):
        _resolve("--training-processes", "4", "--overrides-json", '["training.num_processes=2"]')
    with pytest.raises(PrecedenceError, match=r"storage.bucket: .* says 'mine', .* s3_bucket = asyncrl makes it"):
        _resolve("--overrides-json", '["storage.bucket=mine"]')
    assert resolve_run_config("", [], [], [], [], "r").cfg.training.steps == RunConfig().training.steps  # defaults


def test_training_nodes_and_generation_gpus_are_authoritative_too():
    two_nodes = _resolve("--training-processes", "4", "--training-nodes", "2", "--generation-gpus", "2")
    assert two_nodes.cfg.training.num_processes == 8 and two_nodes.cfg.generation.tensor_parallel_size == 2
    assert "training.num_processes: 1 -> 8 (pipeline parameter training_gpus)" in two_nodes.changes
    with pytest.raises(PrecedenceError, match=r"tensor_parallel_size: .* says 1, .* generation_gpus = 2 makes it 2"):
        _resolve("--generation-gpus", "2", "--overrides-json", '["generation.tensor_parallel_size=1"]')
    assert _resolve("--generation-gpus", "0").cfg.generation.tensor_parallel_size == 1  # no GPU: the config's


def test_setup_exits_2_naming_the_field_and_both_values(tmp_path):
    env = {**os.environ, "AWS_ENDPOINT_URL": "http://127.0.0.1:9", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cluster.setup",
                           *_setup_args("--generation-ids-json", '["0","1","2"]')], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2, proc.stderr
    assert "setup: generation.num_servers: the configuration (config_yaml or overrides) says 1" in proc.stderr
    assert "makes it 3" in proc.stderr


def _setup_config_through_the_compiled_pipeline(params):
    """The compiled pipeline's setup command, resolved by the rehearsal as KFP's driver would, then parsed and
    resolved by setup itself."""
    spec, platform = load_compiled(DEFAULT_YAML)
    tasks = task_commands(spec, platform, resolve_parameters(spec, params), "run-1", secrets=SECRETS,
                          config_maps=CONFIG_MAPS, defer_outputs=True)
    (setup,) = [t for t in tasks if t.name == "setup"]
    assert setup.argv[:2] == ["asyncrl-task", "asyncrl.cluster.setup"]
    return setup.argv, configuration(parse_args(list(setup.argv[2:])), ENDPOINT, "run-1")


def test_through_the_compiled_pipeline_an_empty_form_keeps_the_config_and_a_given_field_wins():
    argv, resolved = _setup_config_through_the_compiled_pipeline({"config_yaml": AGENTIC})
    assert "--set" not in argv and "--model-path" not in argv  # nothing given, nothing passed
    assert resolved.cfg.training.steps == 30 and resolved.cfg.rollout.prompts_per_step == 16
    argv, resolved = _setup_config_through_the_compiled_pipeline({"config_yaml": AGENTIC, "steps": 50,
                                                                  "loss": "cispo", "overrides": ["training.lr=0.5"]})
    assert [argv[i + 1] for i, a in enumerate(argv) if a == "--set"] == ["training.loss=cispo", "training.steps=50"]
    assert resolved.cfg.training.steps == 50 and resolved.cfg.training.loss == "cispo"
    assert resolved.cfg.rollout.prompts_per_step == 16 and resolved.cfg.training.lr == 0.5


def test_image_defaults_are_the_compile_flags(tmp_path):
    spec = yaml.safe_load_all(compile_pipeline(tmp_path / "p.yaml", "reg.example/team/", "abc123").read_text())
    params = next(spec)["root"]["inputDefinitions"]["parameters"]
    assert {k: params[k]["defaultValue"] for k in ("generation_image", "training_image", "light_image")} == {
        "generation_image": "reg.example/team/asyncrl-generation:abc123",
        "training_image": "reg.example/team/asyncrl-training:abc123",
        "light_image": "reg.example/team/asyncrl-light:abc123"}
    committed = next(yaml.safe_load_all(DEFAULT_YAML.read_text()))["root"]["inputDefinitions"]["parameters"]
    assert committed["training_image"]["defaultValue"] == f"asyncrl-training:{COMMITTED_TAG}"
    assert registry_prefix("reg.example/team") == registry_prefix("reg.example/team/") == "reg.example/team/"
    with pytest.raises(ValueError, match="--tag: expected a Docker image tag"):
        image_refs("r", "a:b")


def test_compile_and_make_push_images_name_the_same_images(tmp_path):
    """One REGISTRY and one TAG (default: the git revision) for both; make -n prints the commands only."""
    out = tmp_path / "p.yaml"
    proc = subprocess.run([sys.executable, "-m", "asyncrl.cli", "pipeline", "compile", "--registry",
                           "reg.example/team", "--out", str(out)], cwd=ROOT, capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    refs = json.loads(proc.stdout)["images"]
    tag = git_short_revision()
    assert refs["training_image"] == f"reg.example/team/asyncrl-training:{tag}"
    made = subprocess.run(["make", "-n", "push-images", "REGISTRY=reg.example/team"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    assert made.returncode == 0, made.stderr
    pushed = set(re.findall(r"docker push (\S+)", made.stdout.replace("$i", "{name}")))
    assert pushed == {"reg.example/team/asyncrl-{name}:" + tag}
    assert {f"reg.example/team/asyncrl-{n}:{tag}" for n in IMAGE_NAMES} == set(refs.values())
