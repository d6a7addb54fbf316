"""Label-aligned token log-probs and entropies of a causal LM, at every column or only at the trained-on ones.

Owns the last part of the trainer's forward: the LM head, the temperature, log-softmax over the vocabulary and the
gather of each label's log-prob. Column j of the result is the log-prob of `input_ids[:, j]` from the logits at
column j − 1 (`asyncrl.training.batch`); column 0 is 0.

Only at the trained-on columns (`trained_positions`: label columns j ≥ 1 where `response_mask` is 1): a step's loss,
its entropy term and every metric read the log-probs there alone, yet the LM head and the log-softmax over the whole
vocabulary (49,152 for SmolLM2) at every prompt and padding column cost as much as several transformer layers.
`logits_only_at` selects those hidden states inside the model's own forward, with a forward pre-hook on its output
embedding (the LM head receives [1, N, H] instead of [S, T, H]), so the model and its wrapper (the DeepSpeed engine,
its ZeRO hooks) run unchanged; `scatter_columns` puts the N values back at their [S, T] places (zeros elsewhere, with
the gradient). The values at those columns are the full computation's, up to the order of float additions.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor


def trained_positions(response_mask: Tensor) -> tuple[Tensor, Tensor]:
    """(rows, label columns) where `response_mask` > 0, column 0 excluded (never a response token), row-major."""
    rows, cols = torch.nonzero(response_mask[:, 1:] > 0, as_tuple=True)
    return rows, cols + 1


@contextlib.contextmanager
def logits_only_at(model: torch.nn.Module, rows: Tensor, hidden_cols: Tensor) -> Iterator[None]:
    """While open, the LM head of the HF `model` computes logits only for hidden states [rows, hidden_cols]: its
    output is [1, N, V] for the N pairs, in their order."""
    head = model.get_output_embeddings()
    if head is None:
        raise ValueError(f"{type(model).__name__}: no output embedding (LM head) to select positions for")

    def pick(_module: torch.nn.Module, args: tuple) -> tuple:
        hidden = args[0]
        return (hidden[rows, hidden_cols].unsqueeze(0), *args[1:])

    handle = head.register_forward_pre_hook(pick)
    try:
        yield
    finally:
        handle.remove()


def label_logprobs(logits: Tensor, labels: Tensor, temperature: float,
                   entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """Log-probs of `labels` [...] under `logits` [..., V] / `temperature` (float32), and the entropies of those
    distributions (with gradient only when `entropy_grad` and grad is enabled)."""
    logits = logits.float()
    logsm = torch.log_softmax(logits / temperature if temperature != 1.0 else logits, dim=-1)  # x / 1 == x: skip a pass
    logp = logsm.gather(-1, labels.unsqueeze(-1)).squeeze(-1)
    with torch.set_grad_enabled(entropy_grad and torch.is_grad_enabled()):
        src = logsm if entropy_grad else logsm.detach()
        entropy = -(src.exp() * src).sum(-1)
    return logp, entropy


def scatter_columns(values: Tensor, rows: Tensor, cols: Tensor, shape: tuple[int, int]) -> Tensor:
    """A [S, T] float tensor of zeros with `values` [N] at (rows, cols); the gradient flows to `values`."""
    return values.new_zeros(shape).index_put((rows, cols), values)


def trained_logprobs(run: Callable[[], Any], model: torch.nn.Module, input_ids: Tensor, response_mask: Tensor,
                     temperature: float, entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """Label-aligned log-probs and entropies [S, T] at the trained-on columns (0 elsewhere): `run()` is the forward of
    the HF `model` (or of its wrapper) on `input_ids`, returning an output with `.logits`; it runs with the LM head
    at those columns only (`logits_only_at`)."""
    rows, cols = trained_positions(response_mask)
    with logits_only_at(model, rows, cols - 1):
        logits = run().logits
    logp, entropy = label_logprobs(logits[0], input_ids[rows, cols], temperature, entropy_grad)
    shape = tuple(input_ids.shape)
    return scatter_columns(logp, rows, cols, shape), scatter_columns(entropy, rows, cols, shape)


def full_logprobs(logits: Tensor, input_ids: Tensor, temperature: float,
                  entropy_grad: bool) -> tuple[Tensor, Tensor]:
    """Every column's label-aligned log-prob and entropy [S, T] from the model's logits [S, T, V] (column 0: 0)."""
    logp, entropy = label_logprobs(logits[:, :-1], input_ids[:, 1:], temperature, entropy_grad)
    return F.pad(logp, (1, 0)), F.pad(entropy, (1, 0))
