"""A weight push of a real model, end to end: the trainer's broadcast, the server's update phases, and how long
generation stops producing tokens because of it.

This process is the trainer (rank 0: the model folder loaded in float32 with Hugging Face, pushed through
`asyncrl.weights.sync.WeightSender` cast to the engine's dtype as `asyncrl.roles.weight_group` does); one generation
server (`python -m asyncrl.generation.server`) runs in a child process. Each push sends the same weights under a
new version (the bytes, not the values, set the cost). Measured per push:
- `push_s`: the trainer's `WeightSender.push` (bucket packing, broadcast, until every server answered);
- the server's answer: `seconds` generation was paused, and `phases` (docs/generation_api.md);
- under load (`--load-seqs N`: N requests of `--load-tokens` tokens decoding while the push lands; progress read
  from `/health` every 20 ms): `stall_s`, the longest time without a new token around the push (the pause plus
  the recomputation of the running requests' KV after it, which the update clears), and the decode rate before.
The first push to a server takes vLLM's layerwise reload, later ones the fast CPU reload (asyncrl/generation/
cpu_reload.py): pushes are listed in order.
`--modes full,lora` measures both kinds of push side by side, one server each, in this order: `full` sends every
weight; `lora` sends only LoRA adapters (`--lora-rank`, `--lora-alpha`, the default targets; B random so that the
merge does real work) to a server started with `--lora-scale`, which merges them (asyncrl/generation/lora_merge.py).
The result then has `lora_vs_full`: the ratio of bytes pushed and of the mean pause, idle and under load.

Run: `python benchmarks/real_parts/weight_push.py --model DIR --dtype float32 --bucket-mb 16 --idle-pushes 3
--load-pushes 2 --load-seqs 32 --out benchmarks/results/real_weight_push.json` (heavy: under
`flock /tmp/asyncrl-heavy.lock` on a shared machine).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx

ROOT = Path(__file__).resolve().parents[2]
DEFAULT_MODEL = str(ROOT / ".cache/asyncrl/models/smollm2-135m-instruct")  # make import-smollm2


def start_server(model: str, dtype: str, work: Path, args: argparse.Namespace, lora_scale: float = 0.0
                 ) -> tuple[subprocess.Popen[bytes], str]:
    ready = work / "ready.json"
    cmd = [sys.executable, "-m", "asyncrl.generation.server", "--model", model, "--port", "0", "--dtype", dtype,
           "--ready-file", str(ready), "--work-dir", str(work / "vllm"), "--max-model-len", str(args.max_model_len),
           "--kv-cache-gib", str(args.kv_cache_gib), "--max-num-seqs", str(max(1, args.load_seqs)),
           "--log-level", "INFO", "--insecure-no-token"]
    if args.cpu_threads != 1:  # the server's default (an older server has no such option)
        cmd += ["--cpu-threads", str(args.cpu_threads)]
    if args.kv_after_update != "recompute":  # likewise
        cmd += ["--kv-after-update", args.kv_after_update]
    if lora_scale > 0:
        cmd += ["--lora-scale", str(lora_scale)]
    src = Path(args.server_src).resolve() if args.server_src else ROOT
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(src), os.environ.get("PYTHONPATH", "")]))
    log = open(work / "server.log", "wb")  # noqa: SIM115 - the child writes it until it is stopped
    proc = subprocess.Popen(cmd, cwd=src, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    deadline = time.monotonic() + args.start_timeout_s
    while not ready.exists():
        if proc.poll() is not None or time.monotonic() > deadline:
            stop(proc)
            raise RuntimeError(f"generation server did not start; log {work / 'server.log'}")
        time.sleep(0.5)
    info = json.loads(ready.read_text())
    return proc, f"http://{info['host']}:{info['port']}"


def stop(proc: subprocess.Popen[bytes]) -> None:
    if proc.poll() is None:
        proc.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(40)
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


class Progress:
    """Tokens decoded so far by the requests in flight (sum of max_tokens - load), sampled every `every_s`."""

    def __init__(self, url: str, owed: int, requests: int, every_s: float = 0.02) -> None:
        self.url, self.owed, self.requests, self.every_s = url, owed, requests, every_s
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        with httpx.Client(timeout=30) as c:
            while not self._stop.is_set():
                h = c.get(f"{self.url}/health").json()
                if int(h["running"]) + int(h["waiting"]) == self.requests:  # all of the load is in the server
                    self.samples.append((time.monotonic(), self.owed - int(h["load"])))
                time.sleep(self.every_s)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(30)

    def wait_tokens(self, n: int, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.samples or self.samples[-1][1] < n:
            if time.monotonic() > deadline:
                raise TimeoutError(f"the load did not reach {n} tokens in {timeout_s:.0f} s")
            time.sleep(0.05)


def longest_stall(samples: list[tuple[float, int]], t0: float, t1: float) -> float:
    """Longest time between two progress increases that overlaps [t0, t1] (seconds)."""
    best, last_t, last_n = 0.0, None, None
    for t, n in samples:
        if last_n is None or n > last_n:
            if last_t is not None and t >= t0 and last_t <= t1:
                best = max(best, t - last_t)
            last_t, last_n = t, n
    return best


def rate(samples: list[tuple[float, int]], t0: float, t1: float) -> float | None:
    inside = [(t, n) for t, n in samples if t0 <= t <= t1]
    if len(inside) < 2 or inside[-1][0] == inside[0][0]:
        return None
    return (inside[-1][1] - inside[0][1]) / (inside[-1][0] - inside[0][0])


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", default=DEFAULT_MODEL)
    p.add_argument("--dtype", default="float32", choices=("float32", "bfloat16"))
    p.add_argument("--bucket-mb", type=float, default=16.0, help="training.weight_bucket_mb")
    p.add_argument("--idle-pushes", type=int, default=3)
    p.add_argument("--load-pushes", type=int, default=2)
    p.add_argument("--load-seqs", type=int, default=32)
    p.add_argument("--load-tokens", type=int, default=256)
    p.add_argument("--max-model-len", type=int, default=352)
    p.add_argument("--kv-cache-gib", type=float, default=1.0)
    p.add_argument("--cpu-threads", type=int, default=1)
    p.add_argument("--kv-after-update", default="recompute", choices=("recompute", "keep"),
                   help="generation.kv_after_update of the server")
    p.add_argument("--start-timeout-s", type=float, default=600.0)
    p.add_argument("--stall-wait-s", type=float, default=300.0, help="under load: the longest wait for a token "
                   "after the push")
    p.add_argument("--server-src", default=None, help="run the server from this asyncrl source tree (a before/after "
                   "comparison: e.g. `git archive HEAD | tar -x -C DIR`); default this one")
    p.add_argument("--modes", default="full", help="comma-separated: full, lora (module docstring)")
    p.add_argument("--lora-rank", type=int, default=8)
    p.add_argument("--lora-alpha", type=float, default=16.0)
    p.add_argument("--out", type=Path)
    a = p.parse_args(argv)
    modes = [m.strip() for m in a.modes.split(",") if m.strip()]
    if not modes or set(modes) - {"full", "lora"}:
        raise SystemExit(f"--modes: expected full and/or lora, got {a.modes!r}")
    runs = {mode: run_mode(a, mode) for mode in modes}
    result: dict[str, Any] = runs[modes[0]] if len(modes) == 1 else {"modes": runs}
    if {"full", "lora"} <= set(runs):
        result["lora_vs_full"] = compare(runs["full"], runs["lora"])
        print(json.dumps({"lora_vs_full": result["lora_vs_full"]}, indent=2))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(result, indent=2) + "\n")


def _mean(rows: list[dict[str, Any]], key: str, loaded: bool) -> float | None:
    vals = [r[key] for r in rows[1:] if r["loaded"] == loaded and r.get(key) is not None]  # the first: layerwise
    return sum(vals) / len(vals) if vals else None


def compare(full: dict[str, Any], lora: dict[str, Any]) -> dict[str, Any]:
    """Bytes and pauses of LoRA pushes against full ones (means over the pushes after each server's first)."""
    out: dict[str, Any] = {"wire_bytes_full": full["wire_bytes"], "wire_bytes_lora": lora["wire_bytes"],
                           "bytes_ratio_full_over_lora": full["wire_bytes"] / lora["wire_bytes"]}
    for loaded in (False, True):
        tag = "under_load" if loaded else "idle"
        for key in ("paused_s", "push_s", "stall_s"):
            f, lo = _mean(full["pushes"], key, loaded), _mean(lora["pushes"], key, loaded)
            out[f"{key}_{tag}_full"], out[f"{key}_{tag}_lora"] = f, lo
            out[f"{key}_{tag}_lora_over_full"] = lo / f if f and lo is not None else None
    return out


def run_mode(a: argparse.Namespace, mode: str) -> dict[str, Any]:
    """Pushes of one kind (`full` or `lora`) to a server of its own; the figures of `main`'s docstring."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.config.schema import LoraConfig
    from asyncrl.training.lora import adapter_params, inject
    from asyncrl.weights.buckets import DTYPES, wire_tensors
    from asyncrl.weights.sync import WeightSender

    torch.set_num_threads(1)
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    lora_scale = 0.0
    if mode == "lora":
        lora = LoraConfig(rank=a.lora_rank, alpha=a.lora_alpha)
        model, lora_scale = inject(model, lora), lora.scale
        g = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for _, p_ in adapter_params(model):
                p_.copy_(0.01 * torch.randn(p_.shape, generator=g))
        named = [(n, p_.detach()) for n, p_ in adapter_params(model)]
    else:
        named = [(n, p_.detach()) for n, p_ in model.named_parameters()]
    work = Path(tempfile.mkdtemp(prefix=f"asyncrl-wp-{mode}-"))
    proc, url = start_server(a.model, a.dtype, work, a, lora_scale)
    pushes: list[dict[str, Any]] = []
    sender = WeightSender([url], backend="gloo", timeout_s=300, bucket_bytes=int(a.bucket_mb * 2**20),
                          lora_scale=lora_scale)
    try:
        httpx.post(f"{url}/generate", json={"request_id": "warm", "prompt_token_ids": [1, 2, 3], "max_tokens": 4},
                   timeout=300).raise_for_status()
        t = time.monotonic()
        sender.connect()
        connect_s = time.monotonic() - t
        for k in range(a.idle_pushes + a.load_pushes):
            version = k + 1
            loaded = k >= a.idle_pushes and a.load_seqs > 0
            progress, batch = None, None
            if loaded:
                owed = a.load_seqs * a.load_tokens
                body = {"requests": [{"request_id": f"load-{version}-{i}", "prompt_token_ids": [1] + [100 + i] * 60,
                                      "max_tokens": a.load_tokens, "ignore_eos": True, "seed": i}
                                     for i in range(a.load_seqs)]}
                batch = threading.Thread(target=lambda b=body: httpx.post(f"{url}/generate_batch", json=b,
                                                                          timeout=3600).read(), daemon=True)
                batch.start()
                progress = Progress(url, owed, a.load_seqs)
                progress.start()
                progress.wait_tokens(a.load_seqs * 16, timeout_s=1800)  # every sequence prefilled and decoding
                time.sleep(2.0)
            t_wire = time.monotonic()
            wire = wire_tensors(named, DTYPES[a.dtype])
            wire_s = time.monotonic() - t_wire
            t0 = time.monotonic()
            reply = sender.push(version, wire)[url]
            t1 = time.monotonic()
            row: dict[str, Any] = {"version": version, "loaded": loaded, "cast_s": wire_s, "push_s": t1 - t0,
                                   "paused_s": reply["seconds"], "phases": reply["phases"]}
            if progress is not None and batch is not None:
                tokens_at_end = progress.samples[-1][1]
                deadline = time.monotonic() + a.stall_wait_s
                while time.monotonic() < deadline and progress.samples[-1][1] <= tokens_at_end:
                    time.sleep(0.05)  # until a token after the push (the recomputed KV), at most stall_wait_s
                time.sleep(2.0)
                progress.stop()
                row["stall_s"] = longest_stall(progress.samples, t0, t1)
                after = [t for t, n in progress.samples if t > t1 and n > tokens_at_end]
                row["resume_to_next_token_s"] = after[0] - t1 if after else None
                row["decode_tokens_per_s_before"] = rate(progress.samples, t0 - 2.0, t0)
                row["progress"] = [(round(t - t0, 3), n) for t, n in progress.samples[::5]]
                httpx.post(f"{url}/abort_batch", json={"request_ids": [f"load-{version}-{i}" for i in
                                                                       range(a.load_seqs)]}, timeout=60)
                batch.join(120)
            pushes.append(row)
            print(f"{mode} push {version} ({'under load' if loaded else 'idle'}): {row['push_s']:.2f} s, paused "
                  f"{row['paused_s']:.2f} s, phases {json.dumps({k: round(v, 3) for k, v in reply['phases'].items()})}"
                  + (f", longest stall {row['stall_s']:.2f} s, next token {row['resume_to_next_token_s']} s after "
                     f"the push (decoding {row['decode_tokens_per_s_before'] or 0:.0f} tok/s before)"
                     if "stall_s" in row else ""), flush=True)
    finally:
        sender.shutdown()
        stop(proc)
    nbytes = sum(t.numel() * t.element_size() for _, t in wire_tensors(named, DTYPES[a.dtype]))
    result = {"mode": mode, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"), "model": a.model, "dtype": a.dtype,
              "bucket_mb": a.bucket_mb, "wire_bytes": nbytes, "kv_after_update": a.kv_after_update, "cpu_threads": a.cpu_threads, "connect_s": connect_s,
              "load_seqs": a.load_seqs, "load_tokens": a.load_tokens, "server_src": a.server_src, "pushes": pushes, "server_log": str(work)}
    print(json.dumps({k: v for k, v in result.items() if k != "pushes"}, indent=2))
    return result


if __name__ == "__main__":
    main()
