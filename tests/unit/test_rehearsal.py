"""The rehearsal's resolution of the committed pipeline YAML: every task with its exact command, ParallelFor
expanded, every placeholder resolved, the secret / config-map / field-path env, the exit task's executor input,
setup's output parameter `run_id` read back and substituted in every role's run URL (resume included);
and clear errors for an unknown parameter, a wrongly typed one, a missing secret key, an unknown placeholder."""

import copy
import json

import pytest

from asyncrl.cluster.pipeline_cli import DEFAULT_YAML
from asyncrl.cluster.rehearsal import (
    PendingOutput,
    RehearsalError,
    load_compiled,
    param_text,
    parse_output,
    resolve_parameters,
    task_commands,
)
from asyncrl.cluster.rehearsal_runner import RehearsalFailed, _Run, local_argv
from asyncrl.storage.run_layout import RunPaths

SECRETS = {"asyncrl-s3": {"AWS_ACCESS_KEY_ID": "AKTEST", "AWS_SECRET_ACCESS_KEY": "sekrit"},
           "asyncrl-role-token": {"ASYNCRL_ROLE_TOKEN": "role-token-for-the-test"}}
CONFIG_MAPS = {"asyncrl-endpoints": {"AWS_ENDPOINT_URL": "http://127.0.0.1:9999"}}
RUN = "0f1e2d3c-run"
SETUP_KEY = "exit-handler-1/setup"
OUT = {SETUP_KEY: {"run_id": RUN}}  # setup's output parameter: a new run
ROLE_TASKS = [("generation-0", "generation", "0"), ("generation-1", "generation", "1"), ("training", "training", "0"),
              ("reward", "reward", "0"), ("environment-env0", "environment", "env0")]


@pytest.fixture(scope="module")
def compiled():
    return load_compiled(DEFAULT_YAML)


def _tasks(compiled, setup_run_id=RUN, defer=False, **overrides):
    """The tasks by name; setup's output `run_id` is `setup_run_id` (None: not known yet)."""
    spec, platform = compiled
    params = resolve_parameters(spec, {"generation_replica_ids": ["0", "1"], "steps": 2, **overrides})
    outputs = {} if setup_run_id is None else {SETUP_KEY: {"run_id": setup_run_id}}
    return {t.name: t for t in task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps=CONFIG_MAPS,
                                             outputs_dir="/work/out", outputs=outputs, defer_outputs=defer)}


def _after_module(argv, module):
    """What follows the role's module (its own arguments, whatever launches it: `asyncrl-task MODULE` or
    `asyncrl-task torch.distributed.run ... -m MODULE`)."""
    i = argv.index(module)
    assert argv[0] == "asyncrl-task" and (i == 1 or argv[i - 1] == "-m"), argv
    return argv[i + 1:]


def _dag_task_key(spec, display_name):
    """(component, task key) of the DAG task shown as `display_name`."""
    for comp_name, comp in spec["components"].items():
        for key, task in comp.get("dag", {}).get("tasks", {}).items():
            if task.get("taskInfo", {}).get("name") == display_name:
                return comp_name, key
    raise AssertionError(display_name)


def test_every_task_found_with_the_loop_expanded(compiled):
    tasks = _tasks(compiled)
    assert sorted(tasks) == ["environment-env0", "finalize", "generation-0", "generation-1", "reward", "setup",
                             "training"]
    url = f"s3://asyncrl/runs/{RUN}"
    for name, module, role_id in ROLE_TASKS:
        t = tasks[name]
        assert _after_module(t.argv, f"asyncrl.roles.{module}") == ["--run-url", url, "--id", role_id, "--host",
                                                                    "0.0.0.0"], name
        assert t.depends_on == (tasks["setup"].key,) and not t.is_exit and t.role == module
    assert tasks["generation-1"].loop_item == "1" and tasks["generation-0"].image == "asyncrl-generation:dev"
    assert tasks["finalize"].is_exit and tasks["setup"].depends_on == ()
    body = {t.key for n, t in tasks.items() if n != "finalize"}
    assert set(tasks["finalize"].depends_on) == body  # the exit task waits for everything inside the handler


