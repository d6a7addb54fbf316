"""The LoRA part of a generation worker's weight-transfer engine (`asyncrl.generation.worker_extension`): turning
LoRA support on, and loading a pushed adapter, merged (`asyncrl.generation.lora_merge`).

`LoraUpdates` is a mixin of `AsyncrlWeightTransferEngine`: it reads the engine's state (`model`, `device`, `pg`,
`lora`, its fast CPU reload) and is called by the engine's update methods when `lora` is set. An adapter update
changes only the adapted linear layers: on the CPU they are merged, loaded and packed in the staging thread while the
engine generates, and the pause installs their packs (`CpuWeightReload.apply_prepared`); what could not be prepared
is loaded and packed in the pause, layer by layer (`CpuWeightReload.load_linear_only`). Nothing else of the model is
touched, so the pause does not grow with the model's embedding or norms.

Invariant: with `lora` set every push must be an adapter, and without it none may be (each refused with a message
naming the fix); a server refuses to join a group whose pushes it cannot load (`lora_mismatch`).
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import torch

from asyncrl.adapters.lora import is_adapter_name
from asyncrl.adapters.safetensors_folder import read_folder_tensors
from asyncrl.generation.cpu_reload import CpuWeightReload
from asyncrl.generation.lora_merge import LoraMerger, cast_like
from asyncrl.weights.sync import receive_weights

__all__ = ["LoraUpdates", "lora_mismatch"]


def lora_mismatch(pushed: float, served: float) -> str:
    if served == 0.0:
        return (f"the trainer pushes LoRA adapters (scale {pushed}) but this server was started without LoRA support; "
                f"start it with --lora-scale {pushed} (the generation role does so from training.lora)")
    if pushed == 0.0:
        return (f"this server serves LoRA adapters (scale {served}) but the trainer pushes full weights; start it "
                f"without --lora-scale, or set training.lora")
    return f"the trainer pushes LoRA adapters of scale {pushed}, this server merges them at scale {served}"


class LoraUpdates:
    """LoRA support of `AsyncrlWeightTransferEngine` (module docstring)."""

    lora: LoraMerger | None
    model: Any
    model_config: Any
    device: torch.device
    pg: Any
    _reload: CpuWeightReload | None
    _capturing: bool

    def enable_lora(self, model_dir: str, scale: float, adapter_file: str | None = None) -> dict[str, Any]:
        """Serve LoRA adapters of scale `scale` merged into the model of `model_dir` (the base it was started from):
        every later push must be an adapter (`asyncrl.generation.lora_merge`). On the CPU the fast update is made
        ready now, by reloading the base from `model_dir` once (the server is not serving yet), so that an adapter
        update packs only the adapted layers. `adapter_file` (a safetensors file of wire-named A and B, a checkpoint's)
        is merged and loaded at once. Returns {capture_s, adapter_s}."""
        t0 = time.monotonic()
        self.lora = LoraMerger(model_dir, scale)
        if self.device.type == "cpu":
            fast = self._fast_reload()
            if fast is None or not fast.ready:
                self._start_capture()
                self._reload.load(read_folder_tensors(Path(model_dir)))  # type: ignore[union-attr]
                self.finish_weight_update()
                fast = self._fast_reload()
                if fast is None or not fast.ready:
                    self.lora = None
                    raise RuntimeError("LoRA on the CPU needs the fast weight update (asyncrl.generation.cpu_reload), "
                                       "which this model cannot use")
        t1 = time.monotonic()
        if adapter_file is not None:
            from safetensors.torch import load_file

            self.start_weight_update()
            self._load_adapter(self._merge(list(load_file(adapter_file).items())))
            self.finish_weight_update()
        return {"capture_s": t1 - t0, "adapter_s": time.monotonic() - t1}

    def _start_capture(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        initialize_layerwise_reload(self.model)
        self._reload = CpuWeightReload(self.model)
        self._reload.start_capture()
        self._capturing = True

    def _merge(self, items: list[tuple[str, torch.Tensor]]) -> list[tuple[str, torch.Tensor]]:
        """An adapter's merged layer weights in the served dtype; RuntimeError when `items` is not an adapter."""
        assert self.lora is not None
        full = [n for n, _ in items if not is_adapter_name(n)]
        if full:
            raise RuntimeError(f"asyncrl weight transfer: this server serves LoRA adapters; the trainer pushed full "
                               f"weights ({full[0]!r}, ...): start it without LoRA support, or set training.lora")
        return cast_like(self.lora.merge(items), self.model_config.dtype)

    def _load_adapter(self, merged: list[tuple[str, torch.Tensor]]) -> None:
        """Load an adapter's merged weights in the pause: into the adapted layers alone (CPU), or in place (GPU)."""
        fast = self._fast_reload()
        if self.device.type == "cpu":
            assert fast is not None and fast.ready
            fast.load_linear_only(merged)
        else:
            self.model.load_weights(merged)

    def _receive_adapter(self, update_info: Any, keep: bool) -> None:
        """`receive_weights` of an adapter push: merged in the staging thread (CPU) or here, then loaded."""
        if update_info.staged:
            staging = self._take_staged(update_info)
            adapter, merged, prepared = staging.adapter or [], staging.buckets[0], staging.prepared
        else:
            arrived: list[tuple[str, torch.Tensor]] = []
            assert self.pg is not None
            manifest = receive_weights(self.pg, self.device, float(update_info.timeout_s), arrived.extend)
            if manifest.version != update_info.version:
                raise RuntimeError(f"asyncrl weight transfer: trainer sent version {manifest.version}, server "
                                   f"expected {update_info.version}")
            adapter, merged, prepared = arrived, self._merge(arrived), None
        fast = self._fast_reload()
        if prepared is not None and fast is not None:
            fast.apply_prepared(prepared)  # the adapted layers merged, loaded and packed ahead of the pause
            if prepared.rest:  # layers that could not be packed ahead (a bias, or kernels reading the weight)
                fast.load_linear_only(prepared.rest)
        else:
            self._load_adapter(merged)
        self.received_version = update_info.version
        self.received = list(adapter) if keep else None
