"""Device check of the trainer's and the weight sync's CUDA/NCCL paths (one GPU), or the same code on the CPU.

Checks (one JSON line each on stdout, all of them in `--out`; exit 0 only if every check is ok):
- `train_zero{0,2,3}`: `PolicyTrainer` (DeepSpeed, ZeRO stage 0/2/3, float32: the only dtype the trainer offers) on
  the project's tiny model architecture, a few real steps; finite losses, weights changed, seconds per step, where
  the parameters live; `train_zero_consistency`: log-probs and losses agree between the stages;
- `push_gloo`: rank 0 (a trained stage-0 trainer) broadcasts over a gloo `join_group` with the trainer's device as
  `send_weights`' device (as `asyncrl.roles.weight_group` passes it) to a CPU receiver in another process
  (`receive_weights`, as the vLLM worker extension does); checksums and MB/s for the live parameters, the role's
  snapshot (CPU float32) and synthetic bf16 tensors (512 MiB on a GPU);
- `nccl_world1` (run first, as they need no DeepSpeed): `join_group(backend="nccl")` of one rank, `send_weights` to itself, CUDA `pack_bucket` round trip;
- `nccl_two_ranks_one_gpu`: two processes on cuda:0 in one NCCL group; ok if it works (checksums, GB/s) or if NCCL
  refuses it with a clear error within the deadline (`refused_as_expected`). Both NCCL checks are skipped on CPU.
Every check runs in fresh subprocesses (`--part ...`) under a deadline; one failing does not stop the others.

Run: `python scripts/gpu_check.py --device cuda --out /tmp/gpu_check.json` (`--device cpu`: gloo, no CUDA). One file on
purpose (parts and orchestration together): it is what travels to a GPU machine. Results and findings: docs/gpu_check.md.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
Result = dict[str, Any]
MiB = 1 << 20


# ---- helpers of the subprocesses (torch is imported only inside them) --------------------------------------------

def _guard_op_builds() -> None:
    """No DeepSpeed op may JIT-compile here: fail at once, naming the op, instead of building for minutes."""
    from asyncrl.training.process_group import skip_deepspeed_op_builds

    skip_deepspeed_op_builds()
    from deepspeed.ops.op_builder.builder import OpBuilder

    def refuse(self: Any, verbose: bool = True) -> Any:
        raise RuntimeError(f"DeepSpeed tried to JIT-compile op {self.name!r}; this check allows no compilation")

    OpBuilder.jit_load = refuse  # type: ignore[method-assign]


def _sync(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def _build_model(folder: Path) -> Path:
    """The project's tiny model (`asyncrl.tiny_model.build`: its tokenizer's vocab, Qwen2 architecture, seed),
    randomly initialised without the SFT warm start; deterministic, built on the CPU."""
    import torch
    from transformers import Qwen2ForCausalLM

    from asyncrl.config.schema import RunConfig
    from asyncrl.models.tokenizer import charset, make_tokenizer, vocab_size
    from asyncrl.tiny_model.build import qwen2_config

    cfg = RunConfig()
    tok = make_tokenizer(charset(cfg))
    torch.manual_seed(cfg.model.tiny.seed)
    mcfg = qwen2_config(cfg, vocab_size(tok), int(tok.bos_token_id), int(tok.eos_token_id), int(tok.pad_token_id))
    model = Qwen2ForCausalLM(mcfg).float()
    with torch.no_grad():  # as the tests' tiny model: far from uniform outputs
        for p in model.parameters():
            if p.ndim >= 2:
                p.normal_(0.0, 0.1)
    model.save_pretrained(str(folder), safe_serialization=True)
    return folder


def _make_batch(trainer: Any) -> Any:
    """8 samples in 2 groups (random prompt and responses, reward on every other one), on-policy behaviour
    log-probs from the trainer's current weights, as `tests/integration/test_policy_deepspeed.py` builds them."""
    import torch

    from asyncrl.training.batch import build_batch
    from asyncrl.types import Group, Sample

    gen = torch.Generator().manual_seed(1)
    vocab = int(trainer.engine.module.config.vocab_size)
    groups = []
    for gi in range(2):
        prompt = torch.randint(3, vocab, (12,), generator=gen).tolist()
        samples = []
        for j in range(4):
            n = int(torch.randint(6, 24, (1,), generator=gen))
            resp = torch.randint(3, vocab, (n,), generator=gen).tolist()
            samples.append(Sample(f"g{gi}", j, prompt, resp, [0.0] * n, [0] * n, 0, reward=float(j % 2)))
        groups.append(Group(f"g{gi}", gi, "t", samples))
    lp = trainer.logprobs(build_batch(groups, norm_std=True, pad_id=0))
    for i, s in enumerate(s for g in groups for s in g.samples):
        p = len(s.prompt_token_ids)
        s.logprobs = lp[i, p : p + len(s.token_ids)].tolist()
    return build_batch(groups, norm_std=True, pad_id=0)


