"""A generation replica with several GPUs runs one vLLM engine, tensor-parallel across them: the config field and
its check against the model's attention heads (the built-in model in the config, a model folder in the role), the
engine settings that carry it to vLLM, and the weight group's ranks (one per worker). Also the pods' cache folder
(ASYNCRL_CACHE_DIR), which replaces the config's cache_dir in a process and never refuses a resume.
TP > 1 itself needs GPUs (vLLM's CPU build runs one worker): not run here."""

import json

import pytest

from asyncrl.config import ConfigError, load_config, with_cache_dir_from_env
from asyncrl.generation.parallel import attention_heads, check_model_folder, check_tensor_parallel
from asyncrl.roles.generation import engine_settings
from asyncrl.run.resume import ResumeError, resumable_config
from asyncrl.weights.sync import WeightSender, group_ranks


def test_the_config_field_defaults_to_one_and_is_checked_against_the_built_in_model():
    assert load_config(None).generation.tensor_parallel_size == 1
    cfg = load_config(None, ["generation.tensor_parallel_size=2"])  # hidden 128: 2 heads of 64
    assert cfg.generation.tensor_parallel_size == 2
    with pytest.raises(ConfigError, match=r"generation.tensor_parallel_size: expected a divisor of the built-in tiny "
                                          r"model's 2 attention heads \(model.tiny.hidden_size / 64\), got 4"):
        load_config(None, ["generation.tensor_parallel_size=4"])
    assert load_config(None, ["generation.tensor_parallel_size=4", "model.tiny.hidden_size=256"])
    with pytest.raises(ConfigError, match="generation.tensor_parallel_size"):
        load_config(None, ["generation.tensor_parallel_size=0"])


def test_a_model_folder_must_split_evenly(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"num_attention_heads": 12, "num_key_value_heads": 2}))
    check_model_folder(4, tmp_path)
    with pytest.raises(ValueError, match=r"expected a divisor of the 12 attention heads of .* \(one of \[1, 2, 3, 4, "
                                         r"6, 12\]\), got 8; on a cluster it is the pipeline's generation_gpus"):
        check_model_folder(8, tmp_path)
    check_model_folder(1, tmp_path / "absent")  # one GPU: nothing to check, nothing read
    with pytest.raises(ValueError, match=r"cannot read the model's .*config.json"):
        check_model_folder(2, tmp_path / "absent")
    assert attention_heads({"text_config": {"num_attention_heads": 32}}) == 32
    with pytest.raises(ValueError, match="names none"):
        check_tensor_parallel(2, attention_heads({}), "m")


def test_the_engine_gets_the_replicas_tensor_parallel_size():
    g = load_config(None, ["generation.tensor_parallel_size=2", "generation.seed=5"]).generation
    settings = engine_settings(g, "/models/m", index=3, version=7)
    assert (settings.tensor_parallel_size, settings.seed, settings.initial_version, settings.model) == (
        2, 8, 7, "/models/m")


def test_every_worker_of_every_server_gets_its_own_weight_group_rank():
    for servers in (1, 3):
        for tp in (1, 2, 4):
            world, firsts = group_ranks(servers, tp)
            # a worker joins as its server's first rank + its own tensor-parallel rank (worker_extension)
            ranks = [first + r for first in firsts for r in range(tp)]
            assert sorted(ranks) == list(range(1, world)) and world == 1 + servers * tp
    assert WeightSender(["http://a", "http://b"], workers_per_server=2).world_size == 5
    with pytest.raises(ValueError, match="workers_per_server: expected >= 1"):
        WeightSender(["http://a"], workers_per_server=0)


def test_the_pods_cache_folder_replaces_cache_dir():
    cfg = load_config(None)
    assert with_cache_dir_from_env(cfg, {}) is cfg
    assert with_cache_dir_from_env(cfg, {"ASYNCRL_CACHE_DIR": "/cache/asyncrl"}).cache_dir == "/cache/asyncrl"
    with pytest.raises(ConfigError, match=r"ASYNCRL_CACHE_DIR: expected an absolute folder .*got 'cache'"):
        with_cache_dir_from_env(cfg, {"ASYNCRL_CACHE_DIR": "cache"})


def test_a_different_cache_dir_never_refuses_a_resume():
    stored = load_config(None, ["run_id=r1"]).model_dump(mode="json")
    resumed, grew = resumable_config(stored, load_config(None, ["run_id=r1", "cache_dir=/cache/asyncrl"]), "stored")
    assert not grew and resumed.run_id == "r1"
    with pytest.raises(ResumeError, match="rollout.async_ratio"):
        resumable_config(stored, load_config(None, ["run_id=r1", "rollout.async_ratio=3"]), "stored")
