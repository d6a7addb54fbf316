"""Critics: value models and their optimizers (plain torch, CPU or one device, no DeepSpeed).

Owns `ValueModel` (a causal-LM backbone plus a scalar value head) and `CriticEnsemble` (M ≥ 1 value
models started from the same folder, each with its own AdamW): values of a `TrainBatch`, one training
step on given returns with AsyPPO's disjoint data split, and flat tensor state for checkpoints.

Why plain torch: AsyPPO's critics are small by design (a small LM may critique a large actor), so they
are kept whole on the trainer process; no ZeRO partitioning, no DeepSpeed engine.

Invariants:
- values are label-aligned like the policy's log-probs (see `asyncrl.training.batch`):
  `values[:, j] = head(hidden[:, j−1])` for j ≥ 1, the value of the state from which token j is
  produced; column 0 is 0. A value at column j depends only on tokens < j.
- the value head is initialised to zero weight and zero bias (our choice): a fresh critic predicts 0
  everywhere, and its first step only moves the head (the backbone's gradient is 0 through a zero head).
- the models stay in eval mode (no dropout) and run without a KV cache.
- one `train_step` = at most one optimizer step per critic; critic m's loss is the token-mean of
  `(V − R)²` over the trained-on tokens of the samples it owns, with exact gradient accumulation over
  micro batches (each micro loss is divided by the critic's token count in the whole batch). A critic
  that owns no trained-on token of the batch takes no step (its AdamW state is left untouched).
"""

from __future__ import annotations

import logging
import math
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from asyncrl.training.activation_checkpointing import enable_gradient_checkpointing
from asyncrl.training.batch import TrainBatch

log = logging.getLogger(__name__)

MOMENTS = ("exp_avg", "exp_avg_sq")


class ValueModel(nn.Module):
    """A Hugging Face causal-LM backbone (no LM head) with a zero-initialised `value_head = Linear(hidden, 1)`."""

    def __init__(self, model_path: str | Path) -> None:
        super().__init__()
        from transformers import AutoModel

        loaded, info = AutoModel.from_pretrained(str(model_path), dtype=torch.float32, output_loading_info=True)
        if info.get("missing_keys"):
            missing = sorted(info["missing_keys"])[:5]
            raise ValueError(f"model_path {model_path}: backbone weights missing from the checkpoint: {missing}")
        loaded.config.use_cache = False
        self.backbone = loaded
        hidden = int(loaded.config.hidden_size)
        self.value_head = nn.Linear(hidden, 1)
        with torch.no_grad():
            self.value_head.weight.zero_()
            self.value_head.bias.zero_()
        self.eval()

    def forward(self, input_ids: Tensor, attention_mask: Tensor) -> Tensor:
        """Label-aligned values [S, T]: column j ≥ 1 is `head(hidden[:, j−1])`, column 0 is 0."""
        out = self.backbone(input_ids=input_ids, attention_mask=attention_mask, use_cache=False)
        values = self.value_head(out.last_hidden_state[:, :-1].float()).squeeze(-1)
        return F.pad(values, (1, 0))


def explained_variance(returns: Tensor, values: Tensor, mask: Tensor) -> float:
    """`1 − Var(R − V)/Var(R)` over the positions where mask > 0 (population variances); 0 when Var(R) = 0
    or no position is valid."""
    sel = mask > 0
    if not bool(sel.any()):
        return 0.0
    r, v = returns[sel].double(), values[sel].double()
    var_r = r.var(correction=0)
    if float(var_r) == 0.0:
        return 0.0
    return float(1.0 - (r - v).var(correction=0) / var_r)


