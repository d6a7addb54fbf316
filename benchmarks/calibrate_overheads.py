"""Microbenchmarks of the control plane's parts, for the simulator's overhead terms (`make calibrate`).

Each part is timed alone, never inside a run of the job the simulator then predicts:
- `measure_s3`: a real SeaweedFS (`EmbeddedS3`): encode + conditional PUT of group objects of k groups of 8
  samples, k = 1, 8, 32, of 3 response tokens, and 32 of 48 (`GroupWriter.write_many`), GET + decode of them (`get_with_metadata` + `decode_groups`), a missing key's GET
  (an idle poll), a small JSON GET (`versions/latest.json`); the trainer's per-step bookkeeping: the metrics reads
  (`read_role_metrics`, a stats GET), the `latest.json` PUT, an MLflow `log_metrics` of ~100 metrics into a sqlite
  store, and a checkpoint (`save_checkpoint` of the tiny model and an Adam-sized optimizer state);
- `measure_reward`: the reward role's app (uvicorn, its own process) and `RewardClient`: one `/score_batch` of N
  items, N = 1, 32, 256 (its wall, and the client's and the reward server's CPU per call);
- `measure_env_cpu`: the environment role's per-sample work without I/O: the real `RolloutScheduler` (admit, finish,
  score, emit), an asyncio task per request, `decode_response`, `Sample` built and validated.
Latencies are the median of repeats (the machine is shared); CPU figures are `time.process_time` of this process
plus the server's CPU (psutil), per call or per item, which the load of other processes does not inflate.
"""

from __future__ import annotations

import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
PROMPT = [1, 10, 15, 5, 13, 17]  # "6-19=": the default task's prompts are 5-7 tokens (mean 6.3)


def _cpu_of(pid: int | None) -> float:
    import psutil

    if pid is None:
        return 0.0
    t = psutil.Process(pid).cpu_times()
    return t.user + t.system


def timed(fn: Callable[[int], Any], n: int, server_pid: int | None = None) -> dict[str, float]:
    """Call fn(i) n times: median wall, and mean CPU of this process and of the server, per call."""
    walls = []
    c0, s0 = time.process_time(), _cpu_of(server_pid)
    for i in range(n):
        t0 = time.perf_counter()
        fn(i)
        walls.append(time.perf_counter() - t0)
    return {"wall_s": statistics.median(walls), "client_cpu_s": (time.process_time() - c0) / n,
            "server_cpu_s": (_cpu_of(server_pid) - s0) / n, "n": n}


def lstsq_line(xs: list[float], ys: list[float]) -> tuple[float, float]:
    """(intercept, slope) of the least-squares line; the intercept is clipped at 0."""
    mx, my = statistics.fmean(xs), statistics.fmean(ys)
    sxx = sum((x - mx) ** 2 for x in xs)
    slope = sum((x - mx) * (y - my) for x, y in zip(xs, ys, strict=True)) / sxx if sxx else 0.0
    return max(0.0, my - slope * mx), max(0.0, slope)


def make_groups(count: int, response: int, start: int = 0) -> list[Any]:
    from asyncrl.types import Group, Sample

    return [Group(f"env0-{start + g:09d}", g, "arithmetic", [
        Sample(f"env0-{start + g:09d}", i, PROMPT, [3 + (i + k) % 10 for k in range(response)], [-1.0] * response,
               [0] * response, 0, reward=float(i % 2)) for i in range(8)]) for g in range(count)]


