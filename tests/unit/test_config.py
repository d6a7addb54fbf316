"""RunConfig loading: defaults, overrides, and errors that name the field and what was expected."""

from pathlib import Path

import pytest

from asyncrl.config import ConfigError, load_config
from asyncrl.config.schema import RunConfig


def write(tmp_path, text):
    p = tmp_path / "c.yaml"
    p.write_text(text)
    return p


def test_defaults_are_valid():
    cfg = load_config(None)
    assert cfg.rollout.async_ratio >= 0 and cfg.training.loss == "decoupled_ppo"


def test_override_types(tmp_path):
    cfg = load_config(write(tmp_path, "rollout:\n  async_ratio: 2\n"),
                      ["training.lr=0.001", "training.zero_stage=3", "training.loss_params.w_mask=[0.5, 2.0]", "name=exp-1"])
    assert cfg.rollout.async_ratio == 2
    assert cfg.training.lr == 0.001 and cfg.training.zero_stage == 3
    assert cfg.training.loss_params.w_mask == (0.5, 2.0) and cfg.name == "exp-1"


@pytest.mark.parametrize(
    ("override", "needle"),
    [
        ("rollout.async_ratio=-1", "rollout.async_ratio: Input should be greater than or equal to 0 (got -1)"),
        ("training.loss=ppo2", "training.loss: Input should be"),
        ("training.lrr=1", "training.lrr: unknown field"),
        ("training.zero_stage=4", "training.zero_stage: Input should be less than or equal to 3"),
        ("training.micro_batch_size=7", "training.micro_batch_size: expected a divisor of the batch of 64 samples"),
        ("training.micro_batch_size=128", "expected <= rollout.prompts_per_step * rollout.samples_per_prompt = 64"),
        ("rollout.samples_per_prompt=1", "rollout.samples_per_prompt: expected >= 2"),
        ("generation.max_model_len=17", "generation.max_model_len: expected >= longest prompt"),
        ("training.loss_params.w_mask=[2, 3]", "training.loss_params.w_mask: expected [lo, hi] with 0 <= lo < 1 < hi"),
        ("training.cispo_eps_high=4", "training.cispo_eps_high: moved to training.loss_params.eps_high"),
        ("training.loss_params.eps_high=4", "training.loss_params.eps_high: unknown parameter of loss 'decoupled_ppo'"),
        ("training.loss_params.tis_cap=0", "training.loss_params.tis_cap: unknown parameter"),
        ("training.loss=no_such_module:my_loss", "training.loss: loss 'no_such_module:my_loss': cannot import module"),
        ("storage.bucket=Bad_Bucket", "storage.bucket: String should match pattern"),
        ("rollout.num_writers=3", "rollout.num_writers: expected a divisor of rollout.prompts_per_step (8), got 3"),
        ("tracking.retry_deadline_s=0", "tracking.retry_deadline_s: Input should be greater than 0"),
        ("tracking.retry_deadline_s=-5", "tracking.retry_deadline_s: Input should be greater than 0"),
        ("tracking.retry_deadline_s=3601", "tracking.retry_deadline_s: Input should be less than or equal to 3600"),
        ("tracking.retry_deadline_s=soon", "tracking.retry_deadline_s: Input should be a valid number"),
    ],
)
def test_errors_name_the_field(override, needle):
    with pytest.raises(ConfigError) as err:
        load_config(None, ["rollout.max_new_tokens=12", override])
    assert needle in str(err.value)


def test_tracking_retry_deadline():
    assert load_config(None).tracking.retry_deadline_s == 60.0  # the MLflow deadline of before (timeouts.http_s)
    cfg = load_config(None, ["tracking.retry_deadline_s=2.5", "timeouts.http_s=30"])
    assert cfg.tracking.retry_deadline_s == 2.5 and cfg.timeouts.http_s == 30.0


