"""`asyncrl pipeline upload|run` against a stand-in of the KFP v2beta1 REST API (tests/helpers/kfp_api.py: a real
HTTP server on port 0 that records the requests; an injected stand-in for the cluster these tests do not have).
Checked: upload makes a version named by the git revision with the image references in its description and as
the uploaded YAML's defaults; run starts a run of one uploaded version by pipeline name + version, in the
namespace given, with only the parameters given; missing pipelines or versions are clear errors. Plus the
Markdown link setup writes for the KFP run page."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from asyncrl.cluster.mlflow_link import mlflow_link_markdown, mlflow_run_url
from asyncrl.cluster.pipeline.images import git_short_revision, version_name
from asyncrl.cluster.pipeline_api import ApiError, connect, upload_version
from asyncrl.cluster.pipeline_cli import compile_pipeline
from tests.helpers.kfp_api import API, kfp_api_server

ROOT = Path(__file__).resolve().parents[2]


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "asyncrl.cli", "pipeline", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=180)


def _uploaded_defaults(text: str) -> dict:
    params = next(yaml.safe_load_all(text))["root"]["inputDefinitions"]["parameters"]
    return {k: params[k].get("defaultValue") for k in ("generation_image", "training_image", "light_image")}


def test_upload_makes_a_version_named_by_the_git_revision_with_the_images():
    with kfp_api_server() as (host, kfp):
        proc = _cli("upload", "--host", host, "--registry", "reg.example/team", "--namespace", "team-a")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        tag, version = git_short_revision(), version_name()
        assert out["version"] == version and version.startswith(f"git-{tag}") and out["new_pipeline"] is True
        want = {f"{n}_image": f"reg.example/team/asyncrl-{n}:{tag}" for n in ("generation", "training", "light")}
        assert out["images"] == want
        (listed, *_) = kfp.calls("GET", f"{API}/pipelines")
        assert listed.query["namespace"] == "team-a" and "asyncrl" in listed.query["filter"]
        (created,) = kfp.calls("POST", f"{API}/pipelines/upload")
        assert created.query["name"] == "asyncrl" and created.query["namespace"] == "team-a"
        (new_version,) = kfp.calls("POST", f"{API}/pipelines/upload_version")
        assert new_version.query["name"] == version and new_version.query["pipelineid"] == out["pipeline_id"]
        for image in want.values():
            assert image in new_version.query["description"]
        assert _uploaded_defaults(new_version.upload) == want  # the form's defaults are the pushed images
        # the same name again, named explicitly: refused, nothing uploaded
        again = _cli("upload", "--host", host, "--registry", "reg.example/team", "--namespace", "team-a",
                     "--version", version)
        assert again.returncode == 2 and f"--version {version}: pipeline asyncrl already has a version" in again.stderr
        assert len(kfp.calls("POST", f"{API}/pipelines/upload_version")) == 1


def test_an_unchanged_version_is_reused_a_changed_one_refused(tmp_path):
    package = compile_pipeline(tmp_path / "p.yaml", "r", "t1")
    with kfp_api_server() as (host, kfp):
        api = connect(host, 30.0, None)
        first = upload_version(api, package, "asyncrl", "git-abc", "images: t1", reuse_same=True)
        again = upload_version(api, package, "asyncrl", "git-abc", "images: t1", reuse_same=True)
        assert again["version_id"] == first["version_id"] and again["new_version"] is False
        with pytest.raises(ApiError, match="already has a version of this name with other images"):
            upload_version(api, package, "asyncrl", "git-abc", "images: t2", reuse_same=True)
        assert len(kfp.calls("POST", f"{API}/pipelines/upload_version")) == 1


def test_run_starts_the_named_version_with_only_the_parameters_given(tmp_path):
    config = ROOT / "configs" / "agentic.yaml"
    with kfp_api_server() as (host, kfp):
        up = _cli("upload", "--host", host, "--registry", "reg.example/team", "--version", "v1", "--namespace", "ns")
        assert up.returncode == 0, up.stderr
        uploaded = json.loads(up.stdout)
        proc = _cli("run", "--host", host, "--version", "v1", "--namespace", "ns", "--experiment", "exp",
                    "--config", str(config), "--param", "generation_gpus=2", "--set", "training.lr=0.5")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        assert out["pipeline_id"] == uploaded["pipeline_id"] and out["version_id"] == uploaded["version_id"]
        (exp,) = kfp.calls("POST", f"{API}/experiments")
        assert exp.body["display_name"] == "exp" and exp.body["namespace"] == "ns"
        (run,) = kfp.calls("POST", f"{API}/runs")
        assert run.body["pipeline_version_reference"] == {"pipeline_id": uploaded["pipeline_id"],
                                                          "pipeline_version_id": uploaded["version_id"]}
        assert "pipeline_spec" not in run.body and run.body["experiment_id"] == out["experiment_id"]
        assert run.body["service_account"] == "asyncrl-runner"
        # only what was given: no steps/prompts_per_step, so agentic.yaml's 30 and 16 stand
        assert run.body["runtime_config"]["parameters"] == {
            "config_yaml": config.read_text(), "generation_gpus": 2, "overrides": ["training.lr=0.5"]}
        missing = _cli("run", "--host", host, "--version", "v9", "--namespace", "ns")
        assert missing.returncode == 2 and "--version v9: pipeline asyncrl has no version of this name" in missing.stderr
        nothing = _cli("run", "--host", host, "--name", "other", "--version", "v1")
        assert nothing.returncode == 2 and "--name other: no such pipeline at" in nothing.stderr
        assert len(kfp.calls("POST", f"{API}/runs")) == 1


def test_run_upload_uploads_then_runs_that_version():
    with kfp_api_server() as (host, kfp):
        proc = _cli("run", "--host", host, "--upload", "--registry", "reg.example/team", "--tag", "t7",
                    "--version", "v7", "--param", "steps=5")
        assert proc.returncode == 0, proc.stderr
        out = json.loads(proc.stdout)
        (version,) = kfp.calls("POST", f"{API}/pipelines/upload_version")
        assert version.query["name"] == "v7" and "reg.example/team/asyncrl-training:t7" in version.query["description"]
        (run,) = kfp.calls("POST", f"{API}/runs")
        assert run.body["pipeline_version_reference"]["pipeline_version_id"] == out["version_id"]
        assert run.body["runtime_config"]["parameters"] == {"steps": 5}


def test_each_subcommand_takes_only_its_own_flags():
    proc = _cli("compile", "--host", "http://x")
    assert proc.returncode == 2 and "unrecognized arguments: --host" in proc.stderr
    proc = _cli("upload", "--param", "steps=1")
    assert proc.returncode == 2 and "unrecognized arguments: --param" in proc.stderr


def test_the_mlflow_link_drops_any_login_and_names_the_run():
    url = mlflow_run_url("http://admin:s3cret@mlflow.asyncrl.svc:5000/?x=1", "7", "abc")
    assert url == "http://mlflow.asyncrl.svc:5000/#/experiments/7/runs/abc"
    assert mlflow_run_url("sqlite:///runs/mlflow.db", "1", "abc") is None
    text = mlflow_link_markdown("https://u:p@ml.example/mlflow/", "3", "r1", "kfp-run-9")
    assert "(https://ml.example/mlflow/#/experiments/3/runs/r1)" in text and "kfp-run-9" in text
    assert "p@" not in text and "u:" not in text
