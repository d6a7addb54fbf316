"""Bounded staleness on the trainer side (docs/algorithms.md §1). Pure, no I/O.

Training step k (producing version k+1 from version k) may use a sample only if its
`start_version >= k − α`. A group is judged by its oldest sample (`Group.start_version`): a group is
kept or dropped whole, so GRPO never normalises over a partial group.
"""

from __future__ import annotations

from asyncrl.types import Group


def split_stale(groups: list[Group], step: int, alpha: int) -> tuple[list[Group], list[Group]]:
    """Split `groups` into (kept, dropped) for training step `step` under async ratio `alpha`.

    Kept: `group.start_version >= step − alpha`. Order is preserved in both lists.
    """
    if alpha < 0:
        raise ValueError(f"alpha: expected >= 0, got {alpha}")
    bound = step - alpha
    kept = [g for g in groups if g.start_version >= bound]
    dropped = [g for g in groups if g.start_version < bound]
    return kept, dropped


def staleness_stats(groups: list[Group], step: int) -> dict[str, float]:
    """Staleness of a batch at training step `step`.

    - `staleness_mean`, `staleness_max`: mean / max over samples of `step − start_version`;
    - `token_staleness_mean`: mean over response tokens of `step − token_version`;
    - `stale_token_fraction`: share of response tokens produced by a version older than `step`;
    - `partial_rollout_fraction`: share of samples whose tokens come from more than one version
      (or from a version later than the start version: generation spanned a weight update).
    All 0 for an empty batch.
    """
    samples = [s for g in groups for s in g.samples]
    if not samples:
        return {
            "staleness_mean": 0.0,
            "staleness_max": 0.0,
            "token_staleness_mean": 0.0,
            "stale_token_fraction": 0.0,
            "partial_rollout_fraction": 0.0,
        }
    lags = [step - s.start_version for s in samples]
    token_lags = [step - v for s in samples for v in s.token_versions]
    partial = sum(1 for s in samples if s.token_versions and s.token_versions[-1] != s.start_version)
    n_tok = len(token_lags)
    return {
        "staleness_mean": sum(lags) / len(lags),
        "staleness_max": float(max(lags)),
        "token_staleness_mean": sum(token_lags) / n_tok if n_tok else 0.0,
        "stale_token_fraction": sum(1 for x in token_lags if x > 0) / n_tok if n_tok else 0.0,
        "partial_rollout_fraction": partial / len(samples),
    }


def staleness_histogram(groups: list[Group], step: int, alpha: int) -> dict[int, int]:
    """Samples per lag `step − start_version`, for every lag 0..alpha (zeros included) and any larger lag seen."""
    hist = dict.fromkeys(range(alpha + 1), 0)
    for g in groups:
        for s in g.samples:
            lag = step - s.start_version
            hist[lag] = hist.get(lag, 0) + 1
    return dict(sorted(hist.items()))
