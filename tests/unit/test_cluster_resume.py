"""The pure checks of a cluster resume (asyncrl.run.resume): which configuration differences refuse it, with
each refused field named with its stored and given values; `training.steps` may only grow, and only when the
critics' derived warm-up stays the same; where the run is reached (S3 endpoint, cache folder) may differ."""

import pytest

from asyncrl.cluster.setup import resolve_config
from asyncrl.run.resume import ResumeError, config_differences, flatten, resumable_config

ASYPPO = "training:\n  advantage: gae\n  asyppo: {}\n"


def test_flatten_and_differences():
    assert flatten({"a": {"b": 1, "c": [1, 2]}, "d": None, "e": {}}) == {"a.b": 1, "a.c": [1, 2], "d": None, "e": {}}
    assert config_differences({"a": {"b": 1, "c": 2}, "x": 1}, {"a": {"b": 1, "c": 3}, "y": 1}) == ["a.c", "x", "y"]
    assert config_differences({"a": {"b": None}}, {"a": {}}) == ["a", "a.b"]
    assert config_differences({"a": [1]}, {"a": [1]}) == []


def test_same_configuration_resumes_as_it_is():
    stored = resolve_config("", ["training.steps=5"], "old").model_dump(mode="json")
    cfg, grew = resumable_config(stored, resolve_config("", ["training.steps=5"], "old"), "s3://b/runs/old/config.json")
    assert not grew and cfg.training.steps == 5


def test_defaults_added_since_the_run_started_count_as_equal():
    stored = resolve_config("", [], "old").model_dump(mode="json")
    del stored["timeouts"]["peer_s"]  # a field a newer image added, with its default
    assert resumable_config(stored, resolve_config("", [], "old"), "cfg")[1] is False


def test_steps_may_grow():
    stored = resolve_config("", ["training.steps=5"], "old").model_dump(mode="json")
    cfg, grew = resumable_config(stored, resolve_config("", ["training.steps=9"], "old"), "cfg")
    assert grew and cfg.training.steps == 9


def test_where_the_run_is_reached_may_differ():
    """A restarted or moved S3 service gives the pods a new endpoint (found by the container rehearsal, whose resumed
    run's S3 came back on new ports); the cache folder is the pod's. The run goes on with the given ones."""
    stored = resolve_config("", ["storage.endpoint_url=http://10.0.0.1:8333", "cache_dir=/old/cache"],
                            "old").model_dump(mode="json")
    given = resolve_config("", ["storage.endpoint_url=http://s3.asyncrl.svc:8333", "cache_dir=/cache/asyncrl"], "old")
    cfg, grew = resumable_config(stored, given, "cfg")
    assert not grew and cfg.storage.endpoint_url == "http://s3.asyncrl.svc:8333" and cfg.cache_dir == "/cache/asyncrl"


def test_every_other_difference_is_named_with_both_values():
    stored = resolve_config("", ["training.steps=5", "rollout.async_ratio=2"], "old").model_dump(mode="json")
    given = resolve_config("", ["training.steps=3", "rollout.async_ratio=1", "training.loss_params.w_max=1.5"], "old")
    with pytest.raises(ResumeError) as err:
        resumable_config(stored, given, "s3://b/runs/old/config.json")
    msg = str(err.value)
    assert msg.startswith("run old: the configuration given differs from the stored s3://b/runs/old/config.json in "
                          "3 field(s): rollout.async_ratio (stored 2, given 1); training.loss_params.w_max (stored "
                          "2.0, given 1.5); training.steps (stored 5, given 3: it may only grow)")


def test_steps_growth_that_changes_the_critics_warmup_is_refused():
    stored = resolve_config(ASYPPO, ["training.steps=5"], "old").model_dump(mode="json")  # warm-up min(10, 4) = 4
    with pytest.raises(ResumeError, match=r"training.steps \(stored 5, given 20: it would change the critics' "
                                          r"warm-up from 4 to 10 steps; set training.critic.warmup_steps to keep it\)"):
        resumable_config(stored, resolve_config(ASYPPO, ["training.steps=20"], "old"), "cfg")
    stored = resolve_config(ASYPPO, ["training.steps=20"], "old").model_dump(mode="json")  # warm-up 10 either way
    assert resumable_config(stored, resolve_config(ASYPPO, ["training.steps=30"], "old"), "cfg")[1] is True


def test_a_stored_configuration_that_no_longer_parses_is_named():
    stored = resolve_config("", [], "old").model_dump(mode="json")
    stored["rollout"]["no_such_field"] = 1
    with pytest.raises(ResumeError, match=r"run old: the stored configuration no longer parses: "
                                          r"[\s\S]*rollout.no_such_field: unknown"):
        resumable_config(stored, resolve_config("", [], "old"), "s3://b/runs/old/config.json")
