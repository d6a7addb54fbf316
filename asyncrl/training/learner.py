"""One training step of the configured algorithm: advantages, critics, AsyPPO masks, the actor update.

Owns the order of work within a step (docs/algorithms.md §2–§5), on one `TrainBatch` whose advantages hold the
GRPO advantages that `build_batch` computed:
1. `advantage: gae`: every critic scores every response token (values before this step's update), GAE on the
   mean value V̄ with the outcome reward on the last trained-on token replaces the advantages (per row: a
   segment of a segmented sample ends its own GAE chain, `asyncrl.training.segments`);
   with AsyPPO, the critics' disagreement zeroes the advantage of the ⌊k·n⌋ most agreed tokens and removes
   the entropy bonus from the ⌊h·n⌋ least agreed ones;
2. the critics train on the returns (AsyPPO: critic m only on its share of each group);
3. the actor trains (`PolicyTrainer.train_step`; attention credit, when configured, rescales advantages there),
   except in the critic warm-up steps, where the actor is left unchanged.

Data parallel (W ranks, torchrun, every rank running the same step): rank 0 alone holds the critics and runs
steps 1–2 (`prepare`); the prepared batch (advantages and masks final) then reaches every rank (the training role
shares it, `asyncrl.training.distributed.Decisions`), and every rank calls `update_actor` with it: step 3 on its
share (`PolicyTrainer.train_step` is collective). A lone process may call `train_step` (both, in order).

Invariants: the values feeding GAE and the masks are those of the critics before this step's update; a
warm-up step changes no actor weight; critic weights and optimizer moments are part of the checkpoint.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from torch import Tensor

from asyncrl.config.schema import TrainingConfig
from asyncrl.training.advantages import gae
from asyncrl.training.asyppo import critic_owner, disagreement_masks
from asyncrl.training.batch import TrainBatch
from asyncrl.training.critic import CriticEnsemble
from asyncrl.training.policy import PolicyTrainer

log = logging.getLogger(__name__)

CRITIC_FILE = "critic"
CRITIC_OPTIMIZER_FILE = "critic_optimizer"


class Learner:
    """The actor (`PolicyTrainer`) and, with GAE, its critic(s) (`CriticEnsemble`, on rank 0 only)."""

    def __init__(
        self, model_path: Path, cfg: TrainingConfig, timeout_s: float = 300.0, control_timeout_s: float | None = None
    ) -> None:
        """`timeout_s`: training collectives and rank 0's sends; `control_timeout_s`: see `PolicyTrainer`."""
        self.cfg = cfg
        self.timeout_s = timeout_s
        critic_path = Path(cfg.critic.model_path) if cfg.critic.model_path else model_path
        if cfg.num_critics:
            _check_critic_vocab(critic_path, model_path)
        self.policy = PolicyTrainer(model_path, cfg, timeout_s=timeout_s, control_timeout_s=control_timeout_s)
        self.critics: CriticEnsemble | None = None
        if cfg.num_critics and self.policy.is_leader:
            try:
                self.critics = CriticEnsemble(
                    critic_path,
                    num_critics=cfg.num_critics,
                    lr=cfg.critic.lr,
                    weight_decay=cfg.critic.weight_decay,
                    grad_clip=cfg.critic.grad_clip,
                    micro_batch_size=cfg.critic.micro_batch_size or cfg.micro_batch_size,
                    seed=cfg.seed,
                    gradient_checkpointing=cfg.gradient_checkpointing,
                )
            except BaseException:
                self.policy.close()  # do not leave the actor's process group behind
                raise

    def train_step(self, batch: TrainBatch, step: int, temperature: float) -> dict[str, float]:
        """A lone process (W = 1): `prepare` then `update_actor` on `batch` at step `step` (0-based); returns the
        metrics, keys without the `train/` prefix for the actor's and with `critic/` / `asyppo/` prefixes for the
        rest."""
        if self.policy.world_size > 1:
            raise RuntimeError("Learner.train_step: a lone process only; with W > 1 rank 0 calls prepare, shares the "
                               "batch, and every rank calls update_actor")
        return {**self.prepare(batch, step), **self.update_actor(batch, step, temperature)}

    def prepare(self, batch: TrainBatch, step: int) -> dict[str, float]:
        """Rank 0: the critic phase (steps 1–2), writing the advantages (and AsyPPO masks) into `batch`; its
        metrics ({} without critics)."""
        if not self.policy.is_leader:
            raise RuntimeError("Learner.prepare: rank 0 alone holds the critics")
        return self._critic_phase(batch) if self.critics is not None else {}

    def trains_actor(self, step: int) -> bool:
        """Whether the actor trains at `step` (not in the critics' warm-up steps): the same answer on every rank."""
        return step >= self.cfg.critic_warmup_steps

    def update_actor(self, batch: TrainBatch | None, step: int, temperature: float) -> dict[str, float]:
        """Every rank (collective when W > 1): the actor update on the prepared `batch` (the same on every rank; None
        where the actor does not train at `step`); the actor's metrics and `actor_updated`."""
        if not self.trains_actor(step):
            return {"actor_updated": 0.0}
        if batch is None:
            raise ValueError(f"Learner.update_actor: step {step} trains the actor, expected its batch")
        ent_coef = self.cfg.asyppo.ent_coef if self.cfg.num_critics and self.cfg.asyppo is not None else None
        metrics = self.policy.train_step(batch, temperature=temperature, ent_coef=ent_coef)
        return {**metrics, "actor_updated": 1.0}

    def _critic_phase(self, batch: TrainBatch) -> dict[str, float]:
        """GAE advantages (and AsyPPO masks) written into `batch`, then one critic update."""
        assert self.critics is not None
        cfg = self.cfg
        mask = batch.response_mask
        values = self.critics.values(batch)  # [M, S, T], before the update
        adv, returns = gae(batch.token_rewards, values.mean(dim=0), mask, gamma=cfg.gamma, lam=cfg.lam)
        metrics: dict[str, float] = {}
        owner: Tensor | None = None
        valid = mask > 0
        if cfg.asyppo is not None:
            adv_mask, ent_mask = disagreement_masks(values, mask, k=cfg.asyppo.adv_mask_k, h=cfg.asyppo.ent_filter_h)
            adv = adv * adv_mask
            batch.entropy_mask = ent_mask
            owner = critic_owner(batch.index_in_group, batch.group_size, cfg.asyppo.num_critics)
            n = max(int(valid.sum()), 1)
            sigma = values.std(dim=0, unbiased=False)
            metrics["asyppo/adv_masked_fraction"] = float(((adv_mask == 0) & valid).sum()) / n
            metrics["asyppo/ent_filtered_fraction"] = float(((ent_mask == 0) & valid).sum()) / n
            metrics["asyppo/disagreement_mean"] = float(sigma[valid].mean()) if bool(valid.any()) else 0.0
        batch.advantages = adv
        metrics["advantage/mean"] = float(adv[valid].mean()) if bool(valid.any()) else 0.0
        metrics["advantage/abs_mean"] = float(adv[valid].abs().mean()) if bool(valid.any()) else 0.0
        metrics.update(self.critics.train_step(batch, returns, owner))
        return metrics

    # ---- weights and state ---------------------------------------------------------------------

    def named_weights(self) -> list[tuple[str, Tensor]]:
        return self.policy.named_weights()

    def extra_file_names(self) -> tuple[str, ...]:
        """The names of the tensor files `checkpoint_extra` writes (none without critics)."""
        return (CRITIC_FILE, CRITIC_OPTIMIZER_FILE) if self.critics is not None else ()

    def checkpoint_extra(self) -> dict[str, dict[str, Tensor]]:
        """The critics' tensor files for the checkpoint (empty without critics)."""
        if self.critics is None:
            return {}
        return {CRITIC_FILE: self.critics.state(), CRITIC_OPTIMIZER_FILE: self.critics.optimizer_state()}

    def load_extra(self, files: dict[str, dict[str, Tensor]]) -> None:
        """Restore what `checkpoint_extra` wrote."""
        if self.critics is None:
            return
        self.critics.load_state(files[CRITIC_FILE], files[CRITIC_OPTIMIZER_FILE])

    def close(self) -> None:
        self.policy.close()


def _check_critic_vocab(critic_path: Path, actor_path: Path) -> None:
    """The critics read the actor's token ids: their vocabulary must be the actor's."""
    config = critic_path / "config.json"
    if not config.is_file():
        raise FileNotFoundError(f"training.critic.model_path: expected a causal LM folder with config.json, "
                                f"{config} does not exist")
    critic_vocab = json.loads(config.read_text()).get("vocab_size")
    actor_vocab = json.loads((actor_path / "config.json").read_text()).get("vocab_size")
    if critic_vocab != actor_vocab:
        raise ValueError(f"training.critic.model_path: the critic must share the actor's tokenizer; its vocab_size is "
                         f"{critic_vocab}, the actor's {actor_vocab}")