def _trainer(tmp: Path, zero: int) -> tuple[Any, Any]:
    from asyncrl.config.schema import TrainingConfig
    from asyncrl.training.policy import PolicyTrainer

    _guard_op_builds()
    model_dir = _build_model(tmp / f"model-{os.getpid()}")
    cfg = TrainingConfig(zero_stage=zero, micro_batch_size=4, lr=1e-3)
    trainer = PolicyTrainer(model_dir, cfg, batch_size=8, timeout_s=60.0)
    return trainer, _make_batch(trainer)


def _store(port_file: Path, world_size: int, host: bool, deadline_s: float = 60.0) -> Any:
    """The rendezvous TCPStore on 127.0.0.1: rank 0 hosts it on a free port (as `WeightSender.connect` does) and
    writes the port to `port_file`; the other rank waits for that file and connects."""
    import datetime

    import torch.distributed as dist

    from asyncrl.weights.sync import listen_socket

    timeout = datetime.timedelta(seconds=deadline_s)
    if host:
        listener = listen_socket("127.0.0.1")
        port = listener.getsockname()[1]
        store = dist.TCPStore("127.0.0.1", port, world_size, is_master=True, timeout=timeout,
                              wait_for_workers=False, master_listen_fd=listener.detach())
        port_file.with_suffix(".tmp").write_text(str(port))
        os.replace(port_file.with_suffix(".tmp"), port_file)
        return store
    end = time.monotonic() + deadline_s
    while not port_file.exists():
        if time.monotonic() > end:
            raise TimeoutError(f"rank 0 published no store port within {deadline_s:.0f}s")
        time.sleep(0.1)
    return dist.TCPStore("127.0.0.1", int(port_file.read_text()), world_size, is_master=False, timeout=timeout)


def _synthetic(total_mib: int, device: Any, seed: int = 0) -> list[tuple[str, Any]]:
    """bf16 tensors of 32 MiB each (16 MiB under 64 MiB in all), `total_mib` together, on `device`."""
    import torch

    rows = 4096 if total_mib >= 64 else 2048
    n = max(1, total_mib * MiB // (rows * 4096 * 2))
    gen = torch.Generator(device=device).manual_seed(seed)
    return [(f"synthetic.{i}", torch.randn(rows, 4096, generator=gen, device=device, dtype=torch.bfloat16))
            for i in range(n)]


def _nbytes(tensors: list[tuple[str, Any]]) -> int:
    return sum(t.numel() * t.element_size() for _, t in tensors)


def _send(pg: Any, tensors: list[tuple[str, Any]], version: int, device: Any, timeout_s: float = 60.0) -> float:
    """`send_weights` as `WeightSender.push` calls it; the seconds it took (device synchronised)."""
    from asyncrl.weights.buckets import plan_buckets
    from asyncrl.weights.sync import DEFAULT_BUCKET_BYTES, send_weights

    named = {n: t.detach() for n, t in tensors}
    manifest = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in named.items()], DEFAULT_BUCKET_BYTES, version)
    _sync(device)
    t0 = time.perf_counter()
    send_weights(pg, manifest, named, device, timeout_s)
    _sync(device)
    return time.perf_counter() - t0


