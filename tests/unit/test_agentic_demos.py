"""Demonstrations (BFS plans replayed through the env), the SFT label mask, and the tiny model's cache key."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.config.schema import RunConfig
from asyncrl.envs import make
from asyncrl.envs.frozenlake import generate_level
from asyncrl.envs.sokoban import Level
from asyncrl.models.tokenizer import make_tokenizer
from asyncrl.tiny_model.build import MAX_POSITIONS, TEXT_MAX_POSITIONS, build_inputs, cache_key, max_positions
from asyncrl.tiny_model.demonstrations import (
    TRAIN_SEED_BASE,
    collect_demonstrations,
    frozenlake_demo,
    frozenlake_plan,
    sokoban_demo,
    sokoban_plan,
)
from asyncrl.tiny_model.sft import IGNORE
from asyncrl.tiny_model.sft_agentic import encode_demo

COMPACT = {"size": 4, "instructions": False}


def test_default_arithmetic_cache_key_is_unchanged() -> None:
    cfg = RunConfig()
    # computed with the code before the agentic model existed: cached arithmetic models stay valid
    assert cache_key(cfg) == "a722117dc6832f25"
    assert sorted(build_inputs(cfg)) == ["code_version", "max_new_tokens", "task", "tiny"]
    assert max_positions(cfg) == MAX_POSITIONS == 256


def test_agentic_build_inputs_use_env_not_task() -> None:
    base = {"env": {"name": "frozenlake", "params": COMPACT, "max_turns": 8}}
    cfg = RunConfig.model_validate(base)
    inputs = build_inputs(cfg)
    assert "task" not in inputs and inputs["env"]["params"] == COMPACT and inputs["env"]["demonstrations"] == 48
    assert max_positions(cfg) == TEXT_MAX_POSITIONS == 512
    other = RunConfig.model_validate({**base, "task": {"max_operand": 99}})
    assert cache_key(other) == cache_key(cfg)  # the task does not matter to the agentic model
    for change in ({"max_turns": 9}, {"demonstrations": 8}, {"system_prompt": "Go"}, {"params": {"size": 5}}):
        changed = RunConfig.model_validate({"env": {**base["env"], **change}})
        assert cache_key(changed) != cache_key(cfg), change
    assert cache_key(cfg) != cache_key(RunConfig())


def test_frozenlake_plan_is_shortest_and_avoids_holes() -> None:
    assert frozenlake_plan(["S.H", "...", "H.G"]) == ["right", "down", "right", "down"]
    assert frozenlake_plan(["SH", ".G"]) == ["down", "right"]
    assert frozenlake_plan(["S.H", "HHH", "..G"]) is None
    rows = ["S..H", ".HH.", "....", "H..G"]
    assert frozenlake_plan(rows) == ["down", "down", "right", "right", "right", "down"]


def test_frozenlake_demo_replays_in_the_env() -> None:
    seed = TRAIN_SEED_BASE + 3
    demo = frozenlake_demo(seed, COMPACT)
    plan = frozenlake_plan(generate_level(seed))
    assert plan is not None
    assert [m["role"] for m in demo] == ["user", "assistant"] * len(plan)
    assert [m["content"] for m in demo[1::2]] == plan
    env = make("frozenlake", **COMPACT)
    obs, _ = asyncio.run(env.reset(seed))
    for user, assistant in zip(demo[0::2], demo[1::2], strict=True):
        assert user["content"] == obs and len(obs) == 19
        result = asyncio.run(env.step(assistant["content"]))
        obs = result.observation
    assert result.done and result.info["success"] is True and result.reward == 1.0
    with_system = frozenlake_demo(seed, COMPACT, system_prompt="Reach G.")
    assert with_system[0] == {"role": "system", "content": "Reach G."} and with_system[1:] == demo
    with pytest.raises(ValueError, match="slippery"):
        frozenlake_demo(seed, {**COMPACT, "slippery": True})


def test_collect_skips_levels_longer_than_max_turns() -> None:
    demos = collect_demonstrations("frozenlake", COMPACT, 3, max_turns=8)
    assert [d[0]["content"] for d in demos] == [
        frozenlake_demo(TRAIN_SEED_BASE + i, COMPACT)[0]["content"] for i in range(3)
    ]
    assert collect_demonstrations("frozenlake", COMPACT, 0) == []
    with pytest.raises(RuntimeError, match="within 5 turns"):
        collect_demonstrations("frozenlake", COMPACT, 2, max_turns=5)  # 4x4 needs at least 6 moves


def test_sokoban_plan_and_demo() -> None:
    level = Level.parse("#####\n#@$.#\n#___#\n#####")
    assert sokoban_plan(level) == ["right"]
    level = Level.parse("######\n#_.__#\n#_$__#\n#_@__#\n######")
    assert sokoban_plan(level) == ["up"]
    stuck = Level.parse("#####\n#$__#\n#_@.#\n#####")  # the box is in a corner
    assert sokoban_plan(stuck) is None
    demo = sokoban_demo(TRAIN_SEED_BASE, {"size": 6, "num_boxes": 1})
    assert demo[-1]["role"] == "assistant" and len(demo) % 2 == 0


def test_encode_demo_labels_only_assistant_content_and_eos() -> None:
    tok = make_tokenizer("text")
    demo = [
        {"role": "system", "content": "Go"},
        {"role": "user", "content": "P.\n.G"},
        {"role": "assistant", "content": "right"},
        {"role": "user", "content": ".P\n.G"},
        {"role": "assistant", "content": "down"},
    ]
    ids, labels = encode_demo(tok, demo)
    # <bos> <|system|> G o <|user|> P . \n . G <|assistant|> r i g h t <eos> <|user|> . P \n . G <|assistant|> d o w n <eos>
    assert ids == [1, 100, 51, 33, 101, 60, 81, 99, 81, 51, 102, 36, 27, 25, 26, 38, 2,
                   101, 81, 60, 99, 81, 51, 102, 22, 33, 41, 32, 2]
    x = IGNORE
    assert labels == [x] * 11 + [36, 27, 25, 26, 38, 2] + [x] * 7 + [22, 33, 41, 32, 2]
