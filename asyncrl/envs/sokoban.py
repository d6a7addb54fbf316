"""Sokoban: push every box onto a target in a small walled room.

Levels come from a seed by reverse play, so every level is solvable: targets are drawn on the floor with a box on
each and the player beside them, then the player walks backwards `scramble_steps` times, pulling a box whenever one
is right behind the move (the inverse of a push). A level whose boxes all end on targets is drawn again.

Rules (forward): a move into a wall does nothing; a move into a box pushes it one cell when the cell beyond is floor
or a target, and does nothing otherwise; boxes are never pulled. Text uses standard notation: `#` wall, `_` floor,
`.` target, `$` box, `*` box on a target, `@` player, `+` player on a target; the action parser is FrozenLake's
(`left`/`down`/`right`/`up`, last one, `<answer>` preferred). Rewards: `box_reward` each time a box is pushed onto a
target (and minus it when pushed off), 1 when every box is on a target (terminated, success), the format penalty
for an unparseable reply (no move, the step counts); `max_steps` steps truncate the episode.
"""

from __future__ import annotations

import random
from typing import Any

from asyncrl.envs.base import EpisodeOver, StepResult, register
from asyncrl.envs.frozenlake import ACTIONS, parse_action

Cell = tuple[int, int]


def _add(a: Cell, d: Cell) -> Cell:
    return a[0] + d[0], a[1] + d[1]


class Level:
    """Walls, targets, boxes and the player of one Sokoban state (mutable: `push` changes it)."""

    def __init__(self, walls: set[Cell], targets: set[Cell], boxes: set[Cell], player: Cell, size: int) -> None:
        self.walls, self.targets, self.boxes, self.player, self.size = walls, targets, set(boxes), player, size

    def push(self, action: str) -> int:
        """Apply a forward move; return the change in boxes on targets (−1, 0 or +1)."""
        d = ACTIONS[action]
        to = _add(self.player, d)
        if to in self.walls:
            return 0
        if to in self.boxes:
            beyond = _add(to, d)
            if beyond in self.walls or beyond in self.boxes:
                return 0
            self.boxes.remove(to)
            self.boxes.add(beyond)
            self.player = to
            return int(beyond in self.targets) - int(to in self.targets)
        self.player = to
        return 0

    @property
    def solved(self) -> bool:
        return self.boxes <= self.targets

    def render(self) -> str:
        lines = []
        for r in range(self.size):
            row = []
            for c in range(self.size):
                p = (r, c)
                if p in self.walls:
                    row.append("#")
                elif p == self.player:
                    row.append("+" if p in self.targets else "@")
                elif p in self.boxes:
                    row.append("*" if p in self.targets else "$")
                else:
                    row.append("." if p in self.targets else "_")
            lines.append("".join(row))
        return "\n".join(lines)

    @classmethod
    def parse(cls, text: str) -> Level:
        """A level from its rendering (for tests and hand-made levels)."""
        rows = text.strip("\n").splitlines()
        walls, targets, boxes, player = set(), set(), set(), None
        for r, row in enumerate(rows):
            for c, ch in enumerate(row):
                p = (r, c)
                if ch == "#":
                    walls.add(p)
                if ch in ".*+":
                    targets.add(p)
                if ch in "$*":
                    boxes.add(p)
                if ch in "@+":
                    player = p
        if player is None:
            raise ValueError("sokoban level: no player (@ or +)")
        return cls(walls, targets, boxes, player, len(rows))


def generate_level(seed: int, size: int = 6, num_boxes: int = 1, scramble_steps: int = 40) -> Level:
    """A solvable level (see the module docstring) with a wall border and `num_boxes` boxes."""
    rng = random.Random(seed)
    walls = {(r, c) for r in range(size) for c in range(size) if r in (0, size - 1) or c in (0, size - 1)}
    floor = sorted((r, c) for r in range(1, size - 1) for c in range(1, size - 1))
    while True:
        cells = rng.sample(floor, num_boxes + 1)
        targets, player = set(cells[:num_boxes]), cells[num_boxes]
        boxes = set(targets)
        for _ in range(scramble_steps):
            d = ACTIONS[rng.choice(sorted(ACTIONS))]
            back = (player[0] - d[0], player[1] - d[1])
            if back in walls or back in boxes:
                continue
            front = _add(player, d)
            if front in boxes and rng.random() < 0.8:  # pull the box in front along
                boxes.remove(front)
                boxes.add(player)
            player = back
        if not boxes <= targets:
            return Level(walls, targets, boxes, player, size)


@register("sokoban")
class Sokoban:
    """A Sokoban episode per `reset(seed)`; see the module docstring."""

    def __init__(self, size: int = 6, num_boxes: int = 1, scramble_steps: int = 40, max_steps: int = 30,
                 box_reward: float = 0.0, format_penalty: float = -0.1, instructions: bool = True) -> None:
        if not 4 <= size <= 12:
            raise ValueError(f"size: expected 4..12, got {size}")
        if not 1 <= num_boxes <= 2:
            raise ValueError(f"num_boxes: expected 1 or 2, got {num_boxes}")
        if max_steps < 1:
            raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
        self.size, self.num_boxes, self.scramble_steps = size, num_boxes, scramble_steps
        self.max_steps, self.box_reward, self.format_penalty = max_steps, box_reward, format_penalty
        self.instructions = instructions  # False: the observation is the grid alone (small models)
        self.level: Level | None = None
        self.steps = 0
        self.done = True

    def _observation(self) -> str:
        assert self.level is not None
        if not self.instructions:
            return self.level.render()
        return (f"{self.level.render()}\nYou are @. Push every $ onto a . target (# is a wall). Reply with one of "
                f"left, down, right, up inside <answer></answer>. Steps left: {self.max_steps - self.steps}.")

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.level = generate_level(seed, self.size, self.num_boxes, self.scramble_steps)
        self.steps, self.done = 0, False
        return self._observation(), {"level": self.level.render()}

    async def step(self, action_text: str) -> StepResult:
        if self.done or self.level is None:
            raise EpisodeOver("sokoban: step after the episode ended (call reset first)")
        self.steps += 1
        action = parse_action(action_text)
        info: dict[str, Any] = {"action": action, "invalid_action": action is None}
        reward = self.format_penalty if action is None else self.box_reward * self.level.push(action)
        terminated = self.level.solved
        if terminated:
            reward += 1.0
        truncated = not terminated and self.steps >= self.max_steps
        self.done = terminated or truncated
        info["boxes_on_target"] = len(self.level.boxes & self.level.targets)
        if self.done:
            info["success"] = terminated
        return StepResult(self._observation(), reward, terminated, truncated, info)