def _receive(pg: Any, device: Any, timeout_s: float = 60.0) -> tuple[int, list[tuple[str, Any]], float]:
    """`receive_weights` as the worker extension calls it: (version, the received tensors, seconds)."""
    from asyncrl.weights.sync import receive_weights

    got: list[tuple[str, Any]] = []
    t0 = time.perf_counter()
    manifest = receive_weights(pg, device, timeout_s, got.extend)
    _sync(device)
    return manifest.version, got, time.perf_counter() - t0


# ---- parts: each runs in its own process and returns its result document ----------------------------------------

def part_train(a: argparse.Namespace) -> Result:
    import torch

    trainer, batch = _trainer(a.tmp, a.zero)
    try:
        res: Result = {"init_s": round(trainer.init_seconds, 2), "stage": trainer.stage, "device": str(trainer.device),
                       "dtype": "float32 (the only dtype PolicyTrainer accepts; its DeepSpeed config disables bf16/fp16)"}
        lp0 = trainer.logprobs(batch)
        w0 = trainer.named_weights()
        losses, grad_norms, step_s = [], [], []
        for i in range(a.steps):
            _sync(trainer.device)
            t0 = time.perf_counter()
            m = trainer.train_step(batch)
            _sync(trainer.device)
            step_s.append(time.perf_counter() - t0)
            losses.append(m["loss"])
            grad_norms.append(m["grad_norm"])
            if i == 0:
                w1 = dict(trainer.named_weights())
                res["unchanged"] = [n for n, t in w0 if torch.equal(t, w1[n])]
                res["changed_fraction"] = 1 - len(res["unchanged"]) / len(w0)
        params = [p for _, p in trainer.engine.module.named_parameters()]
        res["param_devices"] = sorted({str(getattr(p, "ds_tensor", p).device) for p in params})
        res["param_dtypes"] = sorted({str(p.dtype) for p in params})
        res.update(losses=losses, grad_norms=grad_norms, step_s=[round(s, 4) for s in step_s],
                   step_s_median_after_first=round(statistics.median(step_s[1:] or step_s), 4),
                   logprobs_start=lp0.tolist(), logprobs_end=trainer.logprobs(batch).tolist(),
                   response_mask=batch.response_mask.tolist())
        if trainer.device.type == "cuda":
            res["max_memory_allocated_mib"] = round(torch.cuda.max_memory_allocated(trainer.device) / MiB, 1)
        return res
    finally:
        trainer.close()


def part_push_send(a: argparse.Namespace) -> Result:
    """Rank 0 of a 2-rank gloo group: a trained stage-0 trainer pushes several tensor sets; version -1 ends."""
    import torch

    from asyncrl.weights.sync import join_group, local_ip_towards, weights_checksum

    trainer, batch = _trainer(a.tmp, 0)
    trainer.train_step(batch)
    dev = trainer.device
    snapshot = trainer.snapshot()
    assert snapshot is not None
    synth = _synthetic(512 if dev.type == "cuda" else 32, dev)
    variants: list[tuple[str, list[tuple[str, Any]], Any]] = [
        ("live_params", [(n, p.detach()) for n, p in trainer.engine.module.named_parameters()], dev),
        ("snapshot_cpu_fp32", snapshot.weights, dev),
        ("synthetic_bf16_warm", synth, dev),
        ("synthetic_bf16", synth, dev),
    ]
    if dev.type == "cuda":
        variants.append(("synthetic_bf16_via_cpu_device", synth, torch.device("cpu")))
    store = _store(a.port_file, 2, host=True)
    pg = join_group(store=store, rank=0, world_size=2, backend="gloo", timeout_s=60.0, group_name="gpu-check",
                    local_addr=local_ip_towards("127.0.0.1"))
    secs = [_send(pg, tensors, version, device) for version, (_, tensors, device) in enumerate(variants)]
    _send(pg, [], -1, dev)  # the end; checksums only now, so that no side waits for the other's between pushes
    sums = {k: weights_checksum(t) for k, t in {id(t): t for _, t, _ in variants}.items()}
    out: Result = {"trainer_device": str(dev), "sent": {
        str(v): {"name": name, "device_arg": str(device), "bytes": _nbytes(tensors), "send_s": round(secs[v], 4),
                 "tensor_device": str(tensors[0][1].device), "checksum": sums[id(tensors)]}
        for v, (name, tensors, device) in enumerate(variants)}}
    trainer.close()
    return out


