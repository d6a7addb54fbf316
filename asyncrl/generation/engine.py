"""The generation engine: a thin wrapper around vLLM's `AsyncLLM` (token ids in, token ids out).

Owns: starting/stopping vLLM, one request's life (`generate`, `abort`), the load figures and cumulative
activity counters of `/health` (`ActivityCounters`), and the weight-update sequence (pause keep, clearing the
prefix cache → receive and load → new version → resume).

Invariants:
- `version` is the policy version of the weights serving new tokens; vLLM labels each output token with
  the version set by `update_weight_version`, so a request that spans an update reports per-token versions
  (non-decreasing, each >= its `start_version`);
- one weight update at a time (a lock); generation is paused only while the weights are being replaced (on the CPU
  the broadcast is received before the pause, generation going on);
- a request reuses only prefix-cache KV computed under its own `start_version` (the cache salt), so a new request
  never attends to KV of older weights; requests in flight at an update have their KV recomputed with the new weights
  (`kv_after_update="recompute"`, the default) or keep it (`"keep"`);
- `/generate` returns exactly one log-prob and one version per returned token;
- a request with `min_version` above `version` is held, never started, until an update to at least that version has
  completed (or it is aborted, or `MAX_HOLD_S` passes: 503); its `start_version` is then at least `min_version`.
  So a writer may send the requests of a version it learned from the trainer before the push of that version
  reaches this server (they start the moment generation resumes with it);
- `min_tokens` / `ignore_eos` go to vLLM as is. vLLM's `ignore_eos` ignores only the model's own EOS (with
  `skip_tokenizer_init`: the `eos_token_id` of generation_config.json); ids listed in `stop_token_ids` still
  stop the request. `min_tokens` suppresses both the EOS and `stop_token_ids` until that many tokens exist.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

log = logging.getLogger(__name__)

WORKER_EXTENSION = "asyncrl.generation.worker_extension.WeightSyncExtension"


# A worker RPC waits this much longer than the worker's own deadline (`timeout_s`): when the RPC gave up first,
# the worker's late answer would stay in vLLM's response queue and be read as the answer to the next RPC.
RPC_SLACK_S = 10.0
# How often a weight update asks the workers whether the broadcast they receive in the background has arrived (each
# look is one engine round trip between two engine steps; the pause begins at most this long after the last byte).
STAGE_POLL_S = 0.01


@dataclass
class EngineSettings:
    model: str
    max_model_len: int = 256
    kv_cache_gib: float = 0.25
    max_num_seqs: int = 64
    seed: int = 0
    dtype: str = "float32"
    enforce_eager: bool = True
    work_dir: str | None = None  # VLLM_RPC_BASE_PATH / VLLM_CACHE_ROOT live here when set
    # CPU build: OpenMP threads per worker, not pinned (0: vLLM's auto binding, which pins every engine's worker
    # to the same cores and starves the API process and the other roles on a small machine)
    cpu_threads: int = 1
    # vLLM's processes sleep this long between looks at their shared-memory ring instead of spinning (None: vLLM's
    # own spin); see asyncrl/generation/vllm_plugin.py
    ring_poll_s: float | None = 0.0005
    initial_version: int = 0  # the policy version of the weights in `model` (a restarted server: a checkpoint's)
    tensor_parallel_size: int = 1  # GPUs the engine splits the model across (asyncrl.generation.parallel)
    # a weight update drops the running requests' KV ("recompute": recomputed with the new weights) or keeps it
    kv_after_update: str = "recompute"
    # LoRA support (`asyncrl.generation.lora_merge`): the adapters' scale alpha / rank (0: full-weight pushes), and
    # an adapter file (a checkpoint's) merged before serving
    lora_scale: float = 0.0
    lora_adapter_file: str | None = None


def engine_process_env(settings: EngineSettings) -> dict[str, str]:
    """The environment variables that vLLM's processes (server, engine core, workers: they inherit them) must see
    for `settings`: OpenMP threads, unpinned (CPU build), and the ring poll of `asyncrl.generation.vllm_plugin`."""
    from asyncrl.generation.vllm_plugin import POLL_ENV

    env: dict[str, str] = {}
    if settings.cpu_threads > 0:
        env["VLLM_CPU_OMP_THREADS_BIND"] = "nobind"
        env["OMP_NUM_THREADS"] = str(settings.cpu_threads)
    if settings.ring_poll_s is not None:
        env[POLL_ENV] = repr(float(settings.ring_poll_s))
    return env


def warn_slow_bf16(dtype: str) -> bool:
    """Log a warning (and return True) when `dtype` is bfloat16 on a CPU without bf16 instructions (AVX512-BF16 or
    AMX): vLLM's CPU build then has no bf16 matrix-product kernel and falls back to PyTorch's generic one, measured
    ~50x slower than float32 on an AVX2 EPYC (docs/generation_performance.md)."""
    import torch

    if dtype != "bfloat16" or torch.cuda.is_available():
        return False
    if torch.cpu._is_avx512_bf16_supported() or torch.cpu._is_amx_tile_supported():
        return False
    log.warning("generation.dtype bfloat16 on a CPU without AVX512-BF16 or AMX: vLLM has no bf16 matrix kernel here "
                "and decodes far slower than in float32; use float32 on this machine")
    return True


@dataclass
class GenerateParams:
    request_id: str
    prompt_token_ids: list[int]
    max_tokens: int
    temperature: float = 1.0
    top_p: float = 1.0
    seed: int | None = None
    stop_token_ids: list[int] = field(default_factory=list)
    min_tokens: int = 0
    ignore_eos: bool = False
    min_version: int = 0  # held until the weights are at least this version (see the module docstring)


MAX_HOLD_S = 600.0  # the longest a request waits for its `min_version` (then 503: send it elsewhere)


class EngineUnavailable(RuntimeError):
    """The engine cannot serve (a weight update failed half-way); retry after a successful update."""


class RequestConflict(ValueError):
    """A request id that is already in flight."""


@dataclass
class _InFlight:
    max_tokens: int
    held: bool = False  # waiting for its min_version (vLLM has not seen it)
    aborted: bool = False  # aborted while held


def _sampled_logprobs(flat: Any, token_ids: list[int]) -> list[float]:
    """The sampled tokens' log-probs from vLLM's flat log-probs (`SamplingParams(logprobs=0, flat_logprobs=True)`:
    one entry per position, the sampled token's), checked against `token_ids`."""
    if flat is None:
        return []
    if list(flat.token_ids) != token_ids:
        raise RuntimeError(f"vLLM's log-probs are not one per sampled token ({len(flat.token_ids)} entries for "
                           f"{len(token_ids)} tokens)")
    return [float(x) for x in flat.logprobs]


def request_progress(llm: Any) -> dict[str, int] | None:
    """Tokens generated so far per request id in flight, read from vLLM's output processor (requests are sent
    FINAL_ONLY, so no output carries progress before the end); None when this vLLM does not expose it."""
    try:
        states = list(llm.output_processor.request_states.values())
        return {st.external_req_id: st.detokenizer.num_output_tokens() for st in states if st.detokenizer is not None}
    except AttributeError:
        return None


class ActivityCounters:
    """Cumulative activity since start, for rates between two `/health` polls. Pure: time comes from `clock`.

    Invariants: `busy_s` counts each second once however many requests overlap (an interval opens when the
    in-flight count goes 0 → 1 and closes when it goes 1 → 0; the open interval counts up to now), so
    0 <= busy_s <= uptime_s; every request that `begin`s is `end`ed once, as finished (finish_reason "stop"
    or "length") or aborted (anything else: /abort, a failed weight update, an error, a cancelled handler).
    """

    def __init__(self, clock: Callable[[], float] = time.monotonic) -> None:
        self._clock = clock
        self._t0 = clock()
        self._inflight = 0
        self._busy_closed = 0.0
        self._busy_since: float | None = None
        self.tokens_generated = 0
        self.requests_finished = 0
        self.requests_aborted = 0
        self.updates = 0

    def begin(self) -> None:
        if self._inflight == 0:
            self._busy_since = self._clock()
        self._inflight += 1

    def end(self, finished: bool) -> None:
        if self._inflight <= 0:
            raise RuntimeError("ActivityCounters.end without a matching begin")
        self._inflight -= 1
        if finished:
            self.requests_finished += 1
        else:
            self.requests_aborted += 1
        if self._inflight == 0 and self._busy_since is not None:
            self._busy_closed += self._clock() - self._busy_since
            self._busy_since = None

    def snapshot(self) -> dict[str, Any]:
        now = self._clock()
        busy = self._busy_closed + (now - self._busy_since if self._busy_since is not None else 0.0)
        return {
            "uptime_s": now - self._t0,
            "busy_s": busy,
            "tokens_generated": self.tokens_generated,
            "requests_finished": self.requests_finished,
            "requests_aborted": self.requests_aborted,
            "updates": self.updates,
        }


def token_versions_from_spans(spans: list[Any] | None, n: int, default: int) -> list[int]:
    """One version per output token from vLLM's `WeightVersionSpan`s ([start, end) → version string)."""
    out = [default] * n
    for span in spans or []:
        v = int(span.version)
        for i in range(max(0, span.start), min(n, span.end)):
            out[i] = v
    return out


class GenerationEngine:
    """One vLLM `AsyncLLM` plus the bookkeeping the HTTP server needs. Create with `await start(settings)`."""

    def __init__(self, llm: Any, settings: EngineSettings) -> None:
        self.llm = llm
        self.settings = settings
        self.version = 0
        self._inflight: dict[str, _InFlight] = {}
        self._update_lock = asyncio.Lock()
        self._version_changed = asyncio.Condition()  # notified when an update begins and after it (`wait_version`)
        self.updating_to = 0  # the version of the latest update begun (complete or not)
        self._closing = False  # set by `release_waiters`: the server stops, no long poll waits any more
        self.weights_initialised = False
        self.failed: str | None = None  # set when a weight update failed half-way (model unusable)
        self.counters = ActivityCounters()

    @classmethod
    async def start(cls, settings: EngineSettings) -> GenerationEngine:
        if settings.work_dir:
            os.makedirs(settings.work_dir, exist_ok=True)
            os.environ.setdefault("VLLM_RPC_BASE_PATH", os.path.join(settings.work_dir, "rpc"))
            os.environ.setdefault("VLLM_CACHE_ROOT", os.path.join(settings.work_dir, "vllm-cache"))
            os.makedirs(os.environ["VLLM_RPC_BASE_PATH"], exist_ok=True)
        os.environ.update(engine_process_env(settings))
        from vllm.envs import disable_envs_cache, enable_envs_cache

        disable_envs_cache()  # a second engine in this process (tests) reads the environment as it is now
        from vllm.config import WeightTransferConfig
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        import asyncrl.generation.worker_extension  # noqa: F401  (registers the "asyncrl" backend here too)

        args = AsyncEngineArgs(
            model=settings.model,
            skip_tokenizer_init=True,
            dtype=settings.dtype,
            max_model_len=settings.max_model_len,
            max_num_seqs=settings.max_num_seqs,
            tensor_parallel_size=settings.tensor_parallel_size,
            kv_cache_memory_bytes=int(settings.kv_cache_gib * (1 << 30)),
            seed=settings.seed,
            enforce_eager=settings.enforce_eager,
            logprobs_mode="processed_logprobs",
            worker_extension_cls=WORKER_EXTENSION,
            weight_transfer_config=WeightTransferConfig(backend="asyncrl"),
            enable_prefix_caching=True,
            # No chunked prefill: a partly prefilled request with its own seed makes vLLM rewind that request's
            # torch.Generator offset, which a CPU generator refuses ("CPU Generator does not use offset") and the
            # engine dies. Multi-turn contexts and resubmits prefill long prompts, so every prefill runs whole.
            enable_chunked_prefill=False,
            max_num_batched_tokens=max(settings.max_model_len, 2048),
            # vLLM's per-step stats (Prometheus counters, iteration stats) cost the front end ~11% of its CPU and
            # the engine core a little per step; nothing here reads them, and `vllm.LLM` (the raw engine) has
            # them off too. /health carries our own counters.
            disable_log_stats=True,
        )
        warn_slow_bf16(settings.dtype)
        llm = AsyncLLM.from_engine_args(args)
        # vLLM reads its settings from os.environ on every access (a few per request: SamplingParams' checks, request
        # ids), ~7% of the front end's CPU on the default job. Its engine core caches them once started; so does
        # this process, whose environment is final by now.
        enable_envs_cache()
        engine = cls(llm, settings)
        if settings.lora_scale > 0:
            done = await llm.collective_rpc("asyncrl_enable_lora",
                                            args=(settings.model, settings.lora_scale, settings.lora_adapter_file))
            log.info("LoRA support on (scale %g): %s", settings.lora_scale, done)
        await llm.update_weight_version(str(settings.initial_version))
        engine.version = settings.initial_version
        return engine

    @property
    def vocab_size(self) -> int | None:
        """The model's vocabulary size as vLLM sees it (token ids must be below it); None when unknown."""
        try:
            return int(self.llm.model_config.get_vocab_size())
        except (AttributeError, TypeError, ValueError):
            return None

    # ---- requests -------------------------------------------------------------------------------------
    async def generate(self, p: GenerateParams) -> dict[str, Any]:
        # From the defining modules: `from vllm import SamplingParams` goes through vLLM's lazy module `__getattr__`,
        # an `import_module` call on every request (~5% of the front end's CPU).
        from vllm.inputs.engine import tokens_input
        from vllm.sampling_params import RequestOutputKind, SamplingParams

        if self.failed:
            raise EngineUnavailable(self.failed)
        if p.request_id in self._inflight:
            raise RequestConflict(f"request_id: {p.request_id!r} is already in flight")
        if len(p.prompt_token_ids) + p.max_tokens > self.settings.max_model_len:
            raise ValueError(
                f"max_tokens: prompt ({len(p.prompt_token_ids)} tokens) + max_tokens ({p.max_tokens}) exceeds "
                f"max_model_len {self.settings.max_model_len}"
            )
        if not 0 <= p.min_tokens <= p.max_tokens:
            raise ValueError(f"min_tokens: expected 0 <= min_tokens <= max_tokens ({p.max_tokens}), got {p.min_tokens}")
        params = SamplingParams(
            n=1,
            max_tokens=p.max_tokens,
            temperature=p.temperature,
            top_p=p.top_p,
            seed=p.seed,
            stop_token_ids=list(p.stop_token_ids),
            min_tokens=p.min_tokens,
            ignore_eos=p.ignore_eos,
            logprobs=0,
            detokenize=False,
            output_kind=RequestOutputKind.FINAL_ONLY,
            flat_logprobs=True,
            skip_clone=True,  # built for this one request: vLLM's defensive deep copy (~9% of the front end) is moot
        )
        state = _InFlight(max_tokens=p.max_tokens)
        self._inflight[p.request_id] = state
        self.counters.begin()
        token_ids: list[int] = []
        logprobs: list[float] = []
        finish_reason = "abort"
        spans = None
        start_version = self.version
        try:
            if p.min_version > self.version:
                await self._hold(p, state)
                if self.failed:
                    raise EngineUnavailable(self.failed)
            start_version = self.version
            if state.aborted:  # aborted while held: no token, as for an abort before the first one
                return {"request_id": p.request_id, "token_ids": [], "logprobs": [], "token_versions": [],
                        "finish_reason": "abort", "start_version": start_version}
            # FINAL_ONLY: one output per request, when it ends (finished or aborted, with every token so far), not
            # one per engine step; flat log-probs: plain lists, not a {token: Logprob} dict per position. Together
            # ~20% of the front end's CPU on the default job. `health()` reads the progress from vLLM instead.
            # The prefix cache is salted with the weights' version: a request reuses only KV that its own version
            # computed (with kv_after_update "keep" the cache is not cleared at an update)
            prompt = tokens_input(list(p.prompt_token_ids), cache_salt=f"v{start_version}")
            async for out in self.llm.generate(prompt, params, p.request_id):
                comp = out.outputs[0]
                if comp.finish_reason is None:
                    continue
                token_ids = list(comp.token_ids)
                logprobs = _sampled_logprobs(comp.logprobs, token_ids)
                finish_reason = comp.finish_reason
                spans = comp.weight_versions
        finally:
            self._inflight.pop(p.request_id, None)
            self.counters.tokens_generated += len(token_ids)
            self.counters.end(finished=finish_reason in ("stop", "length"))
        if finish_reason == "abort" and self.failed:
            # ended by a weight update that failed half-way, not by its client: its tokens may come from half-loaded
            # weights, so none is returned; 503 tells the client to send the request to another server
            raise EngineUnavailable(f"{self.failed} (request {p.request_id} ended by it)")
        if len(logprobs) != len(token_ids):
            raise RuntimeError(f"vLLM returned {len(logprobs)} logprobs for {len(token_ids)} tokens")
        versions = token_versions_from_spans(spans, len(token_ids), start_version)
        return {
            "request_id": p.request_id,
            "token_ids": token_ids,
            "logprobs": logprobs,
            "token_versions": versions,
            "finish_reason": finish_reason,
            "start_version": start_version,
        }

    async def _hold(self, p: GenerateParams, state: _InFlight) -> None:
        """Wait until the weights are at `p.min_version` or later, the request is aborted, or the server stops;
        EngineUnavailable after `MAX_HOLD_S`."""
        state.held = True
        try:
            async with self._version_changed:
                await asyncio.wait_for(self._version_changed.wait_for(
                    lambda: self.version >= p.min_version or state.aborted or self._closing), MAX_HOLD_S)
        except TimeoutError:
            raise EngineUnavailable(f"min_version: weights version {p.min_version} not reached within "
                                    f"{MAX_HOLD_S:g} s (at {self.version}); send the request elsewhere") from None
        finally:
            state.held = False
        if self._closing and not state.aborted and self.version < p.min_version:
            raise EngineUnavailable(f"the server is stopping; weights version {p.min_version} never arrived")

    async def _release_held(self, request_ids: list[str]) -> list[str]:
        """Mark those of `request_ids` still held for their min_version aborted, and wake them; the rest."""
        held = [r for r in request_ids if (s := self._inflight.get(r)) is not None and s.held and not s.aborted]
        if held:
            for r in held:
                self._inflight[r].aborted = True
            async with self._version_changed:
                self._version_changed.notify_all()
        return [r for r in request_ids if r not in held]

    async def abort(self, request_id: str) -> bool:
        """Abort a request in flight (its /generate returns finish_reason "abort"); False if unknown."""
        if request_id not in self._inflight:
            return False
        if await self._release_held([request_id]):
            await self.llm.abort(request_id)
        return True

    async def abort_many(self, request_ids: list[str]) -> list[str]:
        """Abort those of `request_ids` in flight, in one engine call; returns them."""
        known = [r for r in request_ids if r in self._inflight]
        running = await self._release_held(known)
        if running:
            await self.llm.abort(running)
        return known

    @property
    def dead(self) -> bool:
        """The engine core is gone (it raised, or its process died): every request would fail from now on."""
        return self.llm is None or bool(self.llm.errored)

    def health(self) -> dict[str, Any]:
        """`running`: requests producing tokens; `waiting`: admitted, no token yet; `load`: tokens still owed (the
        progress read from vLLM's output processor; where it is not exposed every request counts as waiting, owing
        its `max_tokens`);
        plus the cumulative `ActivityCounters` fields (uptime_s, busy_s, tokens_generated, requests_finished,
        requests_aborted, updates)."""
        progress = request_progress(self.llm) or {}
        done = {rid: progress.get(rid, 0) for rid in self._inflight}
        running = sum(1 for n in done.values() if n > 0)
        waiting = len(self._inflight) - running
        load = sum(max(0, s.max_tokens - done[rid]) for rid, s in self._inflight.items())
        if self.dead:
            status = "dead"
        elif self.failed:
            status = "failed"
        else:
            status = "updating" if self._update_lock.locked() else "ok"
        return {"status": status, "version": self.version, "running": running, "waiting": waiting, "load": load,
                "lora_scale": self.settings.lora_scale, **self.counters.snapshot()}

    # ---- weights --------------------------------------------------------------------------------------
    async def init_weight_sync(self, info: dict[str, Any], timeout_s: float) -> None:
        """Every worker joins the trainer's group (the trainer must join concurrently)."""
        async with self._update_lock:
            await asyncio.wait_for(
                self.llm.collective_rpc("init_weight_transfer_engine", timeout=timeout_s + RPC_SLACK_S,
                                        kwargs={"init_info": info}),
                timeout=timeout_s + 2 * RPC_SLACK_S,
            )
            self.weights_initialised = True

    async def update_weights(self, version: int, timeout_s: float) -> dict[str, Any]:
        """Receive the broadcast while generating (CPU workers), pause (keep), load it in place, set the version,
        resume.

        First, not paused: `asyncrl_stage_weights` starts every CPU worker receiving the broadcast into staging
        buffers in a background thread, and the workers are asked every `STAGE_POLL_S` whether it has all arrived
        (`_stage_weights`). A receive that fails leaves the model as it was: the update fails (the trainer re-forms
        its group and pushes again) but the server goes on serving its current version. Workers that do not stage
        (GPUs) receive during the pause instead. Then generation is paused for three engine round trips, each
        answered between two engine steps:
        - pause: `pause_scheduler_async(mode="keep", clear_cache=True)` on the engine core. Requests in flight are
          frozen, and the prefix cache is reset with `reset_running_requests`, so their KV is recomputed with the new
          weights after the resume (no engine step runs while paused, so nothing is cached in between). With
          `kv_after_update="keep"` nothing is cleared: running requests go on with their KV (computed by the old
          weights), and the version salt of the prefix cache (`generate`) keeps later requests off the old blocks.
          `AsyncLLM.pause_generation` would add a fixed 20 ms sleep, only to order the front end's last outputs
          before its return. The token versions are attached in the engine core, so that order does not matter here.
        - `asyncrl_update_weights` in every worker: vLLM's own start → load (the staged buckets, or the broadcast
          received now) → finish session in one call;
        - the new version label, then resume.
        Returns `seconds`, how long generation was paused (from the pause request to the resume), and `phases`: the
        seconds each part took (`receive_s` the staged receive, generation going on, and with it the fast update's
        preparation, `worker0_prepare_s` for `worker0_prepared_layers` linear layers; `pause_s` the wait for the
        engine step in flight; `load_s`; `total_s` the whole update; `worker0_*` the first worker's own steps,
        `worker0_fast_reload` 1.0 where its update took the fast CPU path, `asyncrl.generation.cpu_reload`;
        `staged` 1.0 where the workers received before the pause).
        """
        if not self.weights_initialised:
            raise RuntimeError("weights: not initialised (POST /weights/init first)")
        if version < self.version:  # the same version again is allowed: a re-formed group re-sends the last push
            raise ValueError(f"version: expected >= current version {self.version}, got {version}")
        async with self._update_lock:
            clock = asyncio.get_running_loop().time
            t0 = clock()
            phases: dict[str, float] = {}
            async with self._version_changed:  # the version long polls answer now: a push of `version` has begun
                self.updating_to = max(self.updating_to, version)
                self._version_changed.notify_all()
            staged = await self._stage_weights(version, timeout_s, phases)
            phases["staged"] = float(staged)
            t_pause = clock()
            recompute = self.settings.kv_after_update == "recompute"
            await self.llm.engine_core.pause_scheduler_async(mode="keep", clear_cache=recompute)
            phases["pause_s"] = clock() - t_pause
            try:
                slack = timeout_s + RPC_SLACK_S
                info = {"version": version, "timeout_s": timeout_s, "staged": staged}
                per_worker = await asyncio.wait_for(
                    self.llm.collective_rpc("asyncrl_update_weights", timeout=slack, kwargs={"update_info": info}),
                    timeout=slack + RPC_SLACK_S,
                )
                phases["load_s"] = clock() - t_pause - phases["pause_s"]
                phases.update({f"worker0_{k}": float(v) for k, v in per_worker[0].items()})
                await self.llm.update_weight_version(str(version))
            except BaseException as e:
                # The model may be half-loaded: never decode with it. End every request in flight (they
                # return finish_reason "abort"), stay paused, and report "failed" until an update succeeds.
                self.failed = f"weight update to version {version} failed: {type(e).__name__}: {e}"
                log.error("weights: %s", self.failed)
                if self._inflight:
                    await self.llm.abort(list(self._inflight))
                raise
            self.version = version
            self.failed = None
            self.counters.updates += 1
            await self.llm.resume_generation()
            seconds = clock() - t_pause
            phases["total_s"] = clock() - t0
        async with self._version_changed:
            self._version_changed.notify_all()
        log.info("weights: now at version %d (%.3f s received while generating, %.3f s paused, %.3f s loading)",
                 version, phases.get("receive_s", 0.0), seconds, phases["load_s"])
        return {"version": version, "seconds": seconds, "phases": phases}

    async def _stage_weights(self, version: int, timeout_s: float, phases: dict[str, float]) -> bool:
        """Every worker receives the broadcast of `version` into staging buffers while generation goes on; True once
        all of it has arrived, False where the workers do not stage (they receive during the pause). Raises, the
        model untouched, when a worker's receive fails or the deadline passes."""
        clock = asyncio.get_running_loop().time
        t0 = clock()
        info = {"version": version, "timeout_s": timeout_s}
        # Each call is answered between two engine steps, and one step (a long prefill on a CPU) may take seconds:
        # the calls wait as long as the update may, never less (a late answer would be read by the next call)
        rpc_s = timeout_s + RPC_SLACK_S
        replies = list(await asyncio.wait_for(
            self.llm.collective_rpc("asyncrl_stage_weights", timeout=rpc_s, kwargs={"update_info": info}),
            timeout=rpc_s + RPC_SLACK_S))
        staging = [bool(r["staged"]) for r in replies]
        if not any(staging):
            return False
        if not all(staging):
            raise RuntimeError(f"weights: some workers of this engine stage the broadcast and some do not ({staging})")
        deadline = t0 + timeout_s + RPC_SLACK_S
        while True:
            status = list(await asyncio.wait_for(
                self.llm.collective_rpc("asyncrl_stage_status", timeout=rpc_s), timeout=rpc_s + RPC_SLACK_S))
            errors = [s["error"] for s in status if s["error"]]
            if errors:
                raise RuntimeError(f"weights: receiving version {version} failed (the model is unchanged): {errors[0]}")
            if all(s["done"] and s["version"] == version for s in status):
                break
            if clock() > deadline:
                raise TimeoutError(f"weights: version {version} not received within {timeout_s:g} s (the model is "
                                   "unchanged)")
            await asyncio.sleep(STAGE_POLL_S)
        phases["receive_s"] = clock() - t0
        phases["worker0_stage_s"] = float(status[0]["seconds"])
        phases["worker0_prepare_s"] = float(status[0].get("prepare_s", 0.0))
        phases["worker0_prepared_layers"] = float(status[0].get("prepared", 0))
        return True

    async def wait_version(self, after: int, timeout_s: float) -> dict[str, int]:
        """`{version, updating_to}` as soon as either is above `after` (an update to a newer version has begun, or
        generation has resumed with it), else after `timeout_s`. A hint for clients that wait on the trainer's next
        version (see docs/generation_api.md): it answers as soon as a push begins, where the trainer's
        `versions/latest.json` is read on a timer. `version` is the weights serving tokens; `updating_to` the
        version of the latest update begun (equal to `version` once it completed, never below it unless it failed)."""
        async with self._version_changed:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._version_changed.wait_for(
                    lambda: max(self.version, self.updating_to) > after or self._closing), timeout_s)
        return {"version": self.version, "updating_to": max(self.version, self.updating_to)}

    async def release_waiters(self) -> None:
        """Answer every `wait_version` now, and any later one at once: the server is stopping, and its graceful
        shutdown would otherwise wait for the long polls."""
        async with self._version_changed:
            self._closing = True
            self._version_changed.notify_all()

    async def checksum(self, timeout_s: float = 60.0) -> dict[str, Any]:
        """The weights' checksum (see `WeightSyncExtension.asyncrl_checksum` for the per-worker fields).

        `checksum` is what the workers last received (identical on every worker, else None); before any
        update it is the model's own checksum when that covers every weight (`source` says which).
        """
        workers = list(
            await asyncio.wait_for(self.llm.collective_rpc("asyncrl_checksum", timeout=timeout_s), timeout=timeout_s + 10)
        )
        checksum, source = None, None
        if workers and all(w["received"] is not None and w["received"] == workers[0]["received"] for w in workers):
            checksum, source = workers[0]["received"], "received"
        elif workers and all(w["received"] is None and not w["emptied"] for w in workers):
            checksum, source = workers[0]["model"], "model"
        return {"version": self.version, "checksum": checksum, "source": source, "workers": workers}

    def shutdown(self, timeout: float = 20.0) -> None:
        """Stop vLLM's engine and worker processes (idempotent)."""
        llm, self.llm = self.llm, None
        if llm is not None:
            llm.shutdown(timeout=timeout)
            del llm  # collect now: AsyncLLM.__del__ at interpreter exit fails noisily