def test_setup_arguments_and_no_placeholder_left(compiled):
    tasks = _tasks(compiled, overrides=["cache_dir=/c", "training.micro_batch_size=16"], mlflow_uri="sqlite:///m.db")
    args = tasks["setup"].argv
    assert args[:2] == ["asyncrl-task", "asyncrl.cluster.setup"]
    pairs = dict(zip(args[2::2], args[3::2], strict=False))
    assert pairs["--run-id"] == RUN and pairs["--bucket"] == "asyncrl" and pairs["--prefix"] == "runs"
    assert pairs["--generation-ids-json"] == '["0","1"]' and pairs["--environment-ids-json"] == '["env0"]'
    assert pairs["--overrides-json"] == '["cache_dir=/c","training.micro_batch_size=16"]'
    sets = [args[i + 1] for i, a in enumerate(args) if a == "--set"]
    assert sets == ["training.steps=2"]  # only the form's config fields given (the others stay the config's)
    assert pairs["--mlflow-uri"] == "sqlite:///m.db" and pairs["--training-processes"] == "1"
    assert pairs["--mlflow-link-output"] == "/work/out/exit-handler-1/setup/mlflow_run"
    for t in tasks.values():
        assert not any("{{" in a for a in t.argv if not a.startswith('{"inputs"')), t.name
        assert not any("{{" in v for v in t.env.values()), t.name


def test_env_from_secret_config_map_and_field_path(compiled):
    for t in _tasks(compiled).values():
        assert t.env["AWS_ACCESS_KEY_ID"] == "AKTEST" and t.env["AWS_SECRET_ACCESS_KEY"] == "sekrit", t.name
        assert t.env["AWS_ENDPOINT_URL"] == "http://127.0.0.1:9999" and t.env["POD_IP"] == "127.0.0.1", t.name
        assert t.env["ASYNCRL_BIND_HOST"] == "0.0.0.0", t.name


def test_finalize_runs_kfp_executor_with_the_final_status(compiled):
    t = _tasks(compiled)["finalize"]
    assert t.command[:2] == ("sh", "-ec") and "kfp.dsl.executor_main" in t.command[2]
    assert "def finalize(" in t.command[3] and "pip install" not in t.command[2]  # install_kfp_package=False
    i = t.args.index("--executor_input")
    doc = json.loads(t.args[i + 1])
    values = doc["inputs"]["parameterValues"]
    assert values["bucket"] == "asyncrl" and values["prefix"] == "runs" and values["run_id"] == RUN
    assert values["status"] == {"state": "SUCCEEDED", "pipelineJobResourceName": f"asyncrl-{RUN}",
                                "pipelineTaskName": "exit-handler-1", "error": {}}
    assert doc["outputs"]["outputFile"] == "/work/out/finalize/output_metadata.json"
    assert t.args[i + 2:] == ("--function_to_execute", "finalize")


def test_parameters_defaults_and_checks(compiled):
    spec, _ = compiled
    params = resolve_parameters(spec)
    assert params["steps"] is None and params["generation_replica_ids"] == ["0"]  # steps: the config's
    assert resolve_parameters(spec, {"steps": 50.0})["steps"] == 50
    with pytest.raises(RehearsalError, match="parameter stepz: not a parameter of this pipeline"):
        resolve_parameters(spec, {"stepz": 2})
    with pytest.raises(RehearsalError, match="parameter steps: expected a NUMBER_INTEGER value, got '2'"):
        resolve_parameters(spec, {"steps": "2"})
    with pytest.raises(RehearsalError, match="parameter generation_replica_ids: expected a LIST"):
        resolve_parameters(spec, {"generation_replica_ids": "0"})


