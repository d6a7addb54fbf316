"""A role's system figures (CPU, memory, GPU), sampled at each heartbeat and logged as MLflow system metrics.

`SystemSampler.sample()` measures this role's process tree (the role and its children: vLLM's engine core, the
torchrun workers): CPU use in cores since the previous sample (`cpu_cores`), resident memory (`memory_rss_mb`),
thread count (`threads`); and its machine as MLflow's own system metrics monitor names and measures it: CPU use of
the whole machine since the previous sample (`cpu_utilization_percentage`), memory in use
(`system_memory_usage_megabytes`, `system_memory_usage_percentage`) and, with NVIDIA's management library present
(`pynvml`, in the CUDA images), each visible GPU's `gpu_<i>_utilization_percentage`,
`gpu_<i>_memory_usage_megabytes` and `gpu_<i>_memory_usage_percentage` (megabytes are 10^6 bytes, as MLflow's). The
heartbeat carries them under `system` (`asyncrl.roles.liveness.Heartbeat`); the trainer logs each role instance's as
`system/<name>` in that instance's child run (`asyncrl.roles.role_metrics`), the names MLflow shows in a run's
"System metrics" tab, so each role's load is browsable per instance and comparable across runs.

Listing a process's children scans every process of the machine (/proc), which cost the environment role ~15% of
its CPU when done at every beat; the tree is therefore listed once and again at most every `TREE_REFRESH_S` (a role's
children — vLLM's engine core, torchrun's workers — are started once), and each beat reads only the processes it
holds.

Invariants: a sample never raises (a process that vanished between listing and reading is skipped; no psutil or
no GPU library means fewer figures); values are finite floats; the first sample's CPU figure covers the time since
the sampler was made.
"""

from __future__ import annotations

import logging
import os
import time
from typing import Any

log = logging.getLogger(__name__)

TREE_REFRESH_S = 30.0


class SystemSampler:
    def __init__(self, pid: int | None = None, tree_refresh_s: float = TREE_REFRESH_S) -> None:
        self.pid = pid or os.getpid()
        self.tree_refresh_s = tree_refresh_s
        self._procs: list[Any] = []
        self._listed_at: float | None = None
        self._last_cpu: float | None = None
        self._last_t = time.monotonic()
        self._nvml: Any = None
        try:
            import pynvml  # the CUDA images have it; CPU machines do not

            pynvml.nvmlInit()
            self._nvml = pynvml
        except Exception:  # noqa: BLE001 - no NVIDIA library or no driver: no GPU figures
            self._nvml = None
        self._last_cpu = self._tree_cpu_s(self._tree())
        self._machine_cpu_percent()  # psutil measures the machine's CPU use from one call to the next

    def _tree(self) -> list[Any]:
        """The role and its children, listed again only every `tree_refresh_s`; in between, a process that ended is
        skipped when read, and one started is counted from the next listing on."""
        import psutil

        now = time.monotonic()
        if self._listed_at is None or now - self._listed_at >= self.tree_refresh_s:
            self._listed_at = now
            try:
                root = psutil.Process(self.pid)
                self._procs = [root, *root.children(recursive=True)]
            except psutil.Error:
                self._procs = []
        return self._procs

    @staticmethod
    def _tree_cpu_s(procs: list[Any]) -> float | None:
        import psutil

        total, seen = 0.0, False
        for p in procs:
            try:
                t = p.cpu_times()
                total += t.user + t.system
                seen = True
            except psutil.Error:
                continue
        return total if seen else None

    @staticmethod
    def _machine_cpu_percent() -> float | None:
        try:
            import psutil

            return float(psutil.cpu_percent(interval=None))
        except Exception:  # noqa: BLE001 - no psutil: no figure
            return None

    def sample(self) -> dict[str, float]:
        try:
            return self._sample()
        except Exception as err:  # noqa: BLE001 - figures are never worth a role
            log.debug("system metrics: sample failed: %s", err)
            return {}

    def _sample(self) -> dict[str, float]:
        import psutil

        out: dict[str, float] = {}
        procs = self._tree()
        now, cpu = time.monotonic(), self._tree_cpu_s(procs)
        if cpu is not None and self._last_cpu is not None and now > self._last_t:
            out["cpu_cores"] = max(0.0, (cpu - self._last_cpu) / (now - self._last_t))
        self._last_cpu, self._last_t = cpu, now
        rss = threads = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                threads += p.num_threads()
            except psutil.Error:
                continue
        out["memory_rss_mb"] = rss / 2**20
        out["threads"] = float(threads)
        machine_cpu = self._machine_cpu_percent()
        if machine_cpu is not None:
            out["cpu_utilization_percentage"] = machine_cpu
        memory = psutil.virtual_memory()
        out["system_memory_usage_megabytes"] = memory.used / 1e6
        out["system_memory_usage_percentage"] = float(memory.percent)
        if self._nvml is not None:
            out.update(self._gpus())
        return out

    def _gpus(self) -> dict[str, float]:
        nv, out = self._nvml, {}
        for i in range(nv.nvmlDeviceGetCount()):
            handle = nv.nvmlDeviceGetHandleByIndex(i)
            util = nv.nvmlDeviceGetUtilizationRates(handle)
            mem = nv.nvmlDeviceGetMemoryInfo(handle)
            out[f"gpu_{i}_utilization_percentage"] = float(util.gpu)
            out[f"gpu_{i}_memory_usage_megabytes"] = mem.used / 1e6
            out[f"gpu_{i}_memory_usage_percentage"] = 100.0 * mem.used / mem.total if mem.total else 0.0
        return out
