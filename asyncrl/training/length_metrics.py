"""The response-length metrics of one training step, from the groups it trains (docs/algorithms.md §7). Pure.

Per step, over every sample of the step's batch (exact: the trainer's own groups, not a rollout-side estimate):
- `train/response_length_mean`, `train/response_length_max`: response tokens per sample (a multi-turn sample
  counts its turns and the observations between them; a segmented sample also its later segments' prompts);
- `train/truncated_fraction`: the share of samples that stopped on their token budget (finish reason "length");
- `train/overlong_masked_fraction` (only with `rollout.overlong: mask`): the share of samples that are truncated and
  have no trained-on token (the environment role masked them).
The finish reason travels with each sample from the generation server through the group's Parquet object.
"""

from __future__ import annotations

from asyncrl.rollout.overlong import is_truncated
from asyncrl.types import Group

__all__ = ["response_length_metrics"]


def response_length_metrics(groups: list[Group], overlong: str) -> dict[str, float]:
    """The step's length metrics (module docstring); `overlong` is `rollout.overlong`. ValueError without samples."""
    samples = [s for g in groups for s in g.samples]
    if not samples:
        raise ValueError("response_length_metrics: expected the step's groups with at least one sample, got none")
    n = len(samples)
    lengths = [len(s.token_ids) for s in samples]
    truncated = [is_truncated(s.finish_reason) for s in samples]
    out = {
        "train/response_length_mean": sum(lengths) / n,
        "train/response_length_max": float(max(lengths)),
        "train/truncated_fraction": sum(truncated) / n,
    }
    if overlong == "mask":
        masked = sum(t and not any(s.mask()) for s, t in zip(samples, truncated, strict=True))
        out["train/overlong_masked_fraction"] = masked / n
    return out