def part_push_recv(a: argparse.Namespace) -> Result:
    import torch

    from asyncrl.weights.sync import join_group, local_ip_towards, weights_checksum

    store = _store(a.port_file, 2, host=False)
    pg = join_group(store=store, rank=1, world_size=2, backend="gloo", timeout_s=60.0, group_name="gpu-check",
                    local_addr=local_ip_towards("127.0.0.1"))
    got = []
    while (r := _receive(pg, torch.device("cpu")))[0] >= 0:
        got.append(r)
    return {"received": {str(v): {"bytes": _nbytes(t), "recv_s": round(s, 4), "checksum": weights_checksum(t)}
                         for v, t, s in got}}


def part_nccl1(a: argparse.Namespace) -> Result:
    """World size 1: `join_group(nccl)`, `send_weights` to itself, and the CUDA pack/unpack round trip."""
    import torch
    from transformers import AutoModelForCausalLM

    from asyncrl.weights.buckets import pack_bucket, plan_buckets, unpack_bucket, weights_checksum
    from asyncrl.weights.sync import join_group, shutdown_group

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    model = AutoModelForCausalLM.from_pretrained(str(_build_model(a.tmp / "model-nccl1")), dtype=torch.float32)
    tensors = [(n, p.detach().to(dev)) for n, p in model.named_parameters()] + _synthetic(128, dev, seed=1)
    store = _store(a.port_file, 1, host=True)
    t0 = time.perf_counter()
    pg = join_group(store=store, rank=0, world_size=1, backend="nccl", timeout_s=60.0, group_name="gpu-check-nccl1",
                    local_addr="127.0.0.1")
    res: Result = {"join_s": round(time.perf_counter() - t0, 3), "backend": getattr(pg, "name", lambda: "?")(), "bytes": _nbytes(tensors)}
    res["send_s"] = [round(_send(pg, tensors, v, dev), 4) for v in range(2)]
    manifest = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in tensors], 16 * MiB, 0)
    named = dict(tensors)
    back = [x for i in range(len(manifest.bucket_sizes)) for x in unpack_bucket(manifest, i, pack_bucket(manifest, i, named, dev))]
    res["buckets"] = len(manifest.bucket_sizes)
    res["bucket_device"] = str(back[0][1].device)
    res["roundtrip_equal"] = all(torch.equal(t, named[n]) for n, t in back) and len(back) == len(tensors)
    res["checksum_equal"] = weights_checksum(back) == weights_checksum(tensors)
    shutdown_group(pg)
    return res


def part_nccl_pair(a: argparse.Namespace) -> Result:
    """One of two ranks of an NCCL group, both on cuda:0; rank 0 sends 256 MiB of bf16 tensors twice."""
    import torch

    from asyncrl.weights.sync import join_group, weights_checksum

    dev = torch.device("cuda", 0)
    torch.cuda.set_device(dev)
    rank = 0 if a.part == "nccl-send" else 1
    store = _store(a.port_file, 2, host=rank == 0)
    res: Result = {"rank": rank}
    t0 = time.perf_counter()
    try:
        pg = join_group(store=store, rank=rank, world_size=2, backend="nccl", timeout_s=45.0,
                        group_name="gpu-check-nccl2", local_addr="127.0.0.1")
    except Exception as e:  # noqa: BLE001 - the refusal is a result here
        return {**res, "joined": False, "join_s": round(time.perf_counter() - t0, 2), "error": f"{type(e).__name__}: {e}"}
    res.update(joined=True, join_s=round(time.perf_counter() - t0, 2))
    if rank == 0:
        synth = _synthetic(256, dev)
        res.update(bytes=_nbytes(synth), send_s=[round(_send(pg, synth, v, dev), 4) for v in range(2)],
                   checksum=weights_checksum(synth))
    else:
        recv = [_receive(pg, dev) for _ in range(2)]
        res.update(bytes=_nbytes(recv[-1][1]), recv_s=[round(r[2], 4) for r in recv], checksum=weights_checksum(recv[-1][1]))
    return res