def measure_s3(model: str, response: int = 3) -> dict[str, Any]:
    from asyncrl.local.seaweed import EmbeddedS3
    from asyncrl.storage.groups import GroupWriter, decode_groups
    from asyncrl.storage.run_layout import RunPaths
    from asyncrl.storage.s3 import S3Store

    work = Path(tempfile.mkdtemp(prefix="asyncrl-calib-s3-"))
    srv = EmbeddedS3(work / "data")
    srv.start(timeout_s=120)
    os.environ.update({"AWS_ACCESS_KEY_ID": srv.access_key, "AWS_SECRET_ACCESS_KEY": srv.secret_key})
    out: dict[str, Any] = {}
    try:
        store = S3Store(srv.endpoint_url, "calib")
        store.ensure_bucket()
        paths = RunPaths("runs", "calib")
        writer = GroupWriter(store, paths, "env0")
        time.sleep(1.0)
        i0, t0 = _cpu_of(srv.pid), time.monotonic()
        time.sleep(2.0)
        out["weed_idle_cores"] = (_cpu_of(srv.pid) - i0) / (time.monotonic() - t0)
        puts, gets = [], []
        for k, resp in ((1, response), (8, response), (32, response), (32, 48)):
            keys: list[str] = []
            seq0 = writer.next_seq
            batches = [make_groups(k, resp, seq0 + j * k) for j in range(6)]
            shape = {"groups": k, "samples": 8 * k, "tokens": 8 * k * (len(PROMPT) + resp)}
            r = timed(lambda j, b=batches, ks=keys: ks.append(writer.write_many(b[j])), 6, srv.pid)
            puts.append({**shape, **r})
            r = timed(lambda j, ks=keys: decode_groups(store.get_with_metadata(ks[j])[0], ks[j]), 6, srv.pid)
            gets.append({**shape, **r})
        out["group_put"], out["group_get"] = puts, gets
        out["miss_get"] = timed(lambda i: store.get_with_metadata(paths.group("env0", 10**6 + i)), 20, srv.pid)
        doc = {"version": 3, "consumed": {"env0": 96}, "trained": {"env0": 96}, "metrics": {f"m{i}": 0.5 for i in
                                                                                             range(100)}}
        out["json_put"] = timed(lambda i: store.put_json(paths.versions_latest(), doc), 10, srv.pid)
        out["json_get"] = timed(lambda i: store.get_json(paths.versions_latest()), 20, srv.pid)
        out["bookkeeping"] = _trainer_bookkeeping(store, paths, model, work, srv.pid)
    finally:
        srv.stop()
    return out


def _trainer_bookkeeping(store: Any, paths: Any, model: str, work: Path, pid: int | None) -> dict[str, Any]:
    """The trainer's per-step work after the weight sync, without the Learner: metrics reads, publish, MLflow."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.roles.role_metrics import read_role_metrics
    from asyncrl.storage.checkpoints import save_checkpoint
    from asyncrl.tracking.mlflow_tracker import Tracker

    for role in ("environment", "generation", "reward", "training"):  # the default job's heartbeats
        store.put_json(paths.heartbeat(role, "0"), {"role": role, "id": "0", "metrics": {f"x{i}": 1.0 for i in range(12)}})
    store.put_json(paths.rollout_stats("env0"), {"writer": "env0", "metrics": {f"rollout/m{i}": 1.0 for i in range(30)}})
    out: dict[str, Any] = {}
    out["metrics_reads"] = timed(lambda i: (store.get_json(paths.rollout_stats("env0")),
                                            read_role_metrics(store, paths)), 10, pid)
    tracker = Tracker.create(f"sqlite:///{work / 'mlflow.db'}", "calib", "calib")
    # The default job's trainer logs ~40 metrics of its own per step, two steps per call (its reporter calls MLflow at
    # most once a second, at ~2 steps/s), and ~40 figures of the other roles once per read: ~100 values per call.
    metrics = {f"group{i // 10}/metric{i}": 0.25 * i for i in range(50)}
    tracker.log_metrics(metrics, step=0)
    per_call = timed(lambda i: tracker.log_steps([(metrics, 2 * i + 1, 0), (metrics, 2 * i + 2, 0)]), 8)
    out["mlflow_log"] = {**per_call, "wall_s": per_call["wall_s"] / 2, "note": "per step: one call of two steps, halved"}
    state = {k: v.detach().clone() for k, v in AutoModelForCausalLM.from_pretrained(model).state_dict().items()}
    optim = {f"{k}.{m}": torch.zeros_like(v) for k, v in state.items() for m in ("exp_avg", "exp_avg_sq")}
    out["checkpoint"] = timed(lambda i: save_checkpoint(store, paths, 100 + i, state, optim, {"version": 100 + i}),
                              3, pid)
    out["model_bytes"] = sum(v.numel() * v.element_size() for v in state.values())
    return out


_REWARD_SERVER = """
import asyncio, socket, sys
from asyncrl.roles.reward import create_app, serve_app
sock = socket.socket(); sock.bind(("127.0.0.1", 0))
def ready(host, port):
    print(port, flush=True)
