"""`asyncrl.generation.cpu_reload` on toy modules with vLLM's own quantisation-method classes: which models may take
the fast update, and what a capture keeps or refuses. The real update (a vLLM worker, exact log-probs after it) is
`tests/integration/test_weight_sync.py::test_later_pushes_take_the_fast_cpu_reload_and_stay_exact`."""

from __future__ import annotations

from collections.abc import Iterable

import pytest
import torch
from vllm.model_executor.layers.linear import UnquantizedLinearMethod
from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

from asyncrl.generation import cpu_reload
from asyncrl.generation.cpu_reload import CpuWeightReload, eligible


def pack(self: UnquantizedLinearMethod, layer: torch.nn.Module) -> None:
    """Stands in for the CPU packing (no oneDNN call): keep a copy, empty the weight, as vLLM's processing does."""
    layer.packed = layer.weight.detach().clone()
    layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)


@pytest.fixture(autouse=True)
def packing(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(UnquantizedLinearMethod, "process_weights_after_loading", pack)


class Linear(torch.nn.Module):
    def __init__(self, n: int, k: int) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.zeros(n, k), requires_grad=False)
        self.quant_method: object = UnquantizedLinearMethod()


class Toy(torch.nn.Module):
    """Two linear layers and an embedding; `load_weights` copies checkpoint-named tensors like vLLM's loaders."""

    def __init__(self) -> None:
        super().__init__()
        self.a, self.b = Linear(2, 3), Linear(3, 2)
        self.embed = torch.nn.Module()
        self.embed.weight = torch.nn.Parameter(torch.zeros(4, 2), requires_grad=False)
        self.embed.quant_method = UnquantizedEmbeddingMethod()

    def load_weights(self, items: Iterable[tuple[str, torch.Tensor]]) -> set[str]:
        params = dict(self.named_parameters())
        done = set()
        for name, t in items:
            params[name].data.copy_(t)
            done.add(name)
        return done


def layerwise_update(model: Toy, reload: CpuWeightReload, items: list[tuple[str, torch.Tensor]], ok: bool = True
                     ) -> None:
    """What vLLM's layerwise reload does, as far as the capture sees it: full weights, load, process each layer."""
    for m in (model.a, model.b):
        m.weight = torch.nn.Parameter(torch.zeros_like(m.packed), requires_grad=False)
    reload.start_capture()
    reload.load(items)
    for m in (model.a, model.b):
        m.quant_method.process_weights_after_loading(m)
    reload.end_capture(adopt=ok)


def weights(scale: float) -> list[tuple[str, torch.Tensor]]:
    return [("a.weight", torch.full((2, 3), scale)), ("b.weight", torch.full((3, 2), 2 * scale)),
            ("embed.weight", torch.full((4, 2), 3 * scale))]


def started() -> Toy:
    model = Toy()
    for m in (model.a, model.b):
        m.quant_method.process_weights_after_loading(m)  # as at start-up: packed, weight emptied
    return model


def test_eligible_only_on_cpu_with_unquantized_methods_only() -> None:
    model = Toy()
    assert eligible(model, torch.device("cpu"))
    assert not eligible(model, torch.device("cuda", 0))
    model.b.quant_method = object()  # a quantisation method of another kind: its processing may transform weights
    assert not eligible(model, torch.device("cpu"))
    assert not eligible(torch.nn.Linear(2, 2), torch.device("cpu"))  # nothing vLLM processes


def test_a_captured_update_makes_later_updates_load_and_repack_exactly() -> None:
    model = started()
    reload = CpuWeightReload(model)
    assert not reload.ready
    layerwise_update(model, reload, weights(1.0))
    assert reload.ready and set(reload.shadows) == {"a", "b"}
    assert "process_weights_after_loading" not in vars(model.a.quant_method)  # the wrapper is gone
    for scale in (2.0, 5.0):
        reload.begin()
        assert model.a.weight.shape == (2, 3)  # the kept full-size weight is back
        reload.load(weights(scale))
        reload.finish()
        assert model.a.weight.numel() == 0  # packed and emptied again
        assert torch.equal(model.a.packed, torch.full((2, 3), scale))
        assert torch.equal(model.b.packed, torch.full((3, 2), 2 * scale))
        assert torch.equal(model.embed.weight, torch.full((4, 2), 3 * scale))


def test_an_update_that_loads_less_than_the_first_fails() -> None:
    model = started()
    reload = CpuWeightReload(model)
    layerwise_update(model, reload, weights(1.0))
    reload.begin()
    reload.load(weights(2.0)[:2])
    with pytest.raises(RuntimeError, match=r"missing \['embed.weight'\]"):
        reload.finish()


