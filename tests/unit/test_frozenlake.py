"""FrozenLake rules on hand-made lakes: moves, walls, holes, the goal, slips, the step limit and action parsing."""

from __future__ import annotations

import asyncio

import pytest

from asyncrl.envs import EpisodeOver, make, registered
from asyncrl.envs.frozenlake import FrozenLake, _reachable, generate_level, move, parse_action

LAKE = ["S.H", "...", "H.G"]


def _env(rows: list[str], **kw) -> FrozenLake:
    env = FrozenLake(size=len(rows), **kw)
    asyncio.run(env.reset(0))
    env.rows = list(rows)  # a hand-made level on top of a reset episode
    return env


def _step(env: FrozenLake, text: str):
    return asyncio.run(env.step(text))


@pytest.mark.parametrize(("text", "action"), [
    ("right", "right"), ("I will go <answer>Down</answer>.", "down"), ("UP", "up"),
    ("left or right? <answer>left</answer> then <answer>up</answer>", "up"),
    ("first left, then right", "right"), ("<answer>jump</answer> down", None), ("upward", None), ("", None),
])
def test_parse_action(text: str, action: str | None) -> None:
    assert parse_action(text) == action


def test_moves_and_walls() -> None:
    assert move(LAKE, (0, 0), "left") == (0, 0) and move(LAKE, (0, 0), "up") == (0, 0)  # edges
    assert move(LAKE, (0, 0), "right") == (0, 1) and move(LAKE, (0, 0), "down") == (1, 0)
    assert move(LAKE, (2, 2), "right") == (2, 2) and move(LAKE, (2, 2), "down") == (2, 2)


def test_reaching_the_goal_wins() -> None:
    env = _env(LAKE)
    path = ["down", "right", "down", "right"]
    results = [_step(env, f"<answer>{a}</answer>") for a in path]
    assert [r.reward for r in results] == [0.0, 0.0, 0.0, 1.0]
    assert [r.terminated for r in results] == [False, False, False, True]
    assert results[-1].info["success"] is True and env.pos == (2, 2)
    with pytest.raises(EpisodeOver):
        _step(env, "up")


def test_a_hole_ends_the_episode_without_reward() -> None:
    env = _env(LAKE)
    _step(env, "right")
    r = _step(env, "right")  # (0, 2) is a hole
    assert (r.reward, r.terminated, r.truncated, r.info["success"]) == (0.0, True, False, False)


def test_unparseable_reply_costs_the_penalty_and_a_step() -> None:
    env = _env(LAKE, max_steps=2, format_penalty=-0.25)
    r = _step(env, "hmm")
    assert (r.reward, r.info["invalid_action"], env.pos, r.done) == (-0.25, True, (0, 0), False)
    r = _step(env, "down")
    assert (r.reward, r.truncated, r.terminated, r.info["success"]) == (0.0, True, False, False)


def test_rendering_marks_the_player() -> None:
    env = _env(LAKE)
    assert env.render() == "P.H\n...\nH.G"
    _step(env, "down")
    assert env.render().splitlines() == ["..H", "P..", "H.G"]


def test_slippery_moves_are_seeded_and_perpendicular() -> None:
    def run(seed: int) -> list[str]:
        env = FrozenLake(size=4, hole_prob=0.0, slippery=True, max_steps=12)
        asyncio.run(env.reset(seed))
        return [asyncio.run(env.step("right")).info["moved"] for _ in range(6) if not env.done]

    a, b = run(3), run(3)
    assert a == b  # the same seed slips the same way
    assert set(a) <= {"right", "down", "up"}  # never backwards
    moves = [m for s in range(30) for m in run(s)]
    assert 0.2 < moves.count("right") / len(moves) < 0.47  # about 1/3 as meant


def test_levels_are_seeded_and_solvable() -> None:
    assert generate_level(5) == generate_level(5)
    assert generate_level(5) != generate_level(6) or generate_level(5) != generate_level(7)
    for seed in range(50):
        rows = generate_level(seed, size=5, hole_prob=0.4)
        assert rows[0][0] == "S" and rows[4][4] == "G" and len(rows) == 5
        assert _reachable(rows)
    assert not _reachable(["SH", "HG"])  # the check the generator relies on
    assert sum(row.count("H") for s in range(50) for row in generate_level(s, size=5, hole_prob=0.4)) > 100


def test_registry_and_parameter_errors() -> None:
    assert "frozenlake" in registered()
    env = make("frozenlake", size=3, slippery=True)
    obs, info = asyncio.run(env.reset(1))
    assert obs.startswith("P") and len(info["level"]) == 3
    with pytest.raises(ValueError, match="unknown name 'sokobanx'"):
        make("sokobanx")
    with pytest.raises(ValueError, match="bad parameters"):
        make("frozenlake", colour="blue")
    with pytest.raises(ValueError, match="size"):
        make("frozenlake", size=1)


def test_compact_observation_is_the_grid_alone() -> None:
    assert generate_level(7) == ["S...", ".H..", "HH..", "H..G"]
    env = make("frozenlake", size=4, instructions=False)
    obs, _ = asyncio.run(env.reset(7))
    assert obs == "P...\n.H..\nHH..\nH..G" and len(obs) == 19
    r = asyncio.run(env.step("right"))
    assert r.observation == ".P..\n.H..\nHH..\nH..G"
    verbose, _ = asyncio.run(make("frozenlake", size=4).reset(7))
    assert verbose.startswith(obs + "\nYou are P.") and verbose.endswith("Steps left: 20.")