def test_missing_secret_or_key_is_an_error(compiled):
    spec, platform = compiled
    params = resolve_parameters(spec)
    with pytest.raises(RehearsalError, match="secret 'asyncrl-s3' has no key 'AWS_SECRET_ACCESS_KEY'"):
        task_commands(spec, platform, params, RUN, config_maps=CONFIG_MAPS,
                      secrets={**SECRETS, "asyncrl-s3": {"AWS_ACCESS_KEY_ID": "x"}})
    with pytest.raises(RehearsalError, match="secret 'asyncrl-s3' is not given"):
        task_commands(spec, platform, params, RUN, secrets={}, config_maps=CONFIG_MAPS)
    with pytest.raises(RehearsalError, match="secret 'asyncrl-role-token' is not given"):
        task_commands(spec, platform, params, RUN, secrets={"asyncrl-s3": SECRETS["asyncrl-s3"]},
                      config_maps=CONFIG_MAPS)
    with pytest.raises(RehearsalError, match="config map 'asyncrl-endpoints' has no key 'AWS_ENDPOINT_URL'"):
        task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps={"asyncrl-endpoints": {}})


def test_unknown_placeholder_and_missing_inputs_are_errors(compiled):
    spec, platform = copy.deepcopy(compiled)
    params = resolve_parameters(spec)
    spec["deploymentSpec"]["executors"]["exec-setup"]["container"]["args"].append("{{$.pipeline_mystery}}")
    with pytest.raises(RehearsalError, match=r"task exit-handler-1/setup: unknown placeholder \{\{\$.pipeline_myst"):
        task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps=CONFIG_MAPS, outputs=OUT)
    spec, platform = copy.deepcopy(compiled)
    comp, key = _dag_task_key(spec, "reward")
    del spec["components"][comp]["dag"]["tasks"][key]["inputs"]["parameters"]["bucket"]
    with pytest.raises(RehearsalError, match=f"task exit-handler-1/{key}: input bucket: required by component"):
        task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps=CONFIG_MAPS, outputs=OUT)
    spec, platform = copy.deepcopy(compiled)
    comp, key = _dag_task_key(spec, "environment-replicas")
    del spec["components"][comp]["dag"]["tasks"][key]["inputs"]["parameters"]["pipelinechannel--s3_bucket"]
    # the KFP driver fails such a task too: "parent DAG does not have input parameter ..."
    with pytest.raises(RehearsalError, match="componentInputParameter 'pipelinechannel--s3_bucket' is not in the "
                                             "enclosing DAG's inputs"):
        task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps=CONFIG_MAPS, outputs=OUT)


def test_param_text_and_local_argv():
    assert [param_text(v) for v in ("a b", 2, 2.0, 0.5, True, ["0", "1"], {"k": 1})] == [
        "a b", "2", "2", "0.5", "true", '["0","1"]', '{"k":1}']
    assert local_argv(["python3", "-m", "m"])[1:] == ["-m", "m"]
    assert local_argv(["torchrun", "--standalone", "-m", "m"])[1:] == ["-m", "torch.distributed.run",
                                                                        "--standalone", "-m", "m"]
    assert local_argv(["sh", "-c", "true"]) == ["sh", "-c", "true"]
    assert local_argv(["asyncrl-task", "asyncrl.roles.reward", "--id", "0"], python="/venv/bin/python") == [
        "/venv/bin/python", "-m", "asyncrl.task_entrypoint", "asyncrl.roles.reward", "--id", "0"]


def test_roles_take_the_run_id_from_setups_output_and_resume_reaches_setup(compiled):
    """A resumed pipeline run (KFP run RUN) drives the old run: setup gets --resume-run-id, writes the run id to its
    output file, and every role's --run-url is built from that output, not from the KFP run id."""
    tasks = _tasks(compiled, setup_run_id="old-run-7", resume_run_id="old-run-7")
    for name, module, role_id in ROLE_TASKS:
        assert _after_module(tasks[name].argv, f"asyncrl.roles.{module}") == [
            "--run-url", "s3://asyncrl/runs/old-run-7", "--id", role_id, "--host", "0.0.0.0"], name
        assert tasks[name].pending == () and tasks[name].inputs["run_id"] == "old-run-7", name
    args = tasks["setup"].args
    pairs = dict(zip(args[0::2], args[1::2], strict=False))
    assert pairs["--run-id"] == RUN and pairs["--resume-run-id"] == "old-run-7"
    assert pairs["--run-id-output"] == f"/work/out/{SETUP_KEY}/run_id"
    assert tasks["setup"].outputs == {"run_id": "STRING"}
    values = json.loads(tasks["finalize"].args[tasks["finalize"].args.index("--executor_input") + 1])
    assert values["inputs"]["parameterValues"]["run_id"] == RUN  # an exit task may not read setup's output
    assert values["inputs"]["parameterValues"]["resume_run_id"] == "old-run-7"
    new = _tasks(compiled)["setup"].argv
    assert new[new.index("--resume-run-id") + 1] == ""  # default: a new run


