"""The reward's components, counted per scored sample from the details the reward role returns: `reward/correct` (the
share of samples whose details say "correct": true) and `reward/format` (the share whose details say "format": true,
the math verifier's explicit-answer component).

Owns `RewardComponents` (one environment writer's counts, published in its rollout metrics) and `combined_shares`
(the trainer's shares over all writers, from the summed counts). Pure: no I/O.

Invariants:
- a sample counts toward a share only when its details carry that component as a bool ("correct": every built-in
  verifier and a `task.reward` function; "format": the math verifier only); the counts are cumulative from the
  writer's (re)start;
- a share is published only when at least one sample counted toward it (no share of nothing), and it is the
  counted ratio exactly: `reward/correct` = `rollout/correct_samples` / `rollout/verified_samples`, `reward/format`
  = `rollout/format_samples` / `rollout/format_checked_samples`;
- the counts sum over writers; the shares do not (`combined_shares` recomputes them from the summed counts).
"""

from __future__ import annotations

from typing import Any

# (share, its numerator count, its denominator count, the details key)
SHARES = (
    ("reward/correct", "rollout/correct_samples", "rollout/verified_samples", "correct"),
    ("reward/format", "rollout/format_samples", "rollout/format_checked_samples", "format"),
)


class RewardComponents:
    """One writer's counts of the reward's components (module docstring)."""

    def __init__(self) -> None:
        self.counts: dict[str, int] = {}

    def add(self, details: dict[str, Any]) -> None:
        """Count one scored sample's `details`."""
        for _, yes, seen, key in SHARES:
            value = details.get(key)
            if isinstance(value, bool):
                self.counts[seen] = self.counts.get(seen, 0) + 1
                self.counts[yes] = self.counts.get(yes, 0) + int(value)

    def metrics(self) -> dict[str, float]:
        """The counts and the shares of the components seen so far (none before the first)."""
        out = {k: float(v) for k, v in self.counts.items()}
        out.update(combined_shares(out))
        return out


def combined_shares(summed: dict[str, float]) -> dict[str, float]:
    """The shares of the components from counts (one writer's, or summed over writers); a share whose denominator
    is absent or 0 is left out."""
    return {share: summed.get(yes, 0.0) / summed[seen] for share, yes, seen, _ in SHARES if summed.get(seen)}