def test_bad_files(tmp_path):
    with pytest.raises(ConfigError, match="no such configuration file"):
        load_config(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(write(tmp_path, "a: [1,\n"))
    with pytest.raises(ConfigError, match="expected a mapping of sections"):
        load_config(write(tmp_path, "- 1\n- 2\n"))
    with pytest.raises(ConfigError, match="unknown field"):
        load_config(write(tmp_path, "rolout:\n  async_ratio: 1\n"))


def test_bad_override_syntax():
    with pytest.raises(ConfigError, match="expected section.key=value"):
        load_config(None, ["training.lr"])
    with pytest.raises(ConfigError, match="is not a section"):
        load_config(None, ["name=a", "name.x=1"])


def test_task_eval_split_must_leave_train_problems():
    with pytest.raises(ConfigError, match=r"task.num_eval: expected fewer than the 1800 distinct problems"):
        load_config(None, ["task.num_eval=1800"])


def test_sync_mode_trains_on_policy_whatever_the_file_says():
    cfg = load_config("configs/default.yaml", ["rollout.mode=sync"])
    assert cfg.rollout.mode == "sync" and cfg.rollout.async_ratio == 0
    assert load_config("configs/default.yaml", []).rollout.async_ratio == 1


def test_rollout_engine_options_are_checked():
    with pytest.raises(ConfigError, match="rollout.length_tail.median_tokens"):
        load_config("configs/default.yaml", ["rollout.length_tail={median_tokens: 99, sigma: 1.0}"])
    with pytest.raises(ConfigError, match="rollout.routing"):
        load_config("configs/default.yaml", ["rollout.routing=fastest"])
    with pytest.raises(ConfigError, match="rollout.partial_rollout"):
        load_config("configs/default.yaml", ["rollout.partial_rollout=restart"])
    cfg = load_config("configs/default.yaml", ["rollout.extra_groups=4", "rollout.extra_samples_per_prompt=2",
                                               "rollout.max_new_tokens=12", "generation.max_model_len=64",
                                               "rollout.length_tail={median_tokens: 4, sigma: 1.5}"])
    assert cfg.rollout.extra_groups == 4 and cfg.rollout.length_tail.sigma == 1.5


@pytest.mark.parametrize("env, match", [
    ({"name": "nope"}, "env.name: unknown environment 'nope'"),
    ({"name": "frozenlake", "params": {"sizee": 4}}, "env.params: environment 'frozenlake': bad parameters"),
    ({"name": "remote", "params": {"url": "http://127.0.0.1:1"}}, r"env.params: a remote environment needs \['env'\]"),
    ({"name": "frozenlake", "max_turns": 0}, "max_turns"),
    ({"name": "frozenlake", "injection": {"failure_rate": 1.5}}, "failure_rate"),
    ({"name": "frozenlake", "executor": "fibers"}, "executor"),
])
def test_env_section_errors_name_the_field(env, match):
    with pytest.raises(ValueError, match=match):
        RunConfig(env=env)


def test_env_section_accepts_built_in_and_remote_environments():
    assert RunConfig(env={"name": "sokoban", "params": {"size": 6}}).env.name == "sokoban"
    cfg = RunConfig(env={"name": "remote", "params": {"url": "http://127.0.0.1:1", "env": "frozenlake"}})
    assert cfg.env.executor == "threads" and cfg.rollout.replace_failed == 0


def test_vllm_socket_folder_fits_a_unix_socket_path(tmp_path):
    from asyncrl.local.launcher import EmbeddedRun

    short = EmbeddedRun(RunConfig(runs_dir="/tmp/ar", run_id="r1"))  # nothing is created
    assert short.rpc_dir() == Path("/tmp/ar/r1/vllm-rpc").resolve()
    deep = EmbeddedRun(RunConfig(runs_dir=str(tmp_path / ("d" * 60)), run_id="bench-agentic-async_redundant-1"))
    rpc = deep.rpc_dir()
    assert len(str(rpc)) + len("/a1458236-807b-47f3-916b-f1a6979023cc") <= 107
    assert rpc == EmbeddedRun(RunConfig(runs_dir=str(tmp_path / ("d" * 60)), run_id="bench-agentic-async_redundant-1")).rpc_dir()


def test_network_interface_reaches_nccl_and_gloo():
    from asyncrl.roles.context import apply_network_env

    env = {"NCCL_SOCKET_IFNAME": "eth9"}
    apply_network_env(RunConfig(network={"socket_ifname": "eth0"}), env)
    assert env == {"NCCL_SOCKET_IFNAME": "eth0", "GLOO_SOCKET_IFNAME": "eth0"}
    env = {}
    apply_network_env(RunConfig(network={"socket_ifname": "^lo,docker"}), env)
    assert env == {"NCCL_SOCKET_IFNAME": "^lo,docker"}  # gloo has no exclusion syntax
    env = {"GLOO_SOCKET_IFNAME": "ib0"}
    apply_network_env(RunConfig(), env)
    assert env == {"GLOO_SOCKET_IFNAME": "ib0"}
    with pytest.raises(ValueError, match="socket_ifname"):
        RunConfig(network={"socket_ifname": "eth0; rm -rf /"})


def test_the_replaced_before_after_evaluation_says_what_replaced_it(tmp_path):
    with pytest.raises(ConfigError, match=r"eval_before_after: no longer a field.*eval.every_steps: 0 turns it off"):
        load_config(write(tmp_path, "eval_before_after: false\n"))
    assert load_config(None).eval.every_steps == 50  # on by default: the warm start, every 50 versions, the end
