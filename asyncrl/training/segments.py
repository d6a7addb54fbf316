"""A sample's trained rows and where its rewards land on them. Pure, no I/O.

Owns `split_segments` (one `Sample` per segment of a sample whose context restarted mid-episode, `Sample.segment_offsets`)
and `reward_positions` (where a row's turn rewards sit: the input of GAE's token rewards, `TrainBatch.token_rewards`).

A segmented sample is one episode with one reward (one GRPO advantage, computed on the episode), trained as several
sequences: segment 0 is `prompt_token_ids + token_ids[:o_1]`; segment k >= 1 is `token_ids[o_k:o_{k+1}]`, its leading
loss-mask 0 run as its prompt and the rest as its response. Each row keeps the sample's `group_id`, `sample_index`,
`reward`, `finish_reason` and `start_version`, and its slices of `logprobs`, `token_versions` and `loss_mask`.

Reward rule (what `reward_positions` gives on the rows equals what it gives on the unsplit sample, moved to the rows):
each turn's reward lands exactly once, on the last trained token of the turn, which may lie in a later segment than
the turn's start (a turn that runs across a restart). Each row's `turn_offsets` are the turns that start in it
(shifted to its response) plus, when its first trained token is not a turn start, a continuation piece there; a
piece's `turn_rewards` entry is its turn's reward if the turn's last trained token is in that piece, else 0.0. A
sample without turns gets one piece per row at its first trained token: the reward on the last trained token of the
LAST segment, 0.0 on the earlier ones. So a row's `turn_rewards` need not sum to its `reward` (the episode's).

Consequences for the trainer (every row is its own sequence): seq-mean-token-mean and the sequence-level corrections
count a segmented sample once per segment; GAE ends each row at its last trained token, so with `advantage: gae` an
earlier segment gets no outcome reward and no value bootstrapped from the next segment.

Invariants: a sample without `segment_offsets` comes back as `[sample]` itself; every row is valid
(`Sample.validate`), has `segment_offsets` None, a non-empty response that starts on a trained token (rows of a
segmented sample), and non-decreasing versions >= `start_version`; the rows' responses and prompts tile the sample's
prompt and response in order.
"""

from __future__ import annotations

from dataclasses import replace

from asyncrl.types import Sample

__all__ = ["reward_positions", "split_segments"]


def _last_trained(mask: list[int], start: int, end: int) -> int | None:
    """The last position in [start, end) where `mask` is 1, or None."""
    return next((j for j in range(end - 1, start - 1, -1) if mask[j]), None)


def reward_positions(sample: Sample) -> list[tuple[int, float]]:
    """(response position, reward) pairs: each turn's reward on its last trained-on token; a single-turn sample's
    reward on its last trained-on token. Positions index the response; a sample with no such token gives []."""
    mask = sample.mask()
    offsets = sample.turn_offsets or [0]
    rewards = sample.turn_rewards or [sample.reward]
    out = []
    for k, (start, reward) in enumerate(zip(offsets, rewards, strict=True)):
        end = offsets[k + 1] if k + 1 < len(offsets) else len(mask)
        last = _last_trained(mask, start, end)
        if last is not None:
            out.append((last, float(reward)))
    return out


def split_segments(sample: Sample) -> list[Sample]:
    """The sample's rows, in order: `[sample]` itself without `segment_offsets`, else one per segment (module
    docstring). The sample must be valid (`Sample.validate`)."""
    if sample.segment_offsets is None:
        return [sample]
    n = len(sample.token_ids)
    starts = [0, *sample.segment_offsets]
    stops = [*sample.segment_offsets, n]
    landing = dict(reward_positions(sample))
    return [_segment(sample, k, a, b, landing) for k, (a, b) in enumerate(zip(starts, stops, strict=True))]


def _segment(sample: Sample, k: int, a: int, b: int, landing: dict[int, float]) -> Sample:
    """Segment k, `token_ids[a:b]` of `sample`, as a row; `landing` maps each reward position of the sample to its
    reward."""
    mask = sample.mask()
    head = a if k == 0 else next(j for j in range(a, b) if mask[j])  # the row's first response position
    pieces = sorted({head} | {t for t in sample.turn_offsets or [] if head <= t < b})
    ends = [*pieces[1:], b]
    rewards = []
    for p, e in zip(pieces, ends, strict=True):
        last = _last_trained(mask, p, e)
        rewards.append(landing.get(last, 0.0) if last is not None else 0.0)
    return replace(
        sample,
        prompt_token_ids=list(sample.prompt_token_ids) if k == 0 else sample.token_ids[a:head],
        token_ids=sample.token_ids[head:b],
        logprobs=sample.logprobs[head:b],
        token_versions=sample.token_versions[head:b],
        loss_mask=mask[head:b],
        turn_offsets=[p - head for p in pieces],
        turn_rewards=rewards,
        segment_offsets=None,
    )
