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

Ahead of the pause (`prepare`, from the worker's staging thread while the engine generates): the received tensors
that load only into linear weights whose kernel holds its own packed copy (checked once by `_packs_own_copy`) and
that have no bias are loaded into the shadows, and each such layer is processed on a stand-in (a shallow copy of the
module holding the shadow), so its new pack is built without touching what the engine runs. The live layers do not
read their `weight` (their kernel has its copy), so the shadows may sit in them meanwhile. The pause then only
installs the stand-ins' packs (`apply_prepared`), loads the rest (embeddings, norms, biases) and processes the other
modules (`finish`). Which linear weights a checkpoint tensor loads into is learnt from the captured update, loading
one tensor at a time (`routes`).

Invariant: an update loads exactly the parameters the first one loaded (`finish` raises otherwise: the model may be
half-updated, and the caller then treats the update as failed, as for any error).
"""

from __future__ import annotations

import copy
import logging
from collections.abc import Callable, Iterable
from dataclasses import dataclass

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


@dataclass
class Prepared:
    """An update loaded and packed ahead of its pause (`CpuWeightReload.prepare`)."""

    stand_ins: dict[str, torch.nn.Module]  # linear module name -> its stand-in, processed with the new weight
    rest: list[tuple[str, torch.Tensor]]  # the tensors left for the pause (they load into what the engine reads)
    loaded: set[str]  # the parameter names the prepared tensors loaded


def _stand_in(module: torch.nn.Module, weight: torch.nn.Parameter) -> torch.nn.Module:
    """A shallow copy of `module` with its own attribute and parameter dicts, holding `weight`: its processing sets
    the copy's attributes (its kernel, its emptied weight), never the module's."""
    stand = copy.copy(module)
    stand.__dict__ = dict(module.__dict__)
    stand._parameters = dict(module._parameters)
    stand._parameters["weight"] = weight
    return stand


def _install(module: torch.nn.Module, stand: torch.nn.Module) -> None:
    """Make `module` what its processed stand-in became: every attribute and parameter the processing replaced."""
    for key, value in stand.__dict__.items():
        if key not in ("_parameters", "_buffers", "_modules") and module.__dict__.get(key) is not value:
            module.__dict__[key] = value
    for key, param in stand._parameters.items():
        if module._parameters.get(key) is not param:
            module._parameters[key] = param


class CpuWeightReload:
    """The shadows of one model and its fast update; `ready` once a layerwise update has been captured."""

    def __init__(self, model: torch.nn.Module) -> None:
        self.model = model
        self.shadows: dict[str, torch.nn.Parameter] = {}  # linear module name -> its full-size weight
        self.expected: set[str] | None = None  # the parameter names the captured update loaded
        self.refused = False  # a successful capture could not be used: the layerwise reload stays, not captured again
        self.routes: dict[str, frozenset[str]] = {}  # checkpoint tensor name -> the parameter names it loads into
        self._recording: dict[str, frozenset[str]] | None = None  # routes being learnt (while capturing)
        self._own_copy: bool | None = None  # whether the packed kernels hold their own copy (`_packs_own_copy`)
        self._installed: set[str] = set()  # linear modules whose prepared pack this update installed
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
        self._recording = {}

    def end_capture(self, adopt: bool) -> None:
        """After the layerwise update (`adopt`: it succeeded): `ready` when every linear layer was seen and the shadows
        fit `MAX_SHADOW_BYTES`; otherwise nothing is kept and the layerwise reload stays in use."""
        for qm in self._wrapped:
            del qm.process_weights_after_loading  # the class's method again  # type: ignore[attr-defined]
        seen, self._seen, self._wrapped = self._seen, {}, []
        routes, self._recording = self._recording or {}, None
        if not adopt:
            return
        size = sum(p.numel() * p.element_size() for p in seen.values())
        if set(seen) != set(self._linear_names) or size > MAX_SHADOW_BYTES or not self._loaded:
            log.info("fast CPU weight reload not used: %d of %d linear layers captured, %.0f MB (limit %.0f MB)",
                     len(seen), len(self._linear_names), size / 1e6, MAX_SHADOW_BYTES / 1e6)
            self.refused = True
            return
        self.shadows, self.expected, self.routes = seen, set(self._loaded), routes
        log.info("fast CPU weight reload ready: %d linear layers, %.1f MB of shadows", len(seen), size / 1e6)

    def begin(self) -> None:
        """Put the full-size weights back into the linear layers (where vLLM left empty ones after packing)."""
        modules = dict(self.model.named_modules())
        for name, shadow in self.shadows.items():
            modules[name]._parameters["weight"] = shadow
        self._loaded = set()
        self._installed = set()

    def load(self, items: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load checkpoint-named tensors with the model's own loader (after `begin`, or while capturing: then one at a
        time, to learn which parameters each loads into)."""
        if self._recording is None:
            self._loaded |= set(self.model.load_weights(items) or ())
            return
        for name, tensor in items:
            loaded = set(self.model.load_weights([(name, tensor)]) or ())
            self._recording[name] = self._recording.get(name, frozenset()) | frozenset(loaded)
            self._loaded |= loaded

    # ---- ahead of the pause ---------------------------------------------------------------------------------------
    def _background_layers(self) -> set[str]:
        """The linear layers whose update may be loaded and packed while the engine runs: packed (their `weight` is
        the emptied placeholder, so the engine does not read it), without a bias, with kernels that own their copy."""
        modules = dict(self.model.named_modules())
        layers = {n for n in self.shadows if modules[n]._parameters.get("weight") is not None
                  and modules[n]._parameters["weight"].numel() == 0 and getattr(modules[n], "bias", None) is None}
        if layers and self._own_copy is None:
            self._own_copy = self._packs_own_copy(modules[min(layers)], self.shadows[min(layers)])
        return layers if self._own_copy else set()

    @staticmethod
    def _packs_own_copy(module: torch.nn.Module, shadow: torch.nn.Parameter) -> bool:
        """Whether the packed kernel of `module` holds a copy of the weight it was built from: one built on a stand-in
        from a scratch copy must give the same product after the scratch changes."""
        scratch = torch.nn.Parameter(shadow.detach().clone(), requires_grad=False)
        stand = _stand_in(module, scratch)
        module.quant_method.process_weights_after_loading(stand)
        x = torch.randn(2, scratch.shape[1], dtype=scratch.dtype)
        with torch.no_grad():
            before = module.quant_method.apply(stand, x).clone()
            scratch.data.mul_(2.0).add_(1.0)
            after = module.quant_method.apply(stand, x)
        own = bool(torch.equal(before, after))
        log.info("fast CPU weight reload: packed kernels %s their weights: packing %s ahead of the pause", "copy" if own
                 else "read", "goes" if own else "does not go")
        return own

    def prepare(self, items: list[tuple[str, torch.Tensor]]) -> Prepared | None:
        """Load the tensors of `items` that go only into `_background_layers` into their shadows and process each such
        layer on a stand-in (see the module docstring), while the engine runs; None where nothing can be prepared."""
        if self.expected is None or not self.routes:
            return None
        layers = self._background_layers()
        targets = {f"{n}.weight" for n in layers}
        ahead = [(n, t) for n, t in items if self.routes.get(n) and self.routes[n] <= targets]
        if not ahead:
            return None
        names = {n for n, _ in ahead}
        modules = dict(self.model.named_modules())
        placeholders = {n: modules[n]._parameters["weight"] for n in layers}
        try:
            for n in layers:  # the loader finds the shadows; the engine's kernels do not read them
                modules[n]._parameters["weight"] = self.shadows[n]
            loaded = set(self.model.load_weights(ahead) or ())
        finally:
            for n, placeholder in placeholders.items():
                modules[n]._parameters["weight"] = placeholder
        stand_ins = {}
        for n in sorted(n for n in layers if f"{n}.weight" in loaded):  # the layers this update loaded into
            stand = _stand_in(modules[n], self.shadows[n])
            modules[n].quant_method.process_weights_after_loading(stand)
            stand_ins[n] = stand
        return Prepared(stand_ins, [(n, t) for n, t in items if n not in names], loaded)

    def load_linear_only(self, items: list[tuple[str, torch.Tensor]]) -> set[str]:
        """In the pause, without `begin`: load `items` (tensors that load only into linear layers, a LoRA update's
        merged weights) into those layers' shadows and pack only those layers again; the other modules are left as
        they are. Returns the linear layers updated; ValueError when a tensor loads into anything else."""
        assert self.expected is not None, "load_linear_only() before a captured update"
        layers: set[str] = set()
        for name, _ in items:
            params = self.routes.get(name)
            if not params or not all(p.endswith(".weight") and p.removesuffix(".weight") in self.shadows
                                     for p in params):
                raise ValueError(f"weight update: {name!r} does not load into linear layers alone "
                                 f"(it loads into {sorted(params or [])})")
            layers |= {p.removesuffix(".weight") for p in params}
        modules = dict(self.model.named_modules())
        for n in layers:
            modules[n]._parameters["weight"] = self.shadows[n]
        self.model.load_weights(items)
        for n in sorted(layers):
            modules[n].quant_method.process_weights_after_loading(modules[n])
        return layers

    def apply_prepared(self, prepared: Prepared) -> None:
        """In the pause, after `begin`: install the prepared packs (the rest is `load`ed, then `finish`)."""
        modules = dict(self.model.named_modules())
        for n, stand in prepared.stand_ins.items():
            _install(modules[n], stand)
        self._installed = set(prepared.stand_ins)
        self._loaded |= prepared.loaded

    def finish(self) -> None:
        """Pack every processed layer's new weights again (but those `apply_prepared` installed); raise when the update
        did not load what the first did."""
        assert self.expected is not None, "finish() before a captured update"
        for name, module in processed_modules(self.model):
            if name not in self._installed:
                module.quant_method.process_weights_after_loading(module)
        self._installed = set()
        if self._loaded != self.expected:
            missing, extra = sorted(self.expected - self._loaded), sorted(self._loaded - self.expected)
            raise RuntimeError(f"weight update: expected the parameters the first update loaded; missing {missing[:5]} "
                               f"({len(missing)}), unexpected {extra[:5]} ({len(extra)})")
