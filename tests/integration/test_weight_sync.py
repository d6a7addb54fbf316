"""Weight sync end to end: this test process is the trainer (rank 0, HF model), two real vLLM generation
servers are ranks 1 and 2 of a gloo group (world size 3)."""

from __future__ import annotations

import re
import shutil
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import torch

from asyncrl.transport.weight_buckets import checksums_match, weights_checksum
from asyncrl.transport.weight_sync import WeightSender, WeightSyncError
from tests.helpers.generation_server import ServerProcess, shared_generation_server, start_server

pytestmark = pytest.mark.integration

PROMPT = [3, 4, 5]


@pytest.fixture(scope="module")
def servers() -> Iterator[tuple[list[ServerProcess], Path]]:
    first, model_dir = shared_generation_server()
    work = Path(tempfile.mkdtemp(prefix="asyncrl-gen-test-2-"))
    second = start_server(model_dir, work)
    try:
        for s in (first, second):  # the first request after start is slow (lazy kernel set-up)
            httpx.post(f"{s.url}/generate", json={"request_id": "warm", "prompt_token_ids": [1], "max_tokens": 1}, timeout=300)
        yield [first, second], model_dir
    finally:
        second.stop()
        shutil.rmtree(work, ignore_errors=True)


@pytest.fixture(scope="module")
def trainer_model(servers: tuple[list[ServerProcess], Path]) -> torch.nn.Module:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(str(servers[1]), dtype=torch.float32)
    model.eval()
    return model


@pytest.fixture(scope="module")
def sender(servers: tuple[list[ServerProcess], Path]) -> Iterator[WeightSender]:
    s = WeightSender([srv.url for srv in servers[0]], backend="gloo", timeout_s=60, bucket_bytes=64 * 1024)
    s.connect()
    yield s
    s.close()


def _perturb(model: torch.nn.Module, seed: int) -> list[tuple[str, torch.Tensor]]:
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.05 * torch.randn(p.shape, generator=g))
    return [(n, p.detach().clone()) for n, p in model.named_parameters()]


def _hf_logprobs(model: torch.nn.Module, prompt: list[int], tokens: list[int]) -> list[float]:
    with torch.no_grad():
        logits = model(torch.tensor([prompt + tokens])).logits[0].double()
    lp = torch.log_softmax(logits, dim=-1)
    return [float(lp[len(prompt) - 1 + i, t]) for i, t in enumerate(tokens)]


def _generate(url: str, request_id: str, max_tokens: int, seed: int) -> dict[str, Any]:
    body = {"request_id": request_id, "prompt_token_ids": PROMPT, "max_tokens": max_tokens, "temperature": 1.0, "seed": seed}
    r = httpx.post(f"{url}/generate", json=body, timeout=120)
    assert r.status_code == 200, r.text
    return dict(r.json())


def test_push_reaches_both_servers_exactly(
    servers: tuple[list[ServerProcess], Path], trainer_model: torch.nn.Module, sender: WeightSender
) -> None:
    urls = [s.url for s in servers[0]]
    base = httpx.get(f"{urls[0]}/health").json()["version"]
    named = _perturb(trainer_model, seed=1)
    t0 = time.monotonic()
    replies = sender.push(base + 1, named)
    assert time.monotonic() - t0 < 30
    assert set(replies) == set(urls) and all(r["version"] == base + 1 for r in replies.values())
    expected = weights_checksum(named)
    # vLLM's CPU linear layers keep only a pre-packed copy, so the model-side checksum covers the other
    # parameters: embeddings (tied lm_head once), norms and the q/k/v biases (fused into qkv_proj.bias).
    kept = [(n, t) for n, t in named if not re.search(r"_proj\.weight$", n)]
    for url in urls:
        assert httpx.get(f"{url}/health").json()["version"] == base + 1
        ck = httpx.get(f"{url}/weights/checksum").json()
        assert ck["version"] == base + 1 and ck["source"] == "received"
        assert ck["checksum"] == expected  # bit-exact: every tensor arrived intact in the worker
        worker = ck["workers"][0]
        assert checksums_match(worker["model"], weights_checksum(kept))
        assert len(worker["emptied"]) == 8  # qkv, o, gate_up, down in each of 2 layers
    for i, url in enumerate(urls):  # new tokens come from the new weights: vLLM's log-probs equal HF's
        out = _generate(url, f"after-push-{i}", max_tokens=40, seed=100 + i)
        assert out["token_versions"] == [base + 1] * 40 and out["start_version"] == base + 1
        hf = _hf_logprobs(trainer_model, PROMPT, out["token_ids"])
        assert max(abs(a - b) for a, b in zip(hf, out["logprobs"], strict=True)) < 1e-4


