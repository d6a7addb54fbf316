"""The DeepSpeed policy trainer: one engine around a Hugging Face causal LM, trained on `TrainBatch`es.

Owns: `deepspeed.initialize` with a torch AdamW on the default process group (a lone gloo process unless a
launcher such as torchrun set the env; see `asyncrl.training.process_group` for the device and backend), token
log-probs at the sampling temperature, the optimizer steps of a step (one per batch, or mini-batch updates:
`asyncrl.training.mini_batches`) with exact gradient accumulation over micro batches and data-parallel ranks,
full HF-named weights for the broadcast, and model/optimizer state for checkpoints (safetensors-ready).

Data parallel (W ranks): `train_step` is collective. Every rank passes the SAME whole batch; rank r trains on
its share of each mini-batch (`asyncrl.training.distributed.shard_micro_batches`: equal micro-batch counts,
all-masked padding) and scales each micro loss by W: the micro losses carry the mini-batch's denominators
and DeepSpeed averages gradients over the ranks, (1/W)·Σ_r W·g_r = Σ_r g_r, as with W = 1. The accumulation
boundary is each rank's last micro batch of a mini-batch. Every rank's metric parts are
gathered (JSON over the control channel) and merged: every rank returns the same metrics. `named_weights`,
`model_state`, `optimizer_state` and `load_state` are collective under ZeRO-3 (`optimizer_state` under ZeRO
1–2 too): every rank calls them at the same points. `snapshot` is the training role's one call for what leaves
the ranks after a step (weights to push, optimizer state to checkpoint): every rank makes it, rank 0 gets it.

Invariants:
- one `train_step` = `training.mini_batches` × `training.epochs` optimizer steps (1 by default), whose
  proximal log-probs are all the policy's at the step's start, exact in eval mode (no dropout). With one step
  the weights have not moved, so `prox = logp.detach()` of the same forward is exact and saves a forward; with
  several, one no-grad forward at the step's start computes them. `logprobs()` gives the same numbers.
- log-probs are label-aligned (see `asyncrl.training.batch`): column j is the log-prob of
  `input_ids[:, j]` from the logits at j − 1, with logits divided by the temperature (as vLLM's
  processed log-probs).
- a step runs the LM head only at its trained-on columns (`asyncrl.training.token_logprobs`); `logprobs()` at every
  column. Micro batches: `asyncrl.training.micro_batches` (by count, or packed under `training.micro_batch_tokens`);
  `training.gradient_checkpointing`: `asyncrl.training.activation_checkpointing`. Neither changes the gradient. The
  optimizer is torch's AdamW, fused on a CPU (one pass over the weights: ~7x less CPU than its per-tensor loop).
- names are those of `model.named_parameters()`: a tied `lm_head.weight` does not appear. With `training.lora` the
  trained parameters are the adapters alone (`asyncrl.training.lora`): the optimizer, the pushes and the checkpoints
  hold A and B under their wire names (`<module>.lora_A`, `<module>.lora_B`); the base weights never change. LoRA
  dropout acts in the updates' forwards only: the proximal log-probs then come from a forward without it.
"""

from __future__ import annotations

import copy
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.activation_checkpointing import enable_gradient_checkpointing
from asyncrl.training.batch import TrainBatch
from asyncrl.training.credit import AttentionCredit
from asyncrl.training.deepspeed_config import deepspeed_config
from asyncrl.training.distributed import ControlChannel, batch_lengths
from asyncrl.training.lora import adapter_params, inject
from asyncrl.training.losses import merge_metrics, policy_loss
from asyncrl.training.micro_batches import rank_plans
from asyncrl.training.mini_batches import MiniBatch, plan_updates, step_metrics
from asyncrl.training.mixed_precision import autocast_context, register_float32_sdpa, resolve_autocast
from asyncrl.training.policy_state import load_state, optimizer_state
from asyncrl.training.process_group import (
    forget_deepspeed_groups,
    init_default_group,
    skip_deepspeed_op_builds,
)
from asyncrl.training.token_logprobs import full_logprobs, trained_logprobs

log = logging.getLogger(__name__)


@dataclass
class Snapshot:
    """Rank 0's copies after a step: the full weights (HF names, in order) and, for a checkpoint, the optimizer
    state (`PolicyTrainer.optimizer_state` format)."""

    weights: list[tuple[str, Tensor]]
    optimizer: dict[str, Tensor] | None = None

    def model_state(self) -> dict[str, Tensor]:
        """`PolicyTrainer.model_state()` of the same weights."""
        return {n: t.contiguous() for n, t in self.weights}


