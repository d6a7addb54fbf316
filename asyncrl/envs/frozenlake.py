"""FrozenLake: walk from the top-left corner to the goal on an n×n lake without falling into a hole.

Levels come from a seed: holes are drawn with probability `hole_prob` per cell (never on the start or the goal) until
the goal is reachable. On a slippery lake a move goes where it was meant with probability 1/3 and to each side
(perpendicular) with 1/3 each, as in Gymnasium's FrozenLake; the slips are drawn from the episode's seed, so an
episode is a pure function of (seed, actions). Moving into the edge leaves the player in place.

Text: the observation is the grid (`P` player, `G` goal, `H` hole, `.` ice) with the legal actions and the steps
left; with `instructions=False` it is the grid alone (n lines of n characters joined by "\n", no trailing newline:
19 characters on a 4×4 lake), for small-context models that learn the rules from demonstrations. The action
parser takes the last of `left`/`down`/`right`/`up` (any case) inside `<answer>…</answer>` if the reply has one, else
in the whole reply. A reply with no action costs `format_penalty`, does not move, and counts as a step.

Rewards: 1 on reaching the goal (terminated, success), 0 on a hole (terminated, failure), the format penalty for an
unparseable reply; `max_steps` steps without an end truncate the episode (failure).
"""

from __future__ import annotations

import random
import re
from collections import deque
from typing import Any

from asyncrl.envs.base import EpisodeOver, StepResult, register

ACTIONS = {"left": (0, -1), "down": (1, 0), "right": (0, 1), "up": (-1, 0)}
_PERPENDICULAR = {"left": ("down", "up"), "right": ("down", "up"), "up": ("left", "right"), "down": ("left", "right")}
_ACTION_RE = re.compile(r"\b(left|down|right|up)\b", re.IGNORECASE)
_ANSWER_RE = re.compile(r"<answer>(.*?)</answer>", re.IGNORECASE | re.DOTALL)


def parse_action(text: str) -> str | None:
    """The last action word of the reply's `<answer>` part (or of the whole reply without one), lower case."""
    answers = _ANSWER_RE.findall(text)
    scope = answers[-1] if answers else text
    found = _ACTION_RE.findall(scope)
    return found[-1].lower() if found else None


def generate_level(seed: int, size: int = 4, hole_prob: float = 0.2) -> list[str]:
    """Rows of the lake (`S` start, `G` goal, `H` hole, `.` ice); the goal is always reachable from the start."""
    rng = random.Random(seed)
    while True:
        grid = [["H" if rng.random() < hole_prob else "." for _ in range(size)] for _ in range(size)]
        grid[0][0], grid[size - 1][size - 1] = "S", "G"
        rows = ["".join(r) for r in grid]
        if _reachable(rows):
            return rows


def _reachable(rows: list[str]) -> bool:
    n = len(rows)
    seen, todo = {(0, 0)}, deque([(0, 0)])
    while todo:
        r, c = todo.popleft()
        if rows[r][c] == "G":
            return True
        for dr, dc in ACTIONS.values():
            nr, nc = r + dr, c + dc
            if 0 <= nr < n and 0 <= nc < n and (nr, nc) not in seen and rows[nr][nc] != "H":
                seen.add((nr, nc))
                todo.append((nr, nc))
    return False


def move(rows: list[str], pos: tuple[int, int], action: str) -> tuple[int, int]:
    """The cell reached from `pos` by `action` (the same cell at the edge)."""
    dr, dc = ACTIONS[action]
    r, c = pos[0] + dr, pos[1] + dc
    return (r, c) if 0 <= r < len(rows) and 0 <= c < len(rows) else pos


@register("frozenlake")
class FrozenLake:
    """A FrozenLake episode per `reset(seed)`; see the module docstring."""

    def __init__(self, size: int = 4, hole_prob: float = 0.2, slippery: bool = False, max_steps: int = 20,
                 format_penalty: float = -0.1, instructions: bool = True) -> None:
        if not 2 <= size <= 16:
            raise ValueError(f"size: expected 2..16, got {size}")
        if not 0 <= hole_prob < 1:
            raise ValueError(f"hole_prob: expected [0, 1), got {hole_prob}")
        if max_steps < 1:
            raise ValueError(f"max_steps: expected >= 1, got {max_steps}")
        self.size, self.hole_prob, self.slippery = size, hole_prob, slippery
        self.max_steps, self.format_penalty = max_steps, format_penalty
        self.instructions = instructions
        self.rows: list[str] = []
        self.pos = (0, 0)
        self.steps = 0
        self.done = True
        self._slip = random.Random(0)

    def render(self) -> str:
        lines = []
        for r, row in enumerate(self.rows):
            cells = ["P" if (r, c) == self.pos else ("." if ch == "S" else ch) for c, ch in enumerate(row)]
            lines.append("".join(cells))
        return "\n".join(lines)

    def _observation(self) -> str:
        if not self.instructions:
            return self.render()
        return (f"{self.render()}\nYou are P. Reach G without stepping on H. Reply with one of left, down, right, up "
                f"inside <answer></answer>. Steps left: {self.max_steps - self.steps}.")

    async def reset(self, seed: int) -> tuple[str, dict[str, Any]]:
        self.rows = generate_level(seed, self.size, self.hole_prob)
        self._slip = random.Random(seed * 1_000_003 + 17)
        self.pos, self.steps, self.done = (0, 0), 0, False
        return self._observation(), {"level": list(self.rows)}

    async def step(self, action_text: str) -> StepResult:
        if self.done:
            raise EpisodeOver("frozenlake: step after the episode ended (call reset first)")
        self.steps += 1
        action = parse_action(action_text)
        info: dict[str, Any] = {"action": action, "invalid_action": action is None}
        reward = 0.0
        if action is None:
            reward = self.format_penalty
        else:
            taken = action
            if self.slippery:
                taken = self._slip.choice([action, *_PERPENDICULAR[action]])
            info["moved"] = taken
            self.pos = move(self.rows, self.pos, taken)
        cell = self.rows[self.pos[0]][self.pos[1]]
        terminated = cell in ("G", "H")
        if cell == "G":
            reward = 1.0
        truncated = not terminated and self.steps >= self.max_steps
        self.done = terminated or truncated
        if self.done:
            info["success"] = cell == "G"
        return StepResult(self._observation(), reward, terminated, truncated, info)
