"""Which committed checkpoint a run registers: the best by held-out accuracy when the run has evaluation points
for its checkpoints, else the last one. Pure: the points' figures come from `asyncrl.storage.eval_points.eval_figures`.

The rule (`choose_checkpoint`):
- `best_eval`: among the committed versions that have an evaluation point (`eval/<version>.json`, written by the
  periodic evaluation, `eval.every_steps` > 0) with a finite `eval/accuracy`, the highest accuracy; a tie goes
  to the later version (more training for the same figure);
- `last`: no committed version has such a point (no periodic evaluation, or none landed on a checkpoint): the
  highest committed version.
A version without a point is never preferred to one with a point: its accuracy is unknown.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

ACCURACY = "eval/accuracy"


@dataclass(frozen=True)
class Choice:
    """The checkpoint to register and why: `reason` is "best_eval" (with its `eval_accuracy`) or "last"."""

    version: int
    reason: str
    eval_accuracy: float | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"checkpoint_version": self.version, "reason": self.reason, "eval_accuracy": self.eval_accuracy}


def choose_checkpoint(committed: list[int], figures: dict[int, dict[str, float]]) -> Choice | None:
    """The version to register among `committed` (None when there is none), by the rule in the module docstring;
    `figures`: each evaluated version's `eval/*` figures."""
    if not committed:
        return None
    scored = [(figures[v][ACCURACY], v) for v in committed
              if isinstance(figures.get(v, {}).get(ACCURACY), int | float) and math.isfinite(figures[v][ACCURACY])]
    if scored:
        accuracy, version = max(scored)  # equal accuracy: the higher version wins
        return Choice(version, "best_eval", float(accuracy))
    return Choice(max(committed), "last")