PARTS = {"train": part_train, "push-send": part_push_send, "push-recv": part_push_recv, "nccl1": part_nccl1,
         "nccl-send": part_nccl_pair, "nccl-recv": part_nccl_pair}


def run_part(a: argparse.Namespace) -> None:
    sys.path.insert(0, str(REPO))
    try:
        res = PARTS[a.part](a)
    except BaseException as e:  # noqa: BLE001 - reported to the main process
        res = {"error": f"{type(e).__name__}: {e}"[:2000], "traceback": traceback.format_exc()[-3000:]}
    a.result.write_text(json.dumps(res))
    sys.stdout.flush()
    os._exit(0)  # skip interpreter teardown: a stuck NCCL/gloo destructor must not outlive the result


# ---- the main process: starts parts under deadlines, judges them, writes the report --------------------------------

MACHINE = (
    "import json, platform, torch; c = torch.cuda.is_available(); print(json.dumps({'python': platform.python_version(), "
    "'torch': torch.__version__, 'gpu': torch.cuda.get_device_name(0) if c else None, "
    "'nccl': '.'.join(map(str, torch.cuda.nccl.version())) if c else None}))"
)


def machine() -> Result:
    """Python, torch, the GPU and NCCL's version, from a subprocess (this process imports no torch)."""
    try:
        out = subprocess.run([sys.executable, "-c", MACHINE], capture_output=True, text=True, timeout=120, check=True)
        return dict(json.loads(out.stdout.strip().splitlines()[-1]))
    except Exception as e:  # noqa: BLE001 - reported, never fatal
        return {"error": f"{type(e).__name__}: {e}"}


