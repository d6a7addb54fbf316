"""Code that runs inside vLLM's worker processes: the `asyncrl` weight-transfer engine and a worker extension.

vLLM loads this module in every worker because the engine is started with
`worker_extension_cls="asyncrl.generation.worker_extension.WeightSyncExtension"`; importing it registers
`AsyncrlWeightTransferEngine` under the backend name "asyncrl" in vLLM's `WeightTransferEngineFactory`,
which the worker then instantiates (engine arg `weight_transfer_config={"backend": "asyncrl"}`).

The engine speaks the protocol of `asyncrl.weights.sync` over a standalone gloo (CPU) or NCCL
(GPU) group in which the trainer is rank 0. vLLM drives its lifecycle:
- `init_transfer_engine`: join the trainer's group (blocks until every rank joined, or the deadline);
- `start_weight_update`: `initialize_layerwise_reload(model)` (on CPU a plain `load_weights` into a
  live model leaves it half-updated: linear weights are pre-packed for oneDNN and their originals freed);
- `receive_weights`: receive header and buckets, `model.load_weights` per bucket; on the CPU the buckets are kept
  for a checksum computed only when one is requested (`received_checksum`);
- `finish_weight_update`: `finalize_layerwise_reload`, then re-process layers whose weight is shared with
  another layer (a tied `lm_head` keeps a pre-packed copy of the embedding that would otherwise go stale).
On the CPU, for an unquantized model, only the first update takes that layerwise path; it keeps the linear layers'
full-size weights, and every later update loads into them and re-packs each layer
(`asyncrl.generation.cpu_reload`: 11-13 ms → ~4 ms of paused generation per update on the default job).

On the CPU the broadcast is received before generation pauses (`stage`, `WeightSyncExtension.asyncrl_stage_weights`):
a background thread receives every bucket into staging buffers while the worker goes on running engine steps and,
where the update will take the fast path, loads and packs the linear layers ahead (`CpuWeightReload.prepare`); the
update then applies what was staged (`AsyncrlUpdateInfo.staged`). The thread only reads the group and writes buffers,
shadows and stand-ins that the engine's steps do not read, so the model the engine runs changes only in the pause.

`WeightSyncExtension.asyncrl_update_weights` runs those three steps as one `collective_rpc` (one engine round
trip while generation is paused), and `WeightSyncExtension.asyncrl_checksum` reports the checksum of the
weights currently loaded (see its docstring for what is measured).
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.distributed as dist
from vllm.distributed.weight_transfer.base import (
    WeightTransferEngine,
    WeightTransferInitInfo,
    WeightTransferUpdateInfo,
)
from vllm.distributed.weight_transfer.factory import WeightTransferEngineFactory

from asyncrl.adapters.lora import is_adapter_name
from asyncrl.generation.cpu_reload import CpuWeightReload, Prepared, eligible
from asyncrl.generation.lora_merge import LoraMerger
from asyncrl.generation.lora_worker import LoraUpdates, lora_mismatch
from asyncrl.weights.buckets import weights_checksum
from asyncrl.weights.sync import join_group, local_ip_towards, receive_weights, shutdown_group

log = logging.getLogger(__name__)

BACKEND_NAME = "asyncrl"


@dataclass
class AsyncrlInitInfo(WeightTransferInitInfo):
    master_addr: str
    master_port: int
    rank: int  # rank of this server's first worker in the trainer's group (trainer = 0)
    world_size: int
    backend: str = "gloo"
    timeout_s: float = 300.0
    group_name: str = "asyncrl-weights"
    lora_scale: float = 0.0  # the trainer pushes LoRA adapters of this scale (0: full weights)


@dataclass
class AsyncrlUpdateInfo(WeightTransferUpdateInfo):
    version: int
    timeout_s: float = 300.0
    staged: bool = False  # load what `stage` received for this version, instead of receiving now


@dataclass
class _Staging:
    """One broadcast being received into staging buffers by a background thread (`stage`)."""

    version: int
    done: threading.Event = field(default_factory=threading.Event)
    buckets: list[list[tuple[str, torch.Tensor]]] = field(default_factory=list)
    prepared: Prepared | None = None  # the fast update's part done ahead of the pause (`CpuWeightReload.prepare`)
    error: str | None = None
    seconds: float = 0.0
    prepare_s: float = 0.0
    adapter: list[tuple[str, torch.Tensor]] | None = None  # a LoRA push: the adapter as it arrived (buckets: merged)
    merge_s: float = 0.0


class AsyncrlWeightTransferEngine(LoraUpdates, WeightTransferEngine[AsyncrlInitInfo, AsyncrlUpdateInfo]):
    """Receives weights broadcast by `asyncrl.weights.sync.WeightSender` and loads them in place."""

    init_info_cls = AsyncrlInitInfo
    update_info_cls = AsyncrlUpdateInfo
    supports_draft_weight_update = False

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.pg: dist.ProcessGroup | None = None
        self.store: dist.Store | None = None
        self.timeout_s = 300.0
        self.received: list[tuple[str, torch.Tensor]] | None = None
        self._received_checksum: dict[str, int | float] | None = None
        self.received_version: int | None = None
        self._reload: CpuWeightReload | None = None  # the fast CPU update, once decided eligible
        self._capturing = False  # a layerwise update is being captured for the fast ones
        self.last_update_fast = False  # whether the last update that started took the fast CPU path
        self._staging: _Staging | None = None  # a broadcast received (or being received) ahead of its update
        self.lora: LoraMerger | None = None  # LoRA support (`enable_lora`): every push is then an adapter
        self._adapter_update = False  # the update in progress loads a merged adapter

    def init_transfer_engine(self, init_info: AsyncrlInitInfo) -> None:
        import datetime

        served = self.lora.scale if self.lora is not None else 0.0
        if float(init_info.lora_scale) != served:
            raise RuntimeError(lora_mismatch(float(init_info.lora_scale), served))
        self.shutdown()
        rank = init_info.rank + self.parallel_config.rank
        self.timeout_s = float(init_info.timeout_s)
        self.store = dist.TCPStore(
            init_info.master_addr, int(init_info.master_port), init_info.world_size, is_master=False,
            timeout=datetime.timedelta(seconds=self.timeout_s),
        )
        self.pg = join_group(
            store=self.store, rank=rank, world_size=init_info.world_size, backend=init_info.backend,
            timeout_s=self.timeout_s, group_name=init_info.group_name,
            local_addr=local_ip_towards(init_info.master_addr),
        )
        log.info("asyncrl weight transfer: joined group %s as rank %d/%d", init_info.group_name, rank, init_info.world_size)

    def _fast_reload(self) -> CpuWeightReload | None:
        """The model's fast CPU update (`asyncrl.generation.cpu_reload`), or None where it does not apply."""
        if self._reload is None or self._reload.model is not self.model:
            self._reload = CpuWeightReload(self.model) if eligible(self.model, self.device) else None
        return None if self._reload is None or self._reload.refused else self._reload

    def start_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import initialize_layerwise_reload

        fast = self._fast_reload()
        if self._capturing and self._reload is not None:  # the update it captured failed before its finish
            self._reload.end_capture(adopt=False)
        self._capturing = False
        if self.lora is not None:  # an adapter: only the adapted layers change, loaded in `receive_weights`
            self._adapter_update = True
            self.last_update_fast = fast is not None and fast.ready
            return
        self.last_update_fast = fast is not None and fast.ready
        if fast is not None and fast.ready:
            fast.begin()
            return
        initialize_layerwise_reload(self.model)
        if fast is not None:  # this layerwise update also keeps what the fast ones need
            fast.start_capture()
            self._capturing = True

    def update_weights(self, update_info: dict[str, Any]) -> None:
        # The base class calls torch.accelerator.synchronize(), which raises on CPU-only torch.
        self.receive_weights(self.parse_update_info(update_info))
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)

    def receive_weights(self, update_info: AsyncrlUpdateInfo) -> None:
        if self.pg is None:
            raise RuntimeError("asyncrl weight transfer: not initialised (POST /weights/init first)")
        received: list[tuple[str, torch.Tensor]] = []
        keep = self.device.type == "cpu"  # see `received_checksum`

        fast = self._reload if self._capturing or self.last_update_fast else None

        def load(items: list[tuple[str, torch.Tensor]]) -> None:
            if fast is not None:
                fast.load(items)
            else:
                self.model.load_weights(items)
            if keep:
                received.extend(items)

        self.received, self._received_checksum, self.received_version = None, None, None
        if self._adapter_update:
            self._receive_adapter(update_info, keep)
            return
        if update_info.staged:
            staging = self._take_staged(update_info)
            if staging.prepared is not None and fast is not None and self.last_update_fast:
                fast.apply_prepared(staging.prepared)  # linear layers loaded and packed ahead of the pause
                fast.load(staging.prepared.rest)
                if keep:
                    received.extend(item for items in staging.buckets for item in items)
            else:
                for items in staging.buckets:
                    load(items)
        else:
            manifest = receive_weights(self.pg, self.device, float(update_info.timeout_s), load)
            if manifest.version != update_info.version:
                raise RuntimeError(f"asyncrl weight transfer: trainer sent version {manifest.version}, server "
                                   f"expected {update_info.version}")
        self.received_version = update_info.version
        self.received = received if keep else None

    # ---- receiving ahead of the update (CPU) -------------------------------------------------------------------
    def stage(self, update_info: AsyncrlUpdateInfo) -> None:
        """Start receiving the broadcast of `update_info.version` into staging buffers in a background thread, and
        return at once: the model is not touched, so the engine goes on generating meanwhile. An update with
        `staged=True` then loads what arrived (`receive_weights`). The buckets are the buffers the update would have
        received into anyway (on the CPU they are kept for `received_checksum`), so staging costs no extra memory."""
        if self.pg is None:
            raise RuntimeError("asyncrl weight transfer: not initialised (POST /weights/init first)")
        if self._staging is not None and not self._staging.done.is_set():
            raise RuntimeError(f"asyncrl weight transfer: the staged receive of version {self._staging.version} is "
                               "still running")
        staging = self._staging = _Staging(int(update_info.version))
        pg, device, timeout_s = self.pg, self.device, float(update_info.timeout_s)
        fast = self._fast_reload()
        fast = fast if fast is not None and fast.ready and not self._capturing else None  # the update will be fast
        lora = self.lora is not None

        def run() -> None:
            t0 = time.monotonic()
            try:
                manifest = receive_weights(pg, device, timeout_s, staging.buckets.append)
                if manifest.version != staging.version:
                    raise RuntimeError(f"trainer sent version {manifest.version}, server expected {staging.version}")
                staging.seconds = time.monotonic() - t0
                arrived = [item for items in staging.buckets for item in items]
                if lora:
                    staging.adapter, staging.buckets = arrived, [self._merge(arrived)]
                    staging.merge_s = time.monotonic() - t0 - staging.seconds
                elif any(is_adapter_name(n) for n, _ in arrived):
                    raise RuntimeError("the trainer pushed a LoRA adapter to a server started without LoRA support "
                                       "(start it with --lora-scale, as the generation role does with training.lora)")
                if fast is not None:
                    try:
                        staging.prepared = fast.prepare([item for items in staging.buckets for item in items])
                        staging.prepare_s = time.monotonic() - t0 - staging.seconds - staging.merge_s
                    except Exception:  # an optimisation only: the update then loads and packs in the pause
                        log.exception("asyncrl weight transfer: preparing version %d ahead of the pause failed",
                                      staging.version)
            except BaseException as e:  # noqa: BLE001 - reported by stage_status and by the update that applies it
                staging.error = f"{type(e).__name__}: {e}"
                staging.buckets, staging.prepared = [], None
                staging.seconds = time.monotonic() - t0
            finally:
                staging.done.set()

        threading.Thread(target=run, name=f"asyncrl-stage-v{staging.version}", daemon=True).start()

    def stage_status(self) -> dict[str, Any]:
        """{version, done, error, seconds, prepare_s, prepared} of the latest staged receive (version None: none
        started): `seconds` the receive, `prepare_s` the fast update's preparation after it, `prepared` the linear
        layers it prepared."""
        st = self._staging
        if st is None:
            return {"version": None, "done": False, "error": None, "seconds": 0.0, "prepare_s": 0.0, "prepared": 0,
                    "merge_s": 0.0}
        return {"version": st.version, "done": st.done.is_set(), "error": st.error, "seconds": st.seconds,
                "prepare_s": st.prepare_s, "prepared": len(st.prepared.stand_ins) if st.prepared else 0,
                "merge_s": st.merge_s}

    def _take_staged(self, update_info: AsyncrlUpdateInfo) -> _Staging:
        """The staged receive of `update_info.version` (waiting up to its deadline for it to end); raises when there
        is none, it is of another version, or it failed. It is taken: staged once, applied once."""
        st, self._staging = self._staging, None
        if st is None or st.version != update_info.version:
            raise RuntimeError(f"asyncrl weight transfer: no staged weights of version {update_info.version} "
                               f"(staged: {None if st is None else st.version})")
        if not st.done.wait(float(update_info.timeout_s)):
            raise RuntimeError(f"asyncrl weight transfer: the staged receive of version {st.version} did not end "
                               f"within {update_info.timeout_s} s")
        if st.error is not None:
            raise RuntimeError(f"asyncrl weight transfer: the staged receive of version {st.version} failed: "
                               f"{st.error}")
        return st

    def received_checksum(self) -> dict[str, int | float] | None:
        """The checksum of the tensors the last update loaded, as they arrived; None before the first update, and
        on a GPU.

        Computed on request (the launcher asks once, at the end of a run), never inside an update. On the CPU the
        update keeps the received buckets (views, no copy; the model's own copies of the linear weights are
        re-packed for oneDNN and no longer readable). On a GPU it keeps nothing: the buckets would hold a second
        copy of the model in device memory, and the model's own parameters cover every weight there.
        """
        if self._received_checksum is None and self.received is not None:
            self._received_checksum = weights_checksum(self.received)
        return self._received_checksum

    def finish_weight_update(self) -> None:
        from vllm.model_executor.model_loader.reload import finalize_layerwise_reload

        if self._adapter_update:  # the adapted layers were packed as they loaded
            self._adapter_update = False
            return
        capturing, self._capturing = self._capturing, False
        if not capturing and self._reload is not None and self._reload.ready:
            self._reload.finish()
            return
        adopt = False
        try:
            finalize_layerwise_reload(self.model, self.model_config)
            reprocess_shared_weight_layers(self.model)
            adopt = True
        finally:
            if capturing and self._reload is not None:
                self._reload.end_capture(adopt)

    def shutdown(self) -> None:
        pg, self.pg = self.pg, None
        shutdown_group(pg)  # a staged receive still running on it fails now
        self.store = None
        self._staging = None


