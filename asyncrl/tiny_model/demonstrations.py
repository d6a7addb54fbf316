"""Solved demonstrations of the built-in agentic environments, for the tiny model's supervised warm start.

Owns the shortest-path solvers (BFS over FrozenLake cells, over Sokoban (player, boxes) states) and the replay of a
solution through the real environment into chat messages.

Invariants:
- a demonstration is the chat of one successful episode: [system (only if a system prompt is given)], then
  user (observation) / assistant (the bare action word, e.g. "right") pairs; it ends with the assistant's winning
  action (the final observation is not part of it);
- every observation is exactly what the environment returned (`make(name, **params)`, `reset(seed)`, `step`), and
  the replay is checked: the last step must report `info["success"]`, else RuntimeError;
- the plan is a shortest one (BFS, actions tried in the fixed order ACTION_ORDER), so a seed always gives the same
  demonstration;
- train level seeds are TRAIN_SEED_BASE + i; evaluation seeds 0..num_eval-1 are never used here; DEV_SEED_BASE + i
  are train-range seeds kept for the warm start's early stopping (never demonstrated).
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Mapping
from typing import Any

from asyncrl.envs import make
from asyncrl.envs.frozenlake import move as lake_move
from asyncrl.envs.sokoban import Level

log = logging.getLogger(__name__)

TRAIN_SEED_BASE = 1_000_000
DEV_SEED_BASE = 2_000_000
ACTION_ORDER = ("right", "down", "left", "up")
Message = dict[str, str]
SOKOBAN_MAX_STATES = 200_000


def frozenlake_plan(rows: list[str]) -> list[str] | None:
    """A shortest list of actions from the start (0, 0) to `G` avoiding `H` on a non-slippery lake; None if none."""
    start = (0, 0)
    parents: dict[tuple[int, int], tuple[tuple[int, int], str] | None] = {start: None}
    todo = deque([start])
    while todo:
        pos = todo.popleft()
        if rows[pos[0]][pos[1]] == "G":
            actions: list[str] = []
            while (link := parents[pos]) is not None:
                pos, action = link
                actions.append(action)
            return actions[::-1]
        for action in ACTION_ORDER:
            nxt = lake_move(rows, pos, action)
            if nxt not in parents and rows[nxt[0]][nxt[1]] != "H":
                parents[nxt] = (pos, action)
                todo.append(nxt)
    return None


def sokoban_plan(level: Level, max_states: int = SOKOBAN_MAX_STATES) -> list[str] | None:
    """A shortest list of moves that puts every box on a target (BFS over (player, boxes)); None if none found
    within `max_states` states."""
    State = tuple[tuple[int, int], frozenset[tuple[int, int]]]
    start: State = (level.player, frozenset(level.boxes))
    parents: dict[State, tuple[State, str] | None] = {start: None}
    todo = deque([start])
    while todo and len(parents) <= max_states:
        state = todo.popleft()
        if state[1] <= level.targets:
            actions: list[str] = []
            while (link := parents[state]) is not None:
                state, action = link
                actions.append(action)
            return actions[::-1]
        for action in ACTION_ORDER:
            probe = Level(level.walls, level.targets, set(state[1]), state[0], level.size)
            probe.push(action)
            nxt: State = (probe.player, frozenset(probe.boxes))
            if nxt not in parents:
                parents[nxt] = (state, action)
                todo.append(nxt)
    return None


def plan_for(name: str, info: Mapping[str, Any]) -> list[str] | None:
    """The shortest plan of the level described by `reset`'s info (frozenlake: rows; sokoban: its rendering)."""
    if name == "frozenlake":
        return frozenlake_plan(list(info["level"]))
    if name == "sokoban":
        return sokoban_plan(Level.parse(str(info["level"])))
    raise ValueError(f"env.name: demonstrations exist for frozenlake and sokoban, got {name!r}")


async def play_demo(name: str, params: Mapping[str, Any], seed: int, system_prompt: str = "",
                    max_turns: int | None = None) -> list[Message] | None:
    """The messages of the solved episode of level `seed`; None when its shortest plan exceeds `max_turns`."""
    if name == "frozenlake" and params.get("slippery", False):
        raise ValueError("env.params.slippery: demonstrations need a non-slippery lake (a plan cannot be replayed)")
    env = make(name, **dict(params))
    observation, info = await env.reset(seed)
    plan = plan_for(name, info)
    if plan is None:
        raise RuntimeError(f"{name} level {seed}: no solution found")
    if max_turns is not None and len(plan) > max_turns:
        return None
    messages: list[Message] = [{"role": "system", "content": system_prompt}] if system_prompt else []
    for i, action in enumerate(plan):
        messages.append({"role": "user", "content": observation})
        messages.append({"role": "assistant", "content": action})
        result = await env.step(action)
        observation = result.observation
        if result.done != (i == len(plan) - 1) or (result.done and not result.info.get("success")):
            raise RuntimeError(f"{name} level {seed}: replay of the plan {plan} failed at step {i + 1}")
    return messages


def frozenlake_demo(seed: int, params: Mapping[str, Any], system_prompt: str = "") -> list[Message]:
    """One solved FrozenLake episode as chat messages (see the module docstring). Not for a running event loop."""
    demo = asyncio.run(play_demo("frozenlake", params, seed, system_prompt))
    assert demo is not None  # no turn limit given
    return demo


def sokoban_demo(seed: int, params: Mapping[str, Any], system_prompt: str = "") -> list[Message]:
    """One solved Sokoban episode as chat messages (see the module docstring). Not for a running event loop."""
    demo = asyncio.run(play_demo("sokoban", params, seed, system_prompt))
    assert demo is not None
    return demo


async def _collect(name: str, params: Mapping[str, Any], count: int, system_prompt: str, max_turns: int,
                   seed_base: int) -> list[list[Message]]:
    demos: list[list[Message]] = []
    i = skipped = 0
    while len(demos) < count:
        if i >= 20 * count + 100:
            raise RuntimeError(f"{name}: only {len(demos)} of {count} levels are solvable within {max_turns} turns")
        demo = await play_demo(name, params, seed_base + i, system_prompt, max_turns)
        i += 1
        if demo is None:
            skipped += 1
        else:
            demos.append(demo)
    log.debug("%d %s demonstrations from %d levels (%d need more than %d turns)", count, name, i, skipped, max_turns)
    return demos


def collect_demonstrations(name: str, params: Mapping[str, Any], count: int, system_prompt: str = "",
                           max_turns: int = 8, seed_base: int = TRAIN_SEED_BASE) -> list[list[Message]]:
    """`count` demonstrations from levels seed_base, seed_base + 1, ... skipping those whose shortest plan needs
    more than `max_turns` turns (they cannot be solved within an episode)."""
    if count < 0:
        raise ValueError(f"count: expected >= 0, got {count}")
    return asyncio.run(_collect(name, params, count, system_prompt, max_turns, seed_base))
