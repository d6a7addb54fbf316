"""Attention-guided credit in the trainer: capture the attention of the training forward, rescale advantages.

Owns the glue between `AttentionCreditConfig`, `attention_capture.AttentionCapture` (banded attention of the
chosen layers) and `attention_credit.batch_credit_scale` (γ_t of docs/algorithms.md §5).

Which weights compute the attention: the trainer's current weights (the proximal policy π_prox of this step),
inside the actor's own forward pass of each micro batch, not the behaviour policy that sampled the tokens.
- Cost: no extra forward pass at all; the capture only adds the banded statistics of a few layers. Keeping the
  behaviour weights instead would mean up to α+1 model copies in the trainer (or a pass on the generation
  servers plus shipping [tokens × band] maps per sample through S3) for every stale version.
- Meaning: γ_t decides how much of this update's credit goes to token t; it should reflect how the policy
  being updated structures its reasoning. π_prox is that policy; with bounded staleness (α steps) π_behav
  differs from it by at most α small updates, and the decoupled/IS losses already correct the probability
  mismatch; the preplan/anchor roles of tokens move much more slowly than their probabilities.
- For α = 0 the two coincide (π_prox = π_behav up to numerics).

Positions: the batch is label-aligned (column j is token j), and row t of an attention map is the query at
token t, so γ[:, j] scales the advantage of token j directly.
"""

from __future__ import annotations

from torch import Tensor, nn

from asyncrl.config.schema import AttentionCreditConfig
from asyncrl.training.attention_capture import AttentionCapture, choose_layers
from asyncrl.training.attention_credit import batch_credit_scale, scale_advantages
from asyncrl.training.batch import TrainBatch


class AttentionCredit:
    """γ_t for the micro batches of the actor, from `cfg` and a model of `num_layers` layers."""

    def __init__(self, cfg: AttentionCreditConfig, num_layers: int) -> None:
        self.cfg = cfg
        self.layers = choose_layers(num_layers, cfg.num_layers)
        self.band = max(cfg.window, cfg.fai_h_hi + 1)

    def capture(self, model: nn.Module) -> AttentionCapture:
        """A context manager to run the micro batch's forward in."""
        return AttentionCapture(model, self.layers, band=self.band, row_chunk=self.cfg.row_chunk)

    def scale(self, cap: AttentionCapture, mb: TrainBatch) -> tuple[Tensor, dict[str, float]]:
        """(advantages × γ, metrics) of micro batch `mb` from the attention captured during its forward."""
        c = self.cfg
        t_len = mb.input_ids.shape[1]
        spans, bands = cap.span_sums[..., :t_len], cap.bands[:, :, :t_len]
        response = mb.response_mask > 0
        gamma = batch_credit_scale(
            spans, bands, response, mb.prompt_lengths + mb.response_lengths,
            mode=c.scaling, window=c.window, h_lo=c.fai_h_lo, h_hi=c.fai_h_hi, head_fraction=c.head_fraction,
            top_fraction=c.top_fraction, gamma_amp=c.gamma_amp, alpha_c=c.alpha_c, k=c.intro_k,
        )
        adv = scale_advantages(mb.advantages, gamma, positive_only=c.positive_only)
        n = max(int(response.sum()), 1)
        metrics = {
            "credit_amplified_fraction": float(((gamma > 1) & response).sum()) / n,
            "credit_gamma_mean": float(gamma[response].sum()) / n,
        }
        return adv, metrics
