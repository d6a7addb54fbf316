"""How one step's rows are cut into micro batches, by a sample count or packed under a token budget. Pure, no I/O.

A plan is a list of micro batches, each a list of row indices of the step's `TrainBatch`. A micro batch runs trimmed
to its longest row (`TrainBatch.rows`), so one forward/backward computes rows × longest row "padded tokens"; a row's
length is its prompt + response tokens.
- by count (`training.micro_batch_tokens` null): consecutive rows, `micro_batch_size` at a time (`TrainBatch.split`);
- by token budget (`pack_by_tokens`): the rows sorted by length, longest first (ties in row order), packed greedily:
  a row joins the current micro batch while (its rows + 1) × its longest row ≤ the budget and it has fewer than
  `micro_batch_size` rows, else it starts the next one. Sorting puts rows of similar length together, so little
  padding is computed; a row longer than the budget alone is a micro batch of its own (a row is never cut).
Data parallel (`rank_plans`, W ranks): by count, rank r takes its contiguous share of the rows
(`rank_rows`) cut by count; by token budget, the whole batch is packed once and the
micro batches are dealt round robin (rank r: micro batches r, r + W, ...), so the ranks' counts differ by at most one
and, the micro batches coming longest first, their work by at most one micro batch.

Invariants: every row is in exactly one micro batch of exactly one rank; the plan never changes the gradient (each
micro loss carries the whole batch's denominators, `asyncrl.training.losses`), only the order of float additions.
"""

from __future__ import annotations

from collections.abc import Sequence


def rank_rows(num_rows: int, rank: int, world_size: int) -> range:
    """Rank `rank`'s contiguous share of `num_rows` rows; the shares of ranks 0..W−1 tile the rows in order and
    differ by at most one row (the first `num_rows % W` ranks get one more)."""
    if world_size < 1 or not 0 <= rank < world_size:
        raise ValueError(f"rank: expected 0 <= rank < world_size, got rank {rank} of {world_size}")
    base, extra = divmod(num_rows, world_size)
    start = rank * base + min(rank, extra)
    return range(start, start + base + (1 if rank < extra else 0))


def pack_by_tokens(lengths: Sequence[int], token_budget: int, max_rows: int) -> list[list[int]]:
    """The rows `0..len(lengths)-1` packed longest first under `token_budget` padded tokens and `max_rows` rows per
    micro batch (see the module docstring)."""
    if token_budget < 1:
        raise ValueError(f"training.micro_batch_tokens: expected >= 1, got {token_budget}")
    if max_rows < 1:
        raise ValueError(f"training.micro_batch_size: expected >= 1, got {max_rows}")
    order = sorted(range(len(lengths)), key=lambda i: (-lengths[i], i))
    plan: list[list[int]] = []
    for i in order:
        if plan and len(plan[-1]) < max_rows and (len(plan[-1]) + 1) * lengths[plan[-1][0]] <= token_budget:
            plan[-1].append(i)
        else:
            plan.append([i])
    return plan


def by_count(rows: range, micro_batch_size: int) -> list[list[int]]:
    """`rows` cut into consecutive micro batches of `micro_batch_size` rows (the last one may be shorter)."""
    if micro_batch_size < 1:
        raise ValueError(f"micro_batch_size: expected >= 1, got {micro_batch_size}")
    return [list(rows[k : k + micro_batch_size]) for k in range(0, len(rows), micro_batch_size)]


def rank_plans(lengths: Sequence[int], world_size: int, micro_batch_size: int,
               micro_batch_tokens: int | None = None) -> list[list[list[int]]]:
    """Every rank's micro batches (row-index lists), rank by rank; a rank may get none (see the module docstring)."""
    if micro_batch_tokens is None:
        return [by_count(rank_rows(len(lengths), r, world_size), micro_batch_size) for r in range(world_size)]
    if world_size < 1:
        raise ValueError(f"world_size: expected >= 1, got {world_size}")
    plan = pack_by_tokens(lengths, micro_batch_tokens, micro_batch_size)
    return [plan[r::world_size] for r in range(world_size)]


def padded_tokens(lengths: Sequence[int], plan: list[list[int]]) -> int:
    """The tokens the micro batches of `plan` compute: Σ rows × longest row."""
    return sum(len(mb) * max(lengths[i] for i in mb) for mb in plan if mb)


def padding_fraction(lengths: Sequence[int], plans: list[list[list[int]]]) -> float:
    """The share of computed tokens that are padding, over every rank's plan: 1 − Σ lengths / Σ padded tokens."""
    computed = sum(padded_tokens(lengths, plan) for plan in plans)
    real = sum(lengths[i] for plan in plans for mb in plan for i in mb)
    return 1.0 - real / computed if computed else 0.0


def plan_metrics(lengths: Sequence[int], world_size: int, micro_batch_size: int,
                 micro_batch_tokens: int | None = None) -> dict[str, float]:
    """A step's plan in figures: `padding_fraction`, `micro_batches` and `computed_tokens` (Σ rows × longest row),
    over every rank's micro batches (the ranks' padding micro batches left out)."""
    plans = rank_plans(lengths, world_size, micro_batch_size, micro_batch_tokens)
    return {"padding_fraction": padding_fraction(lengths, plans), "micro_batches": float(sum(len(p) for p in plans)),
            "computed_tokens": float(sum(padded_tokens(lengths, p) for p in plans))}
