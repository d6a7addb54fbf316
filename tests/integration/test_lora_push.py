"""LoRA pushes end to end: this test process is the trainer (an HF model with peft adapters), a real vLLM server
started with `--lora-scale` merges each pushed adapter into its served weights (`asyncrl.generation.lora_merge`).
The server's log-probs equal the trainer's LoRA forward, version after version (every merge starts from the base),
and a push whose kind the server cannot load is refused at the group's join, naming why."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from asyncrl.config.schema import LoraConfig
from asyncrl.training.lora import adapter_params, inject
from asyncrl.weights.buckets import weights_checksum
from asyncrl.weights.sync import WeightSender, WeightSyncError
from tests.helpers.generation_server import ServerProcess, shared_generation_server, start_server

pytestmark = pytest.mark.integration

PROMPT = [3, 4, 5]
LORA = LoraConfig(rank=4, alpha=8.0)  # scale 2
MAX_LEN = 256


@pytest.fixture(scope="module")
def lora_server() -> Iterator[tuple[ServerProcess, Path]]:
    _, model_dir = shared_generation_server()
    with tempfile.TemporaryDirectory(prefix="asyncrl-lora-") as work:
        server = start_server(model_dir, Path(work), max_model_len=MAX_LEN,
                              extra_args=("--lora-scale", str(LORA.scale)))
        try:
            yield server, model_dir
        finally:
            server.stop()


@pytest.fixture(scope="module")
def trainer(lora_server: tuple[ServerProcess, Path]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(lora_server[1]), dtype=torch.float32)
    return inject(model, LORA).eval()


def _random_adapter(model: torch.nn.Module, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for _, p in adapter_params(model):
            p.copy_(0.2 * torch.randn(p.shape, generator=g))
    return [(n, p.detach().clone()) for n, p in adapter_params(model)]


def _generate(url: str, request_id: str) -> dict[str, Any]:
    body = {"request_id": request_id, "prompt_token_ids": PROMPT, "max_tokens": 40, "temperature": 1.0, "seed": 5,
            "ignore_eos": True}
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def _hf_logprobs(model: torch.nn.Module, tokens: list[int]) -> list[float]:
    with torch.no_grad():
        lp = torch.log_softmax(model(torch.tensor([PROMPT + tokens])).logits[0].double(), dim=-1)
    return [float(lp[len(PROMPT) - 1 + i, t]) for i, t in enumerate(tokens)]


def test_adapter_pushes_serve_the_trainers_lora_model(lora_server: tuple[ServerProcess, Path],
                                                      trainer: torch.nn.Module) -> None:
    server, _ = lora_server
    assert httpx.get(f"{server.url}/health").json()["lora_scale"] == LORA.scale
    sender = WeightSender([server.url], backend="gloo", timeout_s=60, bucket_bytes=64 * 1024, lora_scale=LORA.scale)
    sender.connect()
    try:
        base = httpx.get(f"{server.url}/health").json()["version"]
        for k, seed in ((1, 1), (2, 2)):  # two versions: the second merges into the base, not into the first
            adapter = _random_adapter(trainer, seed)
            assert all(n.endswith((".lora_A", ".lora_B")) for n, _ in adapter)
            reply = sender.push(base + k, adapter)[server.url]
            assert reply["version"] == base + k and reply["phases"]["worker0_fast_reload"] == 1.0, reply
            ck = httpx.get(f"{server.url}/weights/checksum").json()
            assert ck["version"] == base + k and ck["checksum"] == weights_checksum(adapter)  # arrived intact
            out = _generate(server.url, f"lora-{k}")
            assert out["token_versions"] == [base + k] * 40
            hf = _hf_logprobs(trainer, out["token_ids"])
            assert max(abs(a - b) for a, b in zip(hf, out["logprobs"], strict=True)) < 1e-4
    finally:
        sender.shutdown()


def test_pushes_the_server_cannot_load_are_refused_at_the_join(lora_server: tuple[ServerProcess, Path]) -> None:
    server, _ = lora_server
    full = WeightSender([server.url], backend="gloo", timeout_s=10)
    with pytest.raises(WeightSyncError, match="serves LoRA adapters .* the trainer pushes full weights"):
        full.connect()
    full.shutdown()
    plain, _ = shared_generation_server()
    adapters = WeightSender([plain.url], backend="gloo", timeout_s=10, lora_scale=LORA.scale)
    with pytest.raises(WeightSyncError, match="started without LoRA support"):
        adapters.connect()
    adapters.shutdown()
    other = WeightSender([server.url], backend="gloo", timeout_s=10, lora_scale=4.0)
    with pytest.raises(WeightSyncError, match="merges them at scale 2.0"):
        other.connect()
    other.shutdown()


def test_a_server_started_from_a_checkpoints_adapter_serves_it(lora_server: tuple[ServerProcess, Path],
                                                              trainer: torch.nn.Module, tmp_path: Path) -> None:
    """A generation server restarted mid-run (`--lora-adapter`, a checkpoint's adapter) serves base + that adapter
    before any push, as the trainer computes it."""
    from safetensors.torch import save_file

    _, model_dir = lora_server
    adapter = _random_adapter(trainer, seed=3)
    save_file({n: t.contiguous() for n, t in adapter}, str(tmp_path / "adapter.safetensors"))
    with tempfile.TemporaryDirectory(prefix="asyncrl-lora-r-") as work:  # short: vLLM's IPC socket paths
        server = start_server(model_dir, Path(work), max_model_len=MAX_LEN,
                              extra_args=("--lora-scale", str(LORA.scale), "--lora-adapter",
                                          str(tmp_path / "adapter.safetensors")))
        try:
            out = _generate(server.url, "from-checkpoint")
            hf = _hf_logprobs(trainer, out["token_ids"])
            assert max(abs(a - b) for a, b in zip(hf, out["logprobs"], strict=True)) < 1e-4
        finally:
            server.stop()