class Runner:
    def __init__(self, a: argparse.Namespace) -> None:
        self.a, self.tmp = a, Path(tempfile.mkdtemp(prefix="gpu_check."))
        self.deadline = time.monotonic() + a.budget_s
        self.results: list[Result] = []
        self.env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_PORT")}
        self.env.update(MASTER_ADDR="127.0.0.1", DS_BUILD_OPS="0", TORCH_EXTENSIONS_DIR=str(self.tmp / "torch_ext"),
                        DS_ACCELERATOR=a.device, TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1",
                        TRANSFORMERS_OFFLINE="1", PYTHONUNBUFFERED="1", NCCL_DEBUG="WARN",
                        PYTHONPATH=os.pathsep.join(x for x in (str(REPO), os.environ.get("PYTHONPATH")) if x))
        if a.device == "cpu":
            self.env.update(CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")

    def parts(self, name: str, specs: list[list[str]], timeout_s: float) -> list[Result]:
        """Start every part of `specs` at once; wait until all end or the deadline; each one's result document
        (or what went wrong: exit status, timeout, its log's tail)."""
        timeout_s = min(timeout_s * self.a.timeout_scale, self.deadline - time.monotonic())
        procs = []
        port_file = self.tmp / f"{name}.port"
        for i, spec in enumerate(specs):
            result, log = self.tmp / f"{name}.{i}.json", self.tmp / f"{name}.{i}.log"
            cmd = [sys.executable, str(Path(__file__).resolve()), "--device", self.a.device, "--tmp", str(self.tmp),
                   "--port-file", str(port_file), "--result", str(result), *spec]
            with open(log, "wb") as f:
                procs.append((subprocess.Popen(cmd, env=self.env, stdout=f, stderr=subprocess.STDOUT, cwd=REPO,
                                               start_new_session=True), result, log))
        end, peer_failed = time.monotonic() + max(timeout_s, 0.0), False
        while time.monotonic() < end and any(p.poll() is None for p, _, _ in procs):
            if not peer_failed and any(p.poll() is not None and (not r.exists() or '"error"' in r.read_text())
                                       for p, r, _ in procs):
                peer_failed = True  # the others would only wait for it: give them a few seconds to report
                end = min(end, time.monotonic() + 5)
            time.sleep(0.2)
        out = []
        for p, result, log in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
            doc = json.loads(result.read_text()) if result.exists() else {"error": f"no result (exit status {p.returncode})"}
            if not result.exists() or "error" in doc:
                doc["log_tail"] = log.read_text(errors="replace")[-2500:]
            if not result.exists() and p.returncode == -signal.SIGKILL:
                doc["error"] = "killed: " + ("a peer had failed" if peer_failed else f"past the deadline of {timeout_s:.0f}s")
            out.append(doc)
        return out

    def check(self, name: str, fn: Any) -> Result:
        print(f"# {time.strftime('%H:%M:%S')} starting {name}", file=sys.stderr, flush=True)
        t0 = time.monotonic()
        try:
            if self.deadline - time.monotonic() < 5:
                raise TimeoutError("the script's budget (--budget-s) is spent")
            res = {"check": name, **fn()}
        except Exception as e:  # noqa: BLE001 - one check failing must not stop the others
            res = {"check": name, "ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()[-1500:]}
        res["seconds"] = round(time.monotonic() - t0, 1)
        print(json.dumps(res), flush=True)
        self.results.append(res)
        self.a.out.write_text(json.dumps({"device": self.a.device, "machine": self.machine, "checks": self.results},
                                         indent=1))
        return res

    def train(self, zero: int) -> Result:
        doc = self.parts(f"train{zero}", [["--part", "train", "--zero", str(zero), "--steps", str(self.a.steps)]], 100)[0]
        if "error" in doc:
            return {"ok": False, **doc}
        finite = all(math.isfinite(x) for x in doc["losses"] + doc["grad_norms"])
        on_device = all(d.startswith(self.a.device) for d in doc["param_devices"])
        self.train_docs[zero] = doc
        keep = {k: v for k, v in doc.items() if not k.startswith(("logprobs", "response_mask"))}
        return {"ok": finite and on_device and doc["changed_fraction"] >= 0.9 and doc["stage"] == zero,
                "finite": finite, "params_on_device": on_device, **keep}

    def consistency(self) -> Result:
        if 0 not in self.train_docs or len(self.train_docs) < 2:
            return {"ok": False, "error": f"needs stage 0 and another stage; have {sorted(self.train_docs)}"}
        ref = self.train_docs[0]

        def max_diff(x: list[list[float]], y: list[list[float]]) -> float:  # over the response tokens
            return max(abs(a - b) for rx, ry, rm in zip(x, y, ref["response_mask"], strict=True)
                       for a, b, m in zip(rx, ry, rm, strict=True) if m > 0)

        out: Result = {"tolerance": self.a.tol, "measures": "max abs diff of response-token log-probs before the "
                       "first and after the last step; of the losses, relative where |loss| > 1"}
        ok = True
        for zero, doc in sorted(self.train_docs.items()):
            if zero == 0:
                continue
            d = {k: max_diff(doc[k], ref[k]) for k in ("logprobs_start", "logprobs_end")}
            d["losses"] = max(abs(x - y) / max(abs(y), 1.0) for x, y in zip(doc["losses"], ref["losses"], strict=True))
            ok &= max(d.values()) <= self.a.tol
            out[f"zero{zero}_vs_zero0"] = d
        return {"ok": ok, **out}

    def push(self) -> Result:
        snd, rcv = self.parts("push", [["--part", "push-send"], ["--part", "push-recv"]], 120)
        if "error" in snd or "error" in rcv:
            return {"ok": False, "sender": snd, "receiver": rcv}

        def checksums_match(x: Result, y: Result) -> bool:  # as asyncrl.weights.buckets.checksums_match
            return all(x[k] == y[k] for k in ("nonzero", "bits_sum", "bits_xor")) and all(
                math.isclose(x[k], y[k], rel_tol=1e-9, abs_tol=1e-9) for k in ("sum", "sumsq"))

        pushes, ok = {}, True
        for v, s in snd["sent"].items():
            r = rcv["received"].get(v)
            match = r is not None and checksums_match(s["checksum"], r["checksum"]) and s["bytes"] == r["bytes"]
            ok &= match
            pushes[s["name"]] = {"checksum_match": match, "mib": round(s["bytes"] / MiB, 2), "device_arg": s["device_arg"],
                                 "tensor_device": s["tensor_device"], "send_s": s["send_s"], "recv_s": r and r["recv_s"],
                                 "send_mb_per_s": round(s["bytes"] / 1e6 / max(s["send_s"], 1e-9), 1),
                                 "recv_mb_per_s": r and round(r["bytes"] / 1e6 / max(r["recv_s"], 1e-9), 1)}
        return {"ok": ok and len(pushes) == len(rcv["received"]), "trainer_device": snd["trainer_device"], "pushes": pushes}

    def nccl1(self) -> Result:
        doc = self.parts("nccl1", [["--part", "nccl1"]], 60)[0]
        ok = "error" not in doc and doc["roundtrip_equal"] and doc["checksum_equal"] and doc["bucket_device"] == "cuda:0"
        return {"ok": bool(ok), **doc}

    def nccl2(self) -> Result:
        docs = self.parts("nccl2", [["--part", "nccl-send"], ["--part", "nccl-recv"]], 120)
        if all(d.get("joined") for d in docs):
            same = docs[0]["checksum"] == docs[1]["checksum"]
            gbs = [round(docs[0]["bytes"] / 1e9 / s, 2) for s in docs[1]["recv_s"]]
            return {"ok": same, "accepted": True, "checksum_match": same, "recv_gb_per_s": gbs, "ranks": docs}
        text = " ".join(str(d.get("error", "")) + str(d.get("log_tail", "")) for d in docs)
        clear = any(s in text for s in ("Duplicate GPU", "ncclInvalidUsage", "invalid usage"))
        timed_out = any("past the deadline of" in str(d.get("error", "")) for d in docs)
        return {"ok": clear and not timed_out, "accepted": False, "refused_as_expected": clear and not timed_out,
                "ranks": docs}

    def run(self) -> int:
        """The NCCL checks first (no DeepSpeed: a hanging DeepSpeed init cannot take their time), then stage 0 and
        the push, then the other stages (the budget may cut the last ones short, never the first)."""
        self.train_docs: dict[int, Result] = {}
        self.machine = machine()
        print(f"# {json.dumps(self.machine)}", file=sys.stderr, flush=True)
        for name, fn in (("nccl_world1", self.nccl1), ("nccl_two_ranks_one_gpu", self.nccl2)):
            self.check(name, fn if self.a.device == "cuda" else lambda: {"ok": True, "skipped": "no CUDA"})
        stages = sorted(self.a.zero_stages)
        self.check(f"train_zero{stages[0]}", lambda: self.train(stages[0]))
        self.check("push_gloo", self.push)
        for zero in stages[1:]:
            self.check(f"train_zero{zero}", lambda zero=zero: self.train(zero))
        if 0 in stages and len(stages) > 1:  # a comparison needs stage 0 and another stage
            self.check("train_zero_consistency", self.consistency)
        failed = [r["check"] for r in self.results if not r["ok"]]
        print(f"# {len(self.results) - len(failed)}/{len(self.results)} checks ok; failed: {failed}; the parts' logs: "
              f"{self.tmp}", file=sys.stderr)
        return 1 if failed else 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    ap.add_argument("--out", type=Path, default=Path("gpu_check.json"))
    ap.add_argument("--zero-stages", type=int, nargs="+", default=[0, 2, 3])
    ap.add_argument("--steps", type=int, default=4, help="training steps per ZeRO stage")
    ap.add_argument("--tol", type=float, default=2e-3, help="between ZeRO stages: log-prob abs and loss rel tolerance")
    ap.add_argument("--budget-s", type=float, default=None, help="all checks together (default: cuda 420, cpu 1500)")
    ap.add_argument("--timeout-scale", type=float, default=None, help="per-check deadlines x this (cuda 1, cpu 3)")
    ap.add_argument("--part", choices=sorted(PARTS), help=argparse.SUPPRESS)
    for flag, kind in (("--zero", int), ("--tmp", Path), ("--port-file", Path), ("--result", Path)):
        ap.add_argument(flag, type=kind, help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.part:
        run_part(a)
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.budget_s = a.budget_s or (420.0 if a.device == "cuda" else 1500.0)
    a.timeout_scale = a.timeout_scale or (1.0 if a.device == "cuda" else 3.0)
    sys.exit(Runner(a).run())


if __name__ == "__main__":
    main()
