"""A fast in-place weight update for unquantized vLLM models on the CPU (runs inside vLLM's worker process).

What it owns: the full-size copies ("shadows") of the linear layers' weights that vLLM's CPU path frees, and the
update that loads into them and re-packs each layer.

Why. On the CPU vLLM packs every linear layer's weight for its matrix-product kernel (oneDNN or sgl) once loaded,
and replaces the layer's `weight` with an empty tensor, so a plain `model.load_weights` into a live model has nowhere
to load. vLLM's general answer is its layerwise reload (`initialize_layerwise_reload` ... `finalize_layerwise_reload`):
rebuild every layer's parameters on the meta device, wrap every weight loader to count what arrives, materialise and
process each layer once complete. It is right for any model and quantisation, and for the default job's 330 K
parameter model it took 11-13 ms of the worker's time per update (the weights' copy and re-pack: 2-3 ms), while
generation waits.

How. The first update goes through vLLM's layerwise reload, and `start_capture` / `end_capture` keep, for every linear layer, the
full-size weight Parameter it loaded (with its weight loader and sharding attributes) before the layer's
processing drops it. Every later update (`begin`, `load`, `finish`) puts those Parameters back, loads the buckets
with the model's own `load_weights` (its name mapping and fused-shard loaders, as at start-up), and runs each
layer's `process_weights_after_loading` again: a fresh pack of the new weights, as at start-up.

Where it applies (`eligible`): the CPU, and a model whose every quantisation method is vLLM's unquantized linear or
embedding method (whose processing only packs, and reads nothing it changed before). Anything else keeps the
layerwise reload. The cost is memory: a second copy of the linear weights (the packed one is the first), refused
above `MAX_SHADOW_BYTES`.

Invariant: an update loads exactly the parameters the first one loaded (`finish` raises otherwise: the model may be
half-updated, and the caller then treats the update as failed, as for any error).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable

import torch

log = logging.getLogger(__name__)

MAX_SHADOW_BYTES = 1 << 30  # 1 GiB of extra host memory at most (a ~250 M parameter float32 model's linear layers)


def _unquantized_methods() -> tuple[type, ...]:
    from vllm.model_executor.layers.linear import UnquantizedLinearMethod
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    return UnquantizedLinearMethod, UnquantizedEmbeddingMethod


def processed_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """The modules that have a quantisation method (vLLM processes their weights after loading)."""
    return [(n, m) for n, m in model.named_modules() if getattr(m, "quant_method", None) is not None]


def eligible(model: torch.nn.Module, device: torch.device) -> bool:
    """Whether the fast update may be used for `model` on `device` (see the module docstring)."""
    if device.type != "cpu":
        return False
    methods = _unquantized_methods()
    modules = processed_modules(model)
    return bool(modules) and all(type(m.quant_method) in methods for _, m in modules)


class CpuWeightReload:
    """The shadows of one model and its fast update; `ready` once a layerwise update has been captured."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.shadows: dict[str, torch.nn.Parameter] = {}  # linear module name -> its full-size weight
        self.expected: set[str] | None = None  # the parameter names the captured update loaded
        self.refused = False  # a successful capture could not be used: the layerwise reload stays, not captured again
        self._loaded: set[str] = set()
        self._seen: dict[str, torch.nn.Parameter] = {}
        self._wrapped: list[object] = []  # quantisation methods whose processing is wrapped while capturing
        self._linear_names = self._linear_modules()

    def _linear_modules(self) -> list[str]:
        from vllm.model_executor.layers.linear import UnquantizedLinearMethod

        return [n for n, m in processed_modules(self.model) if type(m.quant_method) is UnquantizedLinearMethod]

    @property
    def ready(self) -> bool:
        return self.expected is not None

    def start_capture(self) -> None:
        """Before a layerwise update: keep each linear layer's loaded weight Parameter when its processing is about to
        drop it, and record what the update loads (`load`). `end_capture` decides whether to use them."""
        modules = dict(self.model.named_modules())
        self._seen, self._wrapped = {}, []
        seen = self._seen

        def keep(name: str, original: Callable[[torch.nn.Module], None]) -> Callable[[torch.nn.Module], None]:
            def process(layer: torch.nn.Module) -> None:
                weight = layer._parameters.get("weight")
                if isinstance(weight, torch.nn.Parameter) and weight.numel() > 0 and not weight.is_meta:
                    seen[name] = weight
                original(layer)
            return process

        for name in self._linear_names:
            qm = modules[name].quant_method
            qm.process_weights_after_loading = keep(name, qm.process_weights_after_loading)  # on this instance only
            self._wrapped.append(qm)
        self._loaded = set()

    def end_capture(self, adopt: bool) -> None:
        """After the layerwise update (`adopt`: it succeeded): `ready` when every linear layer was seen and the shadows
        fit `MAX_SHADOW_BYTES`; otherwise nothing is kept and the layerwise reload stays in use."""
        for qm in self._wrapped:
            del qm.process_weights_after_loading  # the class's method again  # type: ignore[attr-defined]
        seen, self._seen, self._wrapped = self._seen, {}, []
        if not adopt:
            return
        size = sum(p.numel() * p.element_size() for p in seen.values())
        if set(seen) != set(self._linear_names) or size > MAX_SHADOW_BYTES or not self._loaded:
            log.info("fast CPU weight reload not used: %d of %d linear layers captured, %.0f MB (limit %.0f MB)",
                     len(seen), len(self._linear_names), size / 1e6, MAX_SHADOW_BYTES / 1e6)
            self.refused = True
            return
        self.shadows, self.expected = seen, set(self._loaded)
        log.info("fast CPU weight reload ready: %d linear layers, %.1f MB of shadows", len(seen), size / 1e6)

    def begin(self) -> None:
        """Put the full-size weights back into the linear layers (where vLLM left empty ones after packing)."""
        modules = dict(self.model.named_modules())
        for name, shadow in self.shadows.items():
            modules[name]._parameters["weight"] = shadow
        self._loaded = set()

    def load(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint-named tensors with the model's own loader (after `begin`, or while capturing)."""
        loaded = self.model.load_weights(items)
        self._loaded |= set(loaded or ())

    def finish(self) -> None:
        """Pack every processed layer's new weights again; raise when the update did not load what the first did."""
        assert self.expected is not None, "finish() before a captured update"
        for _, module in processed_modules(self.model):
            module.quant_method.process_weights_after_loading(module)
        if self._loaded != self.expected:
            missing, extra = sorted(self.expected - self._loaded), sorted(self._loaded - self.expected)
            raise RuntimeError(f"weight update: expected the parameters the first update loaded; missing {missing[:5]} "
                               f"({len(missing)}), unexpected {extra[:5]} ({len(extra)})")