def test_unknown_output_is_an_error_or_pending(compiled):
    with pytest.raises(RehearsalError, match="condition-branches-3: input pipelinechannel--setup-run_id: output 'run_id' of "
                                             "task 'exit-handler-1/setup' is not known"):
        _tasks(compiled, setup_run_id=None)
    tasks = _tasks(compiled, setup_run_id=None, defer=True)
    assert tasks["setup"].pending == () and tasks["finalize"].pending == ()
    for name, module, _ in ROLE_TASKS:
        assert tasks[name].pending == (f"{SETUP_KEY}:run_id",), name
        url = _after_module(tasks[name].argv, f"asyncrl.roles.{module}")[1]
        assert url == f"s3://asyncrl/runs/<pending output run_id of {SETUP_KEY}>", name
    assert PendingOutput(SETUP_KEY, "run_id").ref == f"{SETUP_KEY}:run_id"


def test_parse_output():
    assert parse_output("t", "run_id", "STRING", "old-run-7") == "old-run-7"
    assert parse_output("t", "n", "NUMBER_INTEGER", "3") == 3
    assert parse_output("t", "ids", "LIST", '["0","1"]') == ["0", "1"]
    with pytest.raises(RehearsalError, match=r"task t: output n: expected a JSON NUMBER_INTEGER value, got 'x'"):
        parse_output("t", "n", "NUMBER_INTEGER", "x")
    with pytest.raises(RehearsalError, match="parameter t.n: expected a NUMBER_INTEGER value, got 'a'"):
        parse_output("t", "n", "NUMBER_INTEGER", '"a"')


def test_runner_reads_setups_output_file_and_resolves_the_roles_again(compiled, tmp_path):
    """The runner's step after setup exits: read `<outputs_dir>/<setup key>/run_id`, switch the watched run to it,
    and resolve each role again before it starts (no process is started here)."""
    spec, platform = compiled
    params = resolve_parameters(spec, {"steps": 2, "resume_run_id": "old-run-7"})
    out = tmp_path / "kfp_outputs"

    def resolve(outputs):
        return task_commands(spec, platform, params, RUN, secrets=SECRETS, config_maps=CONFIG_MAPS,
                             outputs_dir=str(out), outputs=outputs, defer_outputs=True)

    run = _Run(resolve({}), tmp_path, {}, None, RunPaths("runs", RUN), lambda _: None, resolve, out)
    setup = next(t for t in run.tasks if t.name == "setup")
    reward = next(t for t in run.tasks if t.name == "reward")
    assert reward.pending and setup.argv[setup.argv.index("--run-id-output") + 1] == f"{out}/{SETUP_KEY}/run_id"
    with pytest.raises(RehearsalFailed, match=r"task setup: output parameter run_id: the container did not write"):
        run.read_outputs(setup)
    (out / SETUP_KEY).mkdir(parents=True)
    (out / SETUP_KEY / "run_id").write_text("old-run-7")
    run.read_outputs(setup)
    assert run.outputs == {SETUP_KEY: {"run_id": "old-run-7"}} and run.paths == RunPaths("runs", "old-run-7")
    ready = run.ready(reward)
    assert ready.pending == () and _after_module(ready.argv, "asyncrl.roles.reward")[:2] == [
        "--run-url", "s3://asyncrl/runs/old-run-7"]
    assert all(not t.pending for t in run.tasks)  # every task not started yet was resolved again