def test_a_failed_or_oversized_capture_keeps_nothing(monkeypatch: pytest.MonkeyPatch) -> None:
    model = started()
    reload = CpuWeightReload(model)
    layerwise_update(model, reload, weights(1.0), ok=False)
    assert not reload.ready and reload.shadows == {}
    assert "process_weights_after_loading" not in vars(model.a.quant_method)
    assert not reload.refused  # a failed update is captured again next time
    layerwise_update(model, reload, weights(1.0))
    assert reload.ready
    for limit, ready in ((4 * 6 * 2 - 1, False), (4 * 6 * 2, True)):  # one byte short of both layers' weights, exact
        monkeypatch.setattr(cpu_reload, "MAX_SHADOW_BYTES", limit)
        fresh = CpuWeightReload(model)
        layerwise_update(model, fresh, weights(1.0))
        assert (fresh.ready, fresh.refused) == (ready, not ready)


def product(self: UnquantizedLinearMethod, layer: torch.nn.Module, x: torch.Tensor, bias: object = None) -> torch.Tensor:
    """Stands in for the packed kernel: the product with what `pack` kept."""
    return x @ layer.packed.t()


def test_an_update_prepared_ahead_of_the_pause_touches_nothing_the_engine_reads(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(UnquantizedLinearMethod, "apply", product)
    model = started()
    reload = CpuWeightReload(model)
    layerwise_update(model, reload, weights(1.0))
    assert reload.routes == {"a.weight": {"a.weight"}, "b.weight": {"b.weight"}, "embed.weight": {"embed.weight"}}
    live = {m: (getattr(model, m).packed, getattr(model, m).weight) for m in ("a", "b")}
    prepared = reload.prepare(weights(2.0))
    assert prepared is not None and set(prepared.stand_ins) == {"a", "b"}
    assert [n for n, _ in prepared.rest] == ["embed.weight"] and prepared.loaded == {"a.weight", "b.weight"}
    for m, (packed, weight) in live.items():  # the engine still runs the old packs; the layers hold their placeholders
        assert getattr(model, m).packed is packed and getattr(model, m).weight is weight and weight.numel() == 0
    assert torch.equal(model.a.packed, torch.full((2, 3), 1.0)) and torch.equal(model.embed.weight,
                                                                              torch.full((4, 2), 3.0))
    reload.begin()  # the pause: install the packs, load and process the rest
    reload.apply_prepared(prepared)
    reload.load(prepared.rest)
    reload.finish()
    assert torch.equal(model.a.packed, torch.full((2, 3), 2.0)) and torch.equal(model.b.packed, torch.full((3, 2), 4.0))
    assert model.a.weight.numel() == 0 and torch.equal(model.embed.weight, torch.full((4, 2), 6.0))
    reload.begin()  # and an update without preparation after it is exact too
    reload.load(weights(5.0))
    reload.finish()
    assert torch.equal(model.a.packed, torch.full((2, 3), 5.0)) and torch.equal(model.b.packed, torch.full((3, 2), 10.0))


def test_layers_with_a_bias_or_kernels_that_read_the_weight_are_left_to_the_pause(
        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(UnquantizedLinearMethod, "apply", product)
    model = started()
    model.b.register_parameter("bias", torch.nn.Parameter(torch.zeros(3), requires_grad=False))
    reload = CpuWeightReload(model)
    layerwise_update(model, reload, weights(1.0))
    prepared = reload.prepare(weights(2.0))
    assert prepared is not None and set(prepared.stand_ins) == {"a"}
    assert sorted(n for n, _ in prepared.rest) == ["b.weight", "embed.weight"]
    reload.begin()
    reload.apply_prepared(prepared)
    reload.load(prepared.rest)
    reload.finish()
    assert torch.equal(model.a.packed, torch.full((2, 3), 2.0)) and torch.equal(model.b.packed, torch.full((3, 2), 4.0))

    def aliasing_pack(self: UnquantizedLinearMethod, layer: torch.nn.Module) -> None:
        """A kernel that keeps reading the weight's memory: loading ahead would change what the engine runs."""
        layer.packed = layer.weight.detach()
        layer.weight = torch.nn.Parameter(torch.empty(0), requires_grad=False)

    monkeypatch.setattr(UnquantizedLinearMethod, "process_weights_after_loading", aliasing_pack)
    model = started()
    reload = CpuWeightReload(model)
    layerwise_update(model, reload, weights(1.0))
    assert reload.prepare(weights(2.0)) is None  # the probe saw the kernel read the weight: nothing ahead
    assert torch.equal(model.a.packed, torch.full((2, 3), 1.0))