def reprocess_shared_weight_layers(model: torch.nn.Module) -> list[str]:
    """Re-run `process_weights_after_loading` on every layer whose `weight` Parameter is shared (tied)."""
    owners: dict[int, list[tuple[str, torch.nn.Module]]] = {}
    for name, module in model.named_modules():
        w = module._parameters.get("weight") if hasattr(module, "_parameters") else None
        if isinstance(w, torch.Tensor) and getattr(module, "quant_method", None) is not None:
            owners.setdefault(id(w), []).append((name, module))
    done = []
    for layers in owners.values():
        if len(layers) > 1:
            for name, module in layers:
                module.quant_method.process_weights_after_loading(module)
                done.append(name)
    return done


if BACKEND_NAME not in WeightTransferEngineFactory._registry:
    WeightTransferEngineFactory.register_engine(BACKEND_NAME, AsyncrlWeightTransferEngine)


class WeightSyncExtension:
    """Mixed into vLLM's worker class (`worker_extension_cls`); methods are reached via `collective_rpc`."""

    def asyncrl_update_weights(self, update_info: dict[str, Any]) -> dict[str, float]:
        """vLLM's weight-update session (`start_weight_update`, `update_weights`, `finish_weight_update`, the
        worker's own methods, with their checks and clean-up on failure) in one call: one engine round trip,
        not three, while generation is paused. Returns the seconds each step took, and `fast_reload` 1.0 where the
        update took the fast CPU path (`asyncrl.generation.cpu_reload`), else 0.0."""
        t0 = time.monotonic()
        self.start_weight_update()  # type: ignore[attr-defined]
        t1 = time.monotonic()
        self.update_weights(update_info)  # type: ignore[attr-defined]
        t2 = time.monotonic()
        self.finish_weight_update()  # type: ignore[attr-defined]
        engine = getattr(self, "weight_transfer_engine", None)
        fast = float(getattr(engine, "last_update_fast", False))
        return {"start_s": t1 - t0, "receive_s": t2 - t1, "finish_s": time.monotonic() - t2, "fast_reload": fast}

    def asyncrl_stage_weights(self, update_info: dict[str, Any]) -> dict[str, float]:
        """Start receiving the next broadcast in the background (`AsyncrlWeightTransferEngine.stage`) and return at
        once, generation going on; `staged` 0.0 where this worker does not stage (a GPU: the broadcast is fast
        there, and staging would hold a second copy of the weights in device memory) and receives in the update."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, AsyncrlWeightTransferEngine) or engine.device.type != "cpu":
            return {"staged": 0.0}
        engine.stage(engine.parse_update_info(update_info))
        return {"staged": 1.0}

    def asyncrl_enable_lora(self, model_dir: str, scale: float, adapter_file: str | None = None) -> dict[str, float]:
        """Serve LoRA adapters from now on (`AsyncrlWeightTransferEngine.enable_lora`); before the server serves."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, AsyncrlWeightTransferEngine):
            raise RuntimeError("asyncrl weight transfer: not configured in this worker")
        return engine.enable_lora(model_dir, scale, adapter_file)

    def asyncrl_stage_status(self) -> dict[str, Any]:
        """The staged receive's {version, done, error, seconds} (`AsyncrlWeightTransferEngine.stage_status`)."""
        engine = getattr(self, "weight_transfer_engine", None)
        if not isinstance(engine, AsyncrlWeightTransferEngine):
            raise RuntimeError("asyncrl weight transfer: not configured in this worker")
        return engine.stage_status()

    def asyncrl_checksum(self) -> dict[str, Any]:
        """Checksum of the weights in this worker.

        `model`: `weights_checksum` over the model's own parameters (fused names, tied weights once);
        parameters that vLLM emptied after pre-packing them for its CPU kernels (numel 0) are skipped and
        counted in `emptied`, so `model` covers every weight only where `emptied` is 0 (GPUs).
        `received`: the checksum of the tensors the last update loaded, as they arrived in this process,
        with that update's `version` (None before the first update).
        """
        engine = getattr(self, "weight_transfer_engine", None)
        received = engine.received_checksum() if isinstance(engine, AsyncrlWeightTransferEngine) else None
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        params = list(model.named_parameters(remove_duplicate=True))
        return {
            "model": weights_checksum(params),
            "emptied": sorted(n for n, p in params if p.numel() == 0),
            "received": received,
            "version": getattr(engine, "received_version", None),
        }
