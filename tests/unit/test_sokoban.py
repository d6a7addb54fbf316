"""Sokoban rules on hand-made rooms: moves, walls, pushes, blocked pushes, win detection, seeded solvable levels."""

from __future__ import annotations

import asyncio
from collections import deque

import pytest

from asyncrl.envs import EpisodeOver, make
from asyncrl.envs.frozenlake import ACTIONS
from asyncrl.envs.sokoban import Level, Sokoban, generate_level

ROOM = """
######
#_@$.#
#____#
#_$$_#
#_.__#
######
"""


def _env(text: str, **kw) -> Sokoban:
    env = Sokoban(size=6, **kw)
    asyncio.run(env.reset(0))
    env.level = Level.parse(text)
    return env


def _step(env: Sokoban, action: str):
    return asyncio.run(env.step(f"<answer>{action}</answer>"))


def test_parse_and_render_round_trip() -> None:
    level = Level.parse(ROOM)
    assert level.player == (1, 2) and level.boxes == {(1, 3), (3, 2), (3, 3)} and level.targets == {(1, 4), (4, 2)}
    assert level.render() == ROOM.strip()


def test_walls_and_plain_moves() -> None:
    level = Level.parse("####\n#@_#\n#__#\n####")
    assert level.push("up") == 0 and level.player == (1, 1)  # wall
    assert level.push("left") == 0 and level.player == (1, 1)
    level.push("right")
    assert level.player == (1, 2)


def test_push_onto_a_target_and_blocked_pushes() -> None:
    level = Level.parse(ROOM)
    assert level.push("right") == 1  # the box at (1,3) goes onto the target (1,4)
    assert level.player == (1, 3) and (1, 4) in level.boxes
    assert level.push("right") == 0 and level.player == (1, 3)  # the box is against the wall: no move
    level = Level.parse(ROOM)
    level.player = (2, 2)
    assert level.push("down") == 1 and level.player == (3, 2) and (4, 2) in level.boxes  # onto the target (4,2)
    assert level.push("right") == 0 and level.player == (3, 3) and (3, 4) in level.boxes  # pushed onto floor
    assert level.push("right") == 0 and level.player == (3, 3) and (3, 4) in level.boxes  # the wall blocks it
    level = Level.parse("######\n#@$$_#\n######\n######\n######\n######")
    assert level.push("right") == 0 and level.player == (1, 1) and level.boxes == {(1, 2), (1, 3)}


def test_win_detection_and_rewards() -> None:
    env = _env("#####\n#@$.#\n#####\n#####\n#####", box_reward=0.5)
    r = _step(env, "right")
    assert (r.reward, r.terminated, r.info["success"], r.info["boxes_on_target"]) == (1.5, True, True, 1)
    with pytest.raises(EpisodeOver):
        _step(env, "left")


def test_push_off_a_target_costs_the_box_reward() -> None:
    env = _env("######\n#@*_.#\n######\n######\n######\n######", box_reward=0.5)  # one box, two targets
    r = _step(env, "right")  # the box leaves the target (1,2) for the floor (1,3)
    assert r.reward == -0.5 and not r.done and r.info["boxes_on_target"] == 0
    r = _step(env, "right")  # and onto the target (1,4): all boxes on targets
    assert r.reward == 1.5 and r.terminated


def test_format_penalty_and_truncation() -> None:
    env = _env(ROOM, max_steps=2, format_penalty=-0.2)
    r = asyncio.run(env.step("no idea"))
    assert (r.reward, r.info["invalid_action"], r.done) == (-0.2, True, False)
    r = _step(env, "down")
    assert (r.truncated, r.terminated, r.info["success"]) == (True, False, False)


def _solvable(level: Level, limit: int = 200_000) -> bool:
    """Breadth-first search over (player, boxes) states."""
    start = (level.player, frozenset(level.boxes))
    seen, todo = {start}, deque([start])
    while todo and len(seen) < limit:
        player, boxes = todo.popleft()
        if boxes <= level.targets:
            return True
        for action in ACTIONS:
            state = Level(level.walls, level.targets, set(boxes), player, level.size)
            state.push(action)
            key = (state.player, frozenset(state.boxes))
            if key not in seen:
                seen.add(key)
                todo.append(key)
    return False


@pytest.mark.parametrize("num_boxes", [1, 2])
def test_generated_levels_are_seeded_unsolved_and_solvable(num_boxes: int) -> None:
    for seed in range(15):
        level = generate_level(seed, size=6, num_boxes=num_boxes)
        again = generate_level(seed, size=6, num_boxes=num_boxes)
        assert level.render() == again.render()
        assert len(level.boxes) == len(level.targets) == num_boxes
        assert not level.solved and _solvable(level)


def test_registry_and_parameter_errors() -> None:
    env = make("sokoban", num_boxes=2)
    obs, info = asyncio.run(env.reset(4))
    level = info["level"]
    assert level.count("$") + level.count("*") == 2 and level.count("@") + level.count("+") == 1
    assert obs.startswith(level)
    with pytest.raises(ValueError, match="num_boxes"):
        make("sokoban", num_boxes=3)


def test_without_instructions_the_observation_is_the_grid_alone():
    import asyncio

    from asyncrl.envs.sokoban import Sokoban

    env = Sokoban(size=6, instructions=False)
    obs, info = asyncio.run(env.reset(3))
    assert obs == info["level"] and "Steps" not in obs and len(obs.split("\n")) == 6
    assert asyncio.run(env.step("up")).observation.count("\n") == 5