class PolicyTrainer:
    """A DeepSpeed engine (ZeRO stage `cfg.zero_stage`) around the HF model at `model_path`."""

    def __init__(
        self,
        model_path: Path,
        cfg: TrainingConfig,
        dtype: str = "float32",
        batch_size: int | None = None,
        timeout_s: float = 300.0,
        control_timeout_s: float | None = None,
    ) -> None:
        """`timeout_s`: the training group's collectives; `control_timeout_s` (W > 1): the longest wait on the
        control channel (a rank waiting for rank 0's next decision), default `timeout_s`."""
        if dtype != "float32":
            raise ValueError(f"dtype: the CPU trainer trains in float32, got {dtype!r}")
        t0 = time.monotonic()
        self.cfg = cfg
        self.timeout_s = timeout_s
        self._owns_group, self.device = init_default_group(timeout_s)
        self.rank, self.world_size = dist.get_rank(), dist.get_world_size()
        self.channel: ControlChannel | None = None
        if self.world_size > 1:
            self.channel = ControlChannel.create(max(timeout_s, control_timeout_s or 0.0))
        skip_deepspeed_op_builds()
        import deepspeed
        from transformers import AutoModelForCausalLM

        torch.manual_seed(cfg.seed)
        model = AutoModelForCausalLM.from_pretrained(str(model_path), dtype=torch.float32)
        model.config.use_cache = False
        self.autocast = resolve_autocast(cfg.matmul_dtype, self.device)
        if self.autocast and cfg.attention_credit is None:
            # bf16 matrix products, float32 attention (asyncrl.training.mixed_precision). Attention credit swaps in
            # its own capturing SDPA for the step, which then attends in bf16: correct, slower on a CPU.
            model.set_attn_implementation(register_float32_sdpa())
        self._ref = None
        if cfg.kl_coef > 0:
            self._ref = copy.deepcopy(model).eval().requires_grad_(False).to(self.device)
        if cfg.lora is not None:  # adapters on the target layers, every other weight frozen (asyncrl.training.lora)
            model = inject(model, cfg.lora)
        optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=cfg.lr,
                                      weight_decay=cfg.weight_decay, fused=self.device.type == "cpu" or None)
        ds_cfg = deepspeed_config(cfg, batch_size, dist.get_world_size())
        self.engine, _, _, _ = deepspeed.initialize(model=model, optimizer=optimizer, config=ds_cfg)
        self.engine.eval()  # no dropout: prox == logp at the step start (LoRA's own dropout: `_dropout`)
        self._dropout = [m for n, m in self.engine.module.named_modules()
                         if "lora_dropout" in n and isinstance(m, torch.nn.Dropout) and m.p > 0]
        if cfg.gradient_checkpointing:  # after eval(): it flags the decoder layers alone (activation_checkpointing)
            enable_gradient_checkpointing(self.engine.module)
        self.credit = AttentionCredit(cfg.attention_credit, model.config.num_hidden_layers) if cfg.attention_credit else None
        self.stage = int(self.engine.zero_optimization_stage())
        self.init_seconds = time.monotonic() - t0
        log.info("PolicyTrainer ready: ZeRO stage %d, rank %d of %d on %s, init %.1f s", self.stage, self.rank,
                 self.world_size, self.device, self.init_seconds)

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def _to_device(self, mb: TrainBatch) -> TrainBatch:
        """`mb` on the training device (the same object on the CPU)."""
        if self.device.type == "cpu":
            return mb
        return TrainBatch(**{f.name: getattr(mb, f.name).to(self.device) for f in fields(mb)})

    # ---- forward -------------------------------------------------------------------------------

    def _call(self, model: Any, mb: TrainBatch, mask: Tensor | None) -> Callable[[], Any]:
        """The forward of `model` (the engine, or the reference model) on `mb` under the autocast setting, to call."""
        def run() -> Any:
            with autocast_context(self.autocast, self.device):
                return model(input_ids=mb.input_ids, attention_mask=mask, use_cache=False)
        return run

    def _forward(self, mb: TrainBatch, temperature: float, need_entropy_grad: bool,
                 trained_only: bool = False) -> tuple[Tensor, Tensor]:
        """Label-aligned token log-probs [S, T] (with grad when grad is enabled) and entropies [S, T]; with
        `trained_only`, at the trained-on columns alone (LM head included), 0 elsewhere, and plain causal attention
        (rows are right-padded: a real token attends to real tokens only; attention credit keeps the mask)."""
        if not trained_only:
            return full_logprobs(self._call(self.engine, mb, mb.attention_mask)().logits, mb.input_ids, temperature,
                                 need_entropy_grad)
        run = self._call(self.engine, mb, mb.attention_mask if self.credit is not None else None)
        return trained_logprobs(run, self.engine.module, mb.input_ids, mb.response_mask, temperature,
                                need_entropy_grad)

    @torch.no_grad()
    def _ref_logprobs(self, mb: TrainBatch, temperature: float) -> Tensor | None:
        """The reference model's log-probs at the trained-on columns (0 elsewhere), or None without one."""
        if self._ref is None:
            return None
        run = self._call(self._ref, mb, None)
        return trained_logprobs(run, self._ref, mb.input_ids, mb.response_mask, temperature, entropy_grad=False)[0]

    @torch.no_grad()
    def logprobs(self, batch: TrainBatch, temperature: float = 1.0) -> Tensor:
        """Label-aligned log-probs [S, T] of `batch` under the current weights at every column (0 at column 0), in
        the micro batches of `train_step` (with W = 1)."""
        out = torch.zeros(batch.input_ids.shape, dtype=torch.float32)
        for index in rank_plans(batch_lengths(batch), 1, self.cfg.micro_batch_size, self.cfg.micro_batch_tokens)[0]:
            mb = batch.rows(index)
            lp, _ = self._forward(self._to_device(mb), temperature, need_entropy_grad=False)
            out[torch.tensor(index), : lp.shape[1]] = lp.cpu()
        return out

    # ---- training ------------------------------------------------------------------------------

    def train_step(self, batch: TrainBatch, temperature: float = 1.0, micro_batch_size: int | None = None,
                   ent_coef: float | None = None) -> dict[str, float]:
        """The step's optimizer steps on `batch` (`asyncrl.training.mini_batches`), each accumulating
        gradients over its mini-batch's micro batches (and ranks), whose losses carry its denominators.

        Collective when W > 1 (module docstring). The entropy bonus (`ent_coef`, default `cfg.ent_coef`)
        applies where `batch.entropy_mask` is 1. With `cfg.attention_credit`, each micro batch's advantages
        are rescaled by γ_t from the attention of the same forward (`asyncrl.training.credit`). Rows of zero
        gradient are not computed (`asyncrl.training.zero_advantage`). Returns `step_metrics`: loss metrics,
        `grad_norm` (before clipping), `entropy`, `skipped_rows`, `updates`, the plan."""
        size = micro_batch_size or self.cfg.micro_batch_size
        coef = self.cfg.ent_coef if ent_coef is None else ent_coef
        minis = plan_updates(batch, self.cfg, coef, self.rank, self.world_size, size)
        if self.cfg.mini_batches * self.cfg.epochs > 1 or self._dropout:  # step-start log-probs, no dropout
            for mini in minis:
                mini.prox = self._prox_logprobs(mini.micro, temperature)
        for m in self._dropout:  # LoRA dropout acts in the updates' forwards alone
            m.train()
        try:
            results = [self._update(mini, temperature, coef) for _ in range(self.cfg.epochs) for mini in minis]
        finally:
            for m in self._dropout:
                m.eval()
        return step_metrics(batch, minis, results, self.world_size, size, self.cfg.micro_batch_tokens)

    @torch.no_grad()
    def _prox_logprobs(self, micro: list[tuple[TrainBatch, bool]], temperature: float) -> list[Tensor]:
        """The policy's log-probs at the trained-on columns of each of `micro`, by an update's own forward
        without gradient. Padding micro batches run too: ZeRO-3 gathers the weights in every forward."""
        out = []
        for cpu_mb, _ in micro:
            mb = self._to_device(cpu_mb)
            out.append(self._forward(mb, temperature, need_entropy_grad=False, trained_only=True)[0])
        return out

    def _update(self, mini: MiniBatch, temperature: float, ent_coef: float) -> dict[str, float]:
        """One optimizer step on `mini`: its metrics merged over micro batches and ranks, and `grad_norm`."""
        parts, entropy_grad = [], ent_coef > 0
        for i, (cpu_mb, padding) in enumerate(mini.micro):
            self.engine.set_gradient_accumulation_boundary(i == len(mini.micro) - 1)
            mb = self._to_device(cpu_mb)
            advantages, credit_metrics = mb.advantages, {}
            if self.credit is not None:
                with self.credit.capture(self.engine) as cap:
                    logp, entropy = self._forward(mb, temperature, entropy_grad, trained_only=True)
                advantages, credit_metrics = self.credit.scale(cap, mb)
            else:
                logp, entropy = self._forward(mb, temperature, entropy_grad, trained_only=True)
            prox = logp.detach() if mini.prox is None else mini.prox[i]
            loss, metrics = policy_loss(
                self.cfg, logp, prox, mb.behav_logprobs, advantages, mb.response_mask, mb.rewards,
                ref_logp=self._ref_logprobs(mb, temperature), entropy=entropy, num_samples=mini.num_samples,
                num_tokens=mini.num_tokens, ent_mask=mb.entropy_mask, ent_coef=ent_coef,
            )
            self.engine.backward(loss * self.world_size if self.world_size > 1 else loss, scale_wrt_gas=False)
            if not padding:
                parts.append({**metrics, **credit_metrics})
        grad_norm = self._grad_norm_stage0() if self.stage == 0 else None
        self.engine.step()
        if grad_norm is None:
            norm = self.engine.get_global_grad_norm()
            grad_norm = float(norm) if norm is not None else float("nan")
        return merge_metrics(self._gather_parts(parts)) | {"grad_norm": grad_norm}

    def _gather_parts(self, parts: list[dict[str, float]]) -> list[dict[str, float]]:
        """Every rank's metric parts, in rank order (this rank's alone when W = 1)."""
        if self.channel is None:
            return parts
        every = self.channel.all_gather_json(parts, self.timeout_s)
        return [part for rank_parts in every for part in rank_parts]

    def _grad_norm_stage0(self) -> float:
        norms = [p.grad.detach().norm() for p in self.engine.module.parameters() if p.grad is not None]
        return float(torch.stack(norms).norm()) if norms else 0.0

    # ---- weights and state ---------------------------------------------------------------------

    def _named_params(self) -> list[tuple[str, torch.nn.Parameter]]:
        """The trained parameters: every one (HF names), or with LoRA the adapters (wire names)."""
        if self.cfg.lora is not None:
            return adapter_params(self.engine.module)
        return list(self.engine.module.named_parameters())

    def named_weights(self) -> list[tuple[str, Tensor]]:
        """Float32 CPU copies of the trained parameters (`_named_params`: every parameter with HF names, or the LoRA
        adapters with their wire names), in `named_parameters()` order: what a push sends and a checkpoint keeps."""
        params = self._named_params()
        if self.stage == 3:
            import deepspeed

            with deepspeed.zero.GatheredParameters([p for _, p in params], modifier_rank=None):
                return [(n, p.detach().float().cpu().clone()) for n, p in params]
        return [(n, p.detach().float().cpu().clone()) for n, p in params]

    def snapshot(self, optimizer: bool = False) -> Snapshot | None:
        """Every rank, at the same point: the full weights (and with `optimizer` the optimizer state) as a
        `Snapshot` on rank 0, None on the others. Ranks other than 0 take part where ZeRO partitions what is
        copied (weights under ZeRO-3, optimizer moments under ZeRO 1–3) and copy nothing otherwise."""
        weights = self.named_weights() if self.is_leader or self.stage == 3 else []
        opt = self.optimizer_state() if optimizer and (self.is_leader or self.stage > 0) else None
        return Snapshot(weights, opt) if self.is_leader else None

    def model_state(self) -> dict[str, Tensor]:
        """Contiguous CPU clones of every parameter (tied weights once), for safetensors."""
        return {n: t.contiguous() for n, t in self.named_weights()}

    def optimizer_state(self) -> dict[str, Tensor]:
        """AdamW state as flat named tensors (`asyncrl.training.policy_state.optimizer_state`)."""
        return optimizer_state(self.engine, self.stage, self._named_params())

    def load_state(self, model_state: dict[str, Tensor], optimizer_state: dict[str, Tensor] | None = None) -> None:
        """Load `model_state()` / `optimizer_state()` output (checkpoint resume; `asyncrl.training.policy_state`)."""
        load_state(self.engine, self.stage, self.device, self._named_params(), model_state, optimizer_state)

    def close(self) -> None:
        """Release the engine and destroy the process group if this trainer created it."""
        destroy = getattr(self.engine, "destroy", None)
        if callable(destroy):
            destroy()
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
            forget_deepspeed_groups()

