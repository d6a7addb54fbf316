"""The rollout scheduler's knobs have one source: `SchedulerConfig` gives their defaults to the run config's rollout
section and to the simulator's job, `RolloutConfig.scheduler_config` maps a run to a scheduler, and the simulator
takes the knobs by the flat names `asyncrl simulate --set` uses."""

from __future__ import annotations

import argparse
import json
from dataclasses import fields
from pathlib import Path

import pytest

from asyncrl.config import load_config
from asyncrl.config.schema import RolloutConfig
from asyncrl.rollout.scheduler import SchedulerConfig
from asyncrl.sim import SimConfig
from asyncrl.sim.commands import run_simulate
from asyncrl.sim.config import DEFAULT_JOB, SCHEDULER_KEYS

# run config field -> scheduler field, for the knobs the two share
SHARED = {"async_ratio": "async_ratio", "prompts_per_step": "prompts_per_step", "samples_per_prompt": "group_size",
          "max_new_tokens": "max_new_tokens", "routing": "routing", "replicate_prompts": "replicate",
          "extra_samples_per_prompt": "extra_samples", "extra_groups": "extra_groups",
          "dynamic_filter": "dynamic_filter", "replace_failed": "replace_failed", "partial_rollout": "partial_rollout",
          "max_refill": "max_refill"}


def test_the_run_config_takes_the_scheduler_defaults() -> None:
    ro, sched = RolloutConfig(), SchedulerConfig()
    for run_key, sched_key in SHARED.items():
        assert getattr(ro, run_key) == getattr(sched, sched_key), run_key


def test_a_run_maps_to_its_writers_scheduler() -> None:
    ro = load_config(None, ["rollout.prompts_per_step=8", "rollout.num_writers=2", "rollout.samples_per_prompt=4",
                            "rollout.routing=round_robin", "rollout.extra_samples_per_prompt=1",
                            "rollout.mode=sync", "rollout.replace_failed=2", "rollout.max_refill=5",
                            "training.micro_batch_size=32"]).rollout
    s = ro.scheduler_config(num_servers=3, writer="env1", incarnation=5)
    assert (s.async_ratio, s.prompts_per_step, s.group_size, s.num_servers, s.extra_samples) == (0, 4, 4, 3, 1)
    assert (s.routing, s.writer, s.incarnation, s.replace_failed, s.max_refill) == ("round_robin", "env1", 5, 2, 5)
    for run_key, sched_key in SHARED.items():
        if run_key not in ("prompts_per_step", "async_ratio"):
            assert getattr(s, sched_key) == getattr(ro, run_key), run_key


def test_sim_config_takes_flat_scheduler_keys() -> None:
    assert {f.name for f in fields(SchedulerConfig)} - set(SCHEDULER_KEYS) == {"num_servers", "max_new_tokens",
                                                                               "writer", "incarnation"}
    cfg = SimConfig.of(gpus=4, async_ratio=3, prompts_per_step=32, group_size=4, routing="least_requests")
    assert cfg.scheduler == SchedulerConfig(async_ratio=3, prompts_per_step=32, group_size=4, routing="least_requests")
    assert SimConfig().scheduler == DEFAULT_JOB and DEFAULT_JOB.prompts_per_step == 16
    assert SimConfig.of(dynamic_filter=True, max_refill=0).scheduler.max_refill == 0
    flat = cfg.flat()
    assert flat["async_ratio"] == 3 and flat["gpus"] == 4 and "scheduler" not in flat and "num_servers" not in flat
    assert SimConfig.of(**{k: v for k, v in flat.items() if k not in ("slowdowns", "failures")}) == cfg
    with pytest.raises(ValueError, match="num_servers is not set here: derived from gpus"):
        SimConfig.of(num_servers=2)
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['asyncratio'\]"):
        SimConfig.of(asyncratio=2)
    with pytest.raises(ValueError, match="async_ratio: expected >= 0, got -1"):
        SimConfig.of(async_ratio=-1)


def test_simulate_cli_keys(tmp_path: Path) -> None:
    out = tmp_path / "sim.json"
    args = argparse.Namespace(preset="gpu-7b", overrides=[
        "async_ratio=1", "prompts_per_step=4", "group_size=2", "routing=least_tokens", "gpus=4", "steps=3",
        "warmup_steps=1", "workload.kind=fixed", "workload.median=64", "workload.prompt=16"],
        json_path=str(out), no_baseline=True, calibration=None)
    doc = run_simulate(args)
    assert json.loads(out.read_text())["config"] == doc["config"]
    assert {k: doc["config"][k] for k in ("async_ratio", "prompts_per_step", "group_size", "routing", "gpus")} == {
        "async_ratio": 1, "prompts_per_step": 4, "group_size": 2, "routing": "least_tokens", "gpus": 4}
    assert doc["result"]["samples_per_step"] == 8