asyncio.run(serve_app(create_app(token=None), sock, ready))
"""


def measure_reward() -> dict[str, Any]:
    import httpx

    from asyncrl.rewards.client import RewardClient

    proc = subprocess.Popen([sys.executable, "-c", _REWARD_SERVER], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        port = int(proc.stdout.readline())  # type: ignore[union-attr]

        async def run() -> list[dict[str, Any]]:
            rows = []
            async with httpx.AsyncClient() as http:
                client = RewardClient(f"http://127.0.0.1:{port}", http, 30.0, token="x")
                for n in (1, 32, 256):
                    walls = []
                    c0, s0 = time.process_time(), _cpu_of(proc.pid)
                    reps = 8
                    for _ in range(reps):
                        t0 = time.perf_counter()
                        await asyncio.gather(*[client.score("arithmetic", "6-19=", "-13", {"answer": "-13"})
                                               for _ in range(n)])
                        walls.append(time.perf_counter() - t0)
                    rows.append({"items": n, "wall_s": statistics.median(walls),
                                 "client_cpu_s": (time.process_time() - c0) / reps,
                                 "server_cpu_s": (_cpu_of(proc.pid) - s0) / reps, "calls": client.calls})
            return rows

        return {"score_batch": asyncio.run(run())}
    finally:
        proc.terminate()
        proc.wait(10)


def measure_env_cpu(model: str, groups: int = 32, n: int = 8) -> dict[str, Any]:
    """CPU seconds per sample of the environment's own bookkeeping (no I/O): what the role does per sample."""
    from asyncrl.models.tokenizer import decode_response, load_tokenizer
    from asyncrl.rollout.scheduler import EmitGroup, RolloutScheduler, SchedulerConfig, Start
    from asyncrl.types import Group, Sample

    tok = load_tokenizer(Path(model))

    async def one_round(sched: RolloutScheduler) -> int:
        starts: list[Start] = []
        for p in range(groups):
            starts += [d for d in sched.offer_prompt(p, len(PROMPT)) if isinstance(d, Start)]
        done = asyncio.get_running_loop().create_future()
        done.set_result(None)

        async def request(d: Start) -> None:  # the role's run_request task: await the answer, then score
            await done
            ids = [5, 8, 2]
            sched.request_finished(d.group_id, d.sample_index, len(ids))
            text = decode_response(tok, ids)
            s = Sample(d.group_id, d.sample_index, PROMPT, ids, [-0.5] * 3, [0] * 3, 0, reward=float(text == "6"))
            s.validate()
            for e in sched.sample_scored(d.group_id, d.sample_index, s.reward):
                if isinstance(e, EmitGroup):
                    Group(e.group_id, e.prompt_index, "arithmetic", [s] * n).validate()

        await asyncio.gather(*[asyncio.create_task(request(d)) for d in starts])
        return len(starts)

    sched = RolloutScheduler(SchedulerConfig(async_ratio=10**6, prompts_per_step=groups, group_size=n,
                                             num_servers=1, max_new_tokens=6, writer="env0"))
    asyncio.run(one_round(sched))  # warm-up
    c0, total = time.process_time(), 0
    for _ in range(5):
        total += asyncio.run(one_round(sched))
    return {"samples": total, "cpu_s_per_sample": (time.process_time() - c0) / total}
