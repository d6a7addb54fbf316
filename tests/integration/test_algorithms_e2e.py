"""Every algorithm trains: each loss variant, GAE with one critic, AsyPPO and attention credit, on real samples.

The samples come from the session's real vLLM server (behaviour log-probs from the engine); each variant is built
from its `TrainingConfig` alone, runs the real `Learner` (DeepSpeed actor, torch critics) for a few steps, and
logs every step to a real MLflow store; the test reads the metrics back. The same batch is reused across steps, so
later steps are off-policy and the importance weights do real work. The critics' checkpoint files round-trip.
"""

from __future__ import annotations

import math
import random

import httpx
import pytest
import torch
from mlflow.tracking import MlflowClient

from asyncrl.config.schema import TrainingConfig
from asyncrl.tracking.mlflow_tracker import Tracker
from asyncrl.training.batch import build_batch
from asyncrl.training.learner import Learner
from asyncrl.types import Group, Sample
from tests.helpers.env_vars import restored_env
from tests.helpers.generation_server import shared_generation_server

pytestmark = pytest.mark.integration

REWARD_TOKEN = 7  # reward 1 when the response contains this token
CREDIT = {"scaling": "coupled", "window": 3, "fai_h_lo": 1, "fai_h_hi": 6}

VARIANTS: dict[str, dict] = {
    "ppo_dual_clip": {"loss": "ppo", "loss_params": {"dual_clip": 3.0}, "ent_coef": 0.01},
    "decoupled_ppo": {"loss": "decoupled_ppo", "loss_params": {"w_max": 1.5}},
    "tis": {"loss": "tis", "kl_coef": 0.05},
    "cispo_unified": {"loss": "cispo", "loss_params": {"unified_mask": True}, "aggregation": "token-mean"},
    "topr": {"loss": "topr"},
    "gae_critic": {"loss": "decoupled_ppo", "advantage": "gae", "lam": 0.9},
    "asyppo": {"loss": "decoupled_ppo", "advantage": "gae", "asyppo": {}, "critic": {"warmup_steps": 1}},
    "attention_credit": {"loss": "decoupled_ppo", "attention_credit": CREDIT},
}
EXPECTED = {
    "train/loss", "train/clip_fraction", "train/iw_mean", "train/iw_max", "train/masked_fraction", "train/entropy",
    "train/grad_norm",
}
EXTRA_EXPECTED = {
    "tis": {"train/kl_ref"},
    "gae_critic": {"critic/loss", "critic/explained_variance"},
    "asyppo": {"critic/loss_0", "critic/loss_1", "critic/explained_variance", "asyppo/adv_masked_fraction",
               "asyppo/ent_filtered_fraction"},
    "attention_credit": {"train/credit_amplified_fraction", "train/credit_gamma_mean"},
}


@pytest.fixture(autouse=True)
def _restore_dist_env():
    """The in-process trainer fills in MASTER_PORT & co. (a lone rank 0); leave the test process as it was."""
    with restored_env(("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")):
        yield


@pytest.fixture(scope="module")
def engine_groups() -> tuple[list[Group], object]:
    """4 prompts × 4 samples of 3–8 tokens sampled by the real engine, rewarded by whether REWARD_TOKEN appears."""
    server, model_dir = shared_generation_server()
    rng = random.Random(0)
    groups = []
    for g in range(4):
        prompt = [rng.randrange(1, 32) for _ in range(5)]
        samples = []
        for i in range(4):
            out = httpx.post(f"{server.url}/generate", timeout=300, json={
                "request_id": f"e2e-{g}-{i}", "prompt_token_ids": prompt, "max_tokens": rng.randint(3, 8),
                "temperature": 1.0, "top_p": 1.0, "seed": 100 * g + i, "stop_token_ids": []}).json()
            samples.append(Sample(f"g{g}", i, prompt, out["token_ids"], out["logprobs"], out["token_versions"],
                                  out["start_version"], reward=float(REWARD_TOKEN in out["token_ids"])))
        groups.append(Group(f"g{g}", 0, "e2e", samples))
    return groups, model_dir


@pytest.fixture(scope="module")
def mlflow_uri(tmp_path_factory) -> str:
    """One MLflow store for the module (creating a sqlite store runs its migrations, seconds each time)."""
    return f"sqlite:///{tmp_path_factory.mktemp('mlflow') / 'mlflow.db'}"


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_variant_trains_and_logs(variant: str, engine_groups, mlflow_uri: str) -> None:
    groups, model_dir = engine_groups
    cfg = TrainingConfig(micro_batch_size=8, steps=10, lr=1e-3, **VARIANTS[variant])
    uri = mlflow_uri
    tracker = Tracker.create(uri, "e2e", variant, params={"training.loss": cfg.loss})
    learner = Learner(model_dir, cfg, timeout_s=120)
    try:
        before = {n: w.clone() for n, w in learner.named_weights()}
        updated = []
        for step in range(3):
            batch = build_batch(groups, norm_std=cfg.norm_std, pad_id=0)
            metrics = learner.train_step(batch, step, temperature=1.0)
            tracker.log_metrics({(k if "/" in k else f"train/{k}"): v for k, v in metrics.items()}, step=step)
            updated.append(metrics["actor_updated"])
            if metrics["actor_updated"] == 0.0:  # a critic warm-up step leaves the actor exactly as it was
                assert all(torch.equal(before[n], w) for n, w in learner.named_weights())
        after = dict(learner.named_weights())
        extra = learner.checkpoint_extra()
        assert set(extra) == set(learner.extra_file_names())  # what resume reads back is what was written
        if extra:  # the critics' checkpoint files restore the same values in a fresh learner
            batch = build_batch(groups, norm_std=cfg.norm_std, pad_id=0)
            values = learner.critics.values(batch)
            fresh = Learner(model_dir, cfg, timeout_s=120)
            try:
                fresh.load_extra(extra)
                assert torch.equal(fresh.critics.values(batch), values)
            finally:
                fresh.close()
    finally:
        learner.close()
    warmup = cfg.critic_warmup_steps
    assert updated == [0.0] * warmup + [1.0] * (3 - warmup)
    assert any(not torch.equal(before[n], after[n]) for n in before), "the actor did not change"
    client = MlflowClient(tracking_uri=uri)
    logged = client.get_run(tracker.run_id).data.metrics
    missing = (EXPECTED | EXTRA_EXPECTED.get(variant, set())) - set(logged)
    assert not missing, f"{variant}: metrics not logged: {sorted(missing)}"
    for key in EXPECTED | EXTRA_EXPECTED.get(variant, set()):
        history = client.get_metric_history(tracker.run_id, key)
        assert all(math.isfinite(m.value) for m in history), (variant, key)
    if variant in ("decoupled_ppo", "tis", "topr"):  # steps 2-3 reuse step 1's samples: the weights move off 1
        assert client.get_metric_history(tracker.run_id, "train/iw_max")[-1].value != pytest.approx(1.0)


def test_critic_with_another_vocabulary_is_refused(engine_groups, tmp_path) -> None:
    from tests.helpers.tiny_random_model import tiny_qwen2_config

    _, model_dir = engine_groups
    other = tiny_qwen2_config()
    other.vocab_size = 64
    from transformers import Qwen2ForCausalLM

    Qwen2ForCausalLM(other).save_pretrained(tmp_path / "critic")
    cfg = TrainingConfig(micro_batch_size=8, advantage="gae", critic={"model_path": str(tmp_path / "critic")})
    with pytest.raises(ValueError, match="training.critic.model_path: the critic must share the actor's tokenizer"):
        Learner(model_dir, cfg, timeout_s=60)