def test_request_spanning_an_update_continues_under_new_weights(
    servers: tuple[list[ServerProcess], Path], trainer_model: torch.nn.Module, sender: WeightSender
) -> None:
    url = servers[0][0].url
    old_model_state = {k: t.clone() for k, t in trainer_model.state_dict().items()}
    old_named = [(n, p.detach().clone()) for n, p in trainer_model.named_parameters()]
    # Decoding is fast (~1-4 ms per token): retry until the update lands while the request is decoding.
    for attempt in range(5):
        v = httpx.get(f"{url}/health").json()["version"]
        result: dict[str, Any] = {}
        worker = threading.Thread(
            target=lambda res=result, rid=f"spanning-{attempt}": res.update(_generate(url, rid, max_tokens=2000, seed=7))
        )
        worker.start()
        deadline = time.monotonic() + 60
        while worker.is_alive():
            h = httpx.get(f"{url}/health").json()
            if h["running"] == 1 and 0 < h["load"] <= 1980:  # at least 20 tokens under the old weights
                break
            assert time.monotonic() < deadline
        trainer_model.load_state_dict(old_model_state)
        new_named = _perturb(trainer_model, seed=2)
        if worker.is_alive():
            sender.push(v + 1, new_named)
        worker.join(timeout=120)
        if v + 1 in result["token_versions"]:
            break
        if httpx.get(f"{url}/health").json()["version"] == v + 1:  # pushed too late: restore the old weights
            sender.push(v + 2, old_named)
    else:
        # On a 2-core machine the server's event loop can be starved while the engine decodes, so the
        # update may only land after the request finished. Not a failure of the code under test.
        pytest.skip("no update landed while the request was decoding in 5 attempts (CPU starvation)")
    versions = result["token_versions"]
    assert result["start_version"] == v and result["finish_reason"] == "length"
    switch = versions.index(v + 1)
    assert 20 <= switch < 2000 and versions == [v] * switch + [v + 1] * (2000 - switch)
    tokens, lps = result["token_ids"], result["logprobs"]
    new_hf = _hf_logprobs(trainer_model, PROMPT, tokens)
    assert max(abs(a - b) for a, b in zip(new_hf[switch:], lps[switch:], strict=True)) < 1e-3
    trainer_model.load_state_dict(old_model_state)
    old_hf = _hf_logprobs(trainer_model, PROMPT, tokens[:switch])
    assert max(abs(a - b) for a, b in zip(old_hf, lps[:switch], strict=True)) < 1e-3
    sender.push(v + 2, old_named)  # leave both servers on the trainer's current weights


def test_stale_version_fails_fast_and_reconnect_recovers(
    servers: tuple[list[ServerProcess], Path], trainer_model: torch.nn.Module, sender: WeightSender
) -> None:
    url = servers[0][0].url
    v = httpx.get(f"{url}/health").json()["version"]
    named = [(n, p.detach().clone()) for n, p in trainer_model.named_parameters()]
    t0 = time.monotonic()
    with pytest.raises(WeightSyncError, match="version: expected > current version"):
        sender.push(v, named)
    assert time.monotonic() - t0 < 30
    assert not sender.connected
    with pytest.raises(WeightSyncError, match="not connected"):
        sender.push(v + 1, named)
    sender.connect()
    sender.push(v + 1, named)
    for s in servers[0]:
        assert httpx.get(f"{s.url}/health").json() == {"status": "ok", "version": v + 1, "running": 0, "waiting": 0, "load": 0}
        assert httpx.get(f"{s.url}/weights/checksum").json()["checksum"] == weights_checksum(named)