class CriticEnsemble:
    """M value models loaded from `model_path` (same initial weights), each with its own AdamW and clip."""

    def __init__(
        self,
        model_path: str | Path,
        num_critics: int = 1,
        lr: float = 1e-4,
        weight_decay: float = 0.0,
        grad_clip: float = 1.0,
        micro_batch_size: int = 64,
        seed: int = 0,
        gradient_checkpointing: bool = False,
    ) -> None:
        """`grad_clip` ≤ 0 disables clipping (the norm is still reported). `seed` seeds a forked RNG for
        the construction (nothing in it is random today: loaded weights, zero head), leaving the global
        RNG untouched. `gradient_checkpointing`: recompute the backbones' layers in the backward pass
        (`asyncrl.training.activation_checkpointing`; values and gradients unchanged)."""
        if isinstance(num_critics, bool) or not isinstance(num_critics, int) or num_critics < 1:
            raise ValueError(f"num_critics: expected an int >= 1, got {num_critics!r}")
        if micro_batch_size < 1:
            raise ValueError(f"micro_batch_size: expected >= 1, got {micro_batch_size}")
        self.num_critics = num_critics
        self.grad_clip = float(grad_clip)
        self.micro_batch_size = int(micro_batch_size)
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.models = [ValueModel(model_path) for _ in range(num_critics)]
        if gradient_checkpointing:
            for model in self.models:
                enable_gradient_checkpointing(model.backbone)
        self.optimizers = [
            torch.optim.AdamW(m.parameters(), lr=lr, weight_decay=weight_decay) for m in self.models
        ]
        log.info("CriticEnsemble ready: %d critic(s) from %s", num_critics, model_path)

    # ---- values --------------------------------------------------------------------------------

    @torch.no_grad()
    def values(self, batch: TrainBatch, micro_batch_size: int | None = None) -> Tensor:
        """Every critic's values [M, S, T] under the current weights; 0 where `batch.response_mask` is 0."""
        s_len, t_len = batch.input_ids.shape
        out = torch.zeros((self.num_critics, s_len, t_len), dtype=torch.float32)
        row = 0
        for mb in batch.split(micro_batch_size or self.micro_batch_size):
            rows, cols = slice(row, row + mb.num_samples), mb.input_ids.shape[1]
            for m, model in enumerate(self.models):
                out[m, rows, :cols] = model(mb.input_ids, mb.attention_mask).float()
            row += mb.num_samples
        return out * (batch.response_mask > 0)

    # ---- training ------------------------------------------------------------------------------

    def _check_train_inputs(self, batch: TrainBatch, returns: Tensor, owner: Tensor | None) -> Tensor:
        """Validate; return owner as [S] long (all −1 = every critic owns every sample when owner is None)."""
        shape = tuple(batch.input_ids.shape)
        if not isinstance(returns, Tensor) or tuple(returns.shape) != shape:
            got = tuple(returns.shape) if isinstance(returns, Tensor) else type(returns).__name__
            raise ValueError(f"returns: expected shape {shape} (the batch's [S, T]), got {got}")
        if owner is None:
            return torch.full((shape[0],), -1, dtype=torch.long)
        if not isinstance(owner, Tensor) or tuple(owner.shape) != (shape[0],):
            got = tuple(owner.shape) if isinstance(owner, Tensor) else type(owner).__name__
            raise ValueError(f"owner: expected shape ({shape[0]},) (one critic per sample), got {got}")
        if owner.is_floating_point() or owner.dtype == torch.bool:
            raise ValueError(f"owner: expected an integer tensor, got {owner.dtype}")
        if bool(((owner < 0) | (owner >= self.num_critics)).any()):
            raise ValueError(f"owner: expected critic indices in [0, {self.num_critics}), got {owner.tolist()}")
        return owner.long()

    def _accumulate(
        self, batch: TrainBatch, returns: Tensor, owner: Tensor, micro_batch_size: int
    ) -> tuple[Tensor, list[float], list[float]]:
        """Backward every critic's loss into `.grad` (no step). Returns the pre-update values [M, S, T]
        (every critic on every sample), each critic's summed squared error and trained-on token count.

        Critic m runs with grad only on the rows it trains on (owns, and it owns ≥ 1 trained-on token of
        the batch) and without grad on the others, so the M critics together cost M forwards of the batch.
        """
        s_len, t_len = batch.input_ids.shape
        weight = batch.response_mask.float()
        counts = [float((weight * self._owned(owner, m).unsqueeze(1)).sum()) for m in range(self.num_critics)]
        pre = torch.zeros((self.num_critics, s_len, t_len), dtype=torch.float32)
        sq_err = [0.0] * self.num_critics
        row = 0
        for mb in batch.split(micro_batch_size):
            rows, cols = slice(row, row + mb.num_samples), mb.input_ids.shape[1]
            mb_returns, mb_weight = returns[rows, :cols].float(), mb.response_mask.float()
            for m, model in enumerate(self.models):
                trains = self._owned(owner[rows], m) & (counts[m] > 0)
                frozen = (~trains).nonzero().squeeze(1)
                if frozen.numel():
                    with torch.no_grad():
                        pre[m, row + frozen, :cols] = model(mb.input_ids[frozen], mb.attention_mask[frozen]).float()
                mine = trains.nonzero().squeeze(1)
                if not mine.numel():
                    continue
                v = model(mb.input_ids[mine], mb.attention_mask[mine])
                w = mb_weight[mine]
                diff = torch.where(w > 0, v - mb_returns[mine], torch.zeros_like(v))
                sq = (diff.square() * w).sum()
                (sq / counts[m]).backward()
                sq_err[m] += float(sq.detach())
                pre[m, row + mine, :cols] = v.detach()
            row += mb.num_samples
        return pre, sq_err, counts

    @staticmethod
    def _owned(owner: Tensor, m: int) -> Tensor:
        return (owner == m) | (owner < 0)

    def train_step(
        self, batch: TrainBatch, returns: Tensor, owner: Tensor | None = None, micro_batch_size: int | None = None
    ) -> dict[str, float]:
        """One optimizer step per critic towards `returns` [S, T] on the samples it owns.

        `owner` [S] long gives the critic of each sample (`asyppo.critic_owner`); None = every critic trains
        on every sample. Metrics: `critic/loss` (mean pre-update MSE over the critics that trained),
        `critic/loss_<m>` (M > 1, critics that trained), `critic/explained_variance` (pre-update mean
        value V̄ over all critics, every trained-on token of the batch), `critic/grad_norm` (mean over
        the critics that trained, before clipping), `critic/value_mean` (mean V̄ on those tokens).
        """
        owner_l = self._check_train_inputs(batch, returns, owner)
        for opt in self.optimizers:
            opt.zero_grad(set_to_none=True)
        pre, sq_err, counts = self._accumulate(batch, returns, owner_l, micro_batch_size or self.micro_batch_size)
        metrics: dict[str, float] = {}
        losses, norms = [], []
        for m, (model, opt) in enumerate(zip(self.models, self.optimizers, strict=True)):
            if counts[m] == 0:
                continue
            params = [p for p in model.parameters() if p.grad is not None]
            clip = self.grad_clip if self.grad_clip > 0 else math.inf
            norms.append(float(torch.nn.utils.clip_grad_norm_(params, clip)))
            opt.step()
            opt.zero_grad(set_to_none=True)
            losses.append(sq_err[m] / counts[m])
            if self.num_critics > 1:
                metrics[f"critic/loss_{m}"] = losses[-1]
        mean_v = pre.mean(dim=0)
        mask = batch.response_mask > 0
        metrics["critic/loss"] = sum(losses) / len(losses) if losses else 0.0
        metrics["critic/explained_variance"] = explained_variance(returns.float(), mean_v, batch.response_mask)
        metrics["critic/grad_norm"] = sum(norms) / len(norms) if norms else 0.0
        metrics["critic/value_mean"] = float(mean_v[mask].mean()) if bool(mask.any()) else 0.0
        return metrics

    # ---- state ---------------------------------------------------------------------------------

    def state(self) -> dict[str, Tensor]:
        """Every critic's parameters as contiguous CPU clones, named `critic{m}.<param name>`."""
        return {
            f"critic{m}.{n}": p.detach().cpu().clone().contiguous()
            for m, model in enumerate(self.models)
            for n, p in model.named_parameters()
        }

    def optimizer_state(self) -> dict[str, Tensor]:
        """AdamW state as flat tensors: `critic{m}.step` (0-dim float) and, once critic m has stepped,
        `critic{m}.exp_avg.<param>` and `critic{m}.exp_avg_sq.<param>`."""
        out: dict[str, Tensor] = {}
        for m, (model, opt) in enumerate(zip(self.models, self.optimizers, strict=True)):
            named = [(n, p) for n, p in model.named_parameters() if p in opt.state and opt.state[p]]
            step = float(opt.state[named[0][1]]["step"]) if named else 0.0
            out[f"critic{m}.step"] = torch.tensor(step)
            for n, p in named:
                for key in MOMENTS:
                    out[f"critic{m}.{key}.{n}"] = opt.state[p][key].detach().cpu().clone().contiguous()
        return out

    def load_state(self, state: dict[str, Tensor], optimizer_state: dict[str, Tensor] | None = None) -> None:
        """Restore `state()` (and `optimizer_state()`) output exactly; errors name the offending tensor."""
        expected = {f"critic{m}.{n}": p for m, model in enumerate(self.models) for n, p in model.named_parameters()}
        missing, extra = sorted(set(expected) - set(state)), sorted(set(state) - set(expected))
        if missing or extra:
            raise ValueError(f"critic state: missing tensors {missing[:5]}, unexpected {extra[:5]}")
        for name, p in expected.items():
            if tuple(state[name].shape) != tuple(p.shape):
                raise ValueError(f"critic state[{name!r}]: expected shape {tuple(p.shape)}, got {tuple(state[name].shape)}")
        if optimizer_state is not None:
            self._check_optimizer_state(optimizer_state)
        with torch.no_grad():
            for name, p in expected.items():
                p.copy_(state[name])
        if optimizer_state is not None:
            self._load_optimizer(optimizer_state)

    def _check_optimizer_state(self, state: dict[str, Tensor]) -> None:
        known = set()
        for m, model in enumerate(self.models):
            key = f"critic{m}.step"
            if key not in state:
                raise ValueError(f"critic optimizer state: missing {key!r}")
            known.add(key)
            if float(state[key]) == 0:
                continue
            for n, p in model.named_parameters():
                for moment in MOMENTS:
                    name = f"critic{m}.{moment}.{n}"
                    if name not in state:
                        raise ValueError(f"critic optimizer state: missing {name!r}")
                    if tuple(state[name].shape) != tuple(p.shape):
                        raise ValueError(
                            f"critic optimizer state[{name!r}]: expected shape {tuple(p.shape)}, "
                            f"got {tuple(state[name].shape)}"
                        )
                    known.add(name)
        extra = sorted(set(state) - known)
        if extra:
            raise ValueError(f"critic optimizer state: unexpected tensors {extra[:5]}")

    def _load_optimizer(self, state: dict[str, Tensor]) -> None:
        """Replace each AdamW's per-parameter state; step 0 = a fresh optimizer (empty state)."""
        for m, (model, opt) in enumerate(zip(self.models, self.optimizers, strict=True)):
            opt.state.clear()
            step = float(state[f"critic{m}.step"])
            if step == 0:
                continue
            for n, p in model.named_parameters():
                opt.state[p] = {
                    "step": torch.tensor(step, dtype=torch.float32),
                    **{k: state[f"critic{m}.{k}.{n}"].to(p.device, p.dtype).clone() for k in MOMENTS},
                }
