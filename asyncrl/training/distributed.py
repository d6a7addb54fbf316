"""Data-parallel training ranks (SPMD): how rank 0's decisions reach every rank, and how the ranks split a step.

Owns, for the training role run under torchrun with W ranks, every rank running the same step:
- the row split of one step's `TrainBatch` (`shard_micro_batches`, the plan of `asyncrl.training.micro_batches`):
  rank r takes a contiguous share of the rows (shares differ by at most one row) cut into micro batches by count,
  or, under a token budget, every rank packs the whole batch the same way and takes every W-th micro batch; every
  rank gets the SAME number of micro batches, a rank with fewer is padded with all-masked one-row micro batches (loss 0, gradient 0), so every rank runs the same
  number of forward/backward calls (ZeRO 2/3 reduce in buckets during backward and must stay in step);
- the control channel (`ControlChannel`): one `Command` (a JSON header: command, step, free-form `info`, and the
  names, shapes and dtypes of the tensors that follow) from rank 0 as a uint8 tensor, its length first, then each
  tensor by `dist.broadcast`; and the gather of JSON documents (per-rank metric parts) from every rank;
- `Decisions`: what rank 0 alone can decide (it alone reads S3: the checkpoint to resume from, the step's batch,
  checkpoint now, stop), shared with every rank by one `share` call, the same call on every rank.

Invariants:
- nothing is pickled: headers and gathered documents are JSON bytes in uint8 tensors, tensors travel raw with
  their dtype from a fixed allow-list (`DTYPES`);
- every collective has a deadline (`async_op=True` + `work.wait(timeout)`); a missed deadline raises
  `ChannelTimeout` naming what was awaited;
- the channel runs over its own gloo group (CPU tensors, also when the training group is NCCL on GPUs), whose
  process-group timeout is the longest wait any caller asks for, so the per-call deadline is the one that bites;
- rank 0 sends a "stop" out of turn (`Decisions.stop_peers`, when it fails) only while the other ranks wait in
  `share` (`peers_waiting`), never while they may be in another collective of the channel.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field, fields
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch import Tensor

from asyncrl.training.batch import TrainBatch
from asyncrl.training.micro_batches import rank_plans, rank_rows

__all__ = ["rank_rows"]  # re-exported: the row split lives with the rest of the plan (asyncrl.training.micro_batches)

log = logging.getLogger(__name__)

COMMANDS = ("resume", "step", "stop")
MAX_HEADER_BYTES = 1 << 20
DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32, "float64": torch.float64, "float16": torch.float16, "bfloat16": torch.bfloat16,
    "int64": torch.int64, "int32": torch.int32, "uint8": torch.uint8, "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}
# the fields of a TrainBatch a rank needs to zero to make a row trained-on nowhere
_MASKED_FIELDS = ("response_mask", "entropy_mask", "advantages", "token_rewards")


class ChannelTimeout(TimeoutError):
    """A control-channel collective missed its deadline (the peer rank failed or is stuck)."""


# ---- pure: batch split, tensors <-> batch, header bytes -------------------------------------------------------

def micro_batches_per_rank(num_rows: int, world_size: int, micro_batch_size: int) -> int:
    """The number of micro batches every rank runs: that of the largest share (at least 1)."""
    largest = len(rank_rows(num_rows, 0, world_size))
    return max(1, -(-largest // micro_batch_size))


def masked_row(batch: TrainBatch) -> TrainBatch:
    """A one-row micro batch (row 0 of `batch`) on which nothing is trained: its loss and gradient are 0."""
    row = select_rows(batch, 0, 1).split(1)[0]
    parts = {f.name: getattr(row, f.name) for f in fields(row)}
    for name in _MASKED_FIELDS:
        parts[name] = torch.zeros_like(parts[name])
    return TrainBatch(**parts)


def shard_micro_batches(
    batch: TrainBatch, rank: int, world_size: int, micro_batch_size: int, micro_batch_tokens: int | None = None
) -> list[tuple[TrainBatch, bool]]:
    """Rank `rank`'s micro batches of `batch` as (micro batch, is_padding); the same count on every rank.

    The plan is `asyncrl.training.micro_batches.rank_plans`: by count (`micro_batch_tokens` None; with W = 1 this is
    `batch.split(micro_batch_size)`), or packed under `micro_batch_tokens` padded tokens (at most `micro_batch_size`
    rows) and dealt round robin. Each micro batch is trimmed to its longest row. Padding micro batches are
    `masked_row`.
    """
    if batch.num_samples < 1:
        raise ValueError("batch: expected at least one row")
    plans = rank_plans(batch_lengths(batch), world_size, micro_batch_size, micro_batch_tokens)
    n_micro = max(1, max(len(p) for p in plans))
    own = [(batch.rows(mb), False) for mb in plans[rank]]
    if len(own) == n_micro:
        return own
    return own + [(masked_row(batch), True)] * (n_micro - len(own))


def batch_lengths(batch: TrainBatch) -> list[int]:
    """Every row's length (prompt + response tokens), in row order."""
    return (batch.prompt_lengths + batch.response_lengths).tolist()


def select_rows(batch: TrainBatch, start: int, stop: int) -> TrainBatch:
    """Rows `start:stop` of `batch` (columns untouched)."""
    return TrainBatch(**{f.name: getattr(batch, f.name)[start:stop] for f in fields(batch)})


def batch_tensors(batch: TrainBatch) -> dict[str, Tensor]:
    """The batch's tensors by field name, in field order."""
    return {f.name: getattr(batch, f.name) for f in fields(batch)}


def batch_from_tensors(tensors: dict[str, Tensor]) -> TrainBatch:
    """Rebuild a `TrainBatch` from `batch_tensors` output; the names must be exactly the batch's fields."""
    names = [f.name for f in fields(TrainBatch)]
    missing, extra = sorted(set(names) - set(tensors)), sorted(set(tensors) - set(names))
    if missing or extra:
        raise ValueError(f"batch tensors: missing {missing}, unexpected {extra}; expected the TrainBatch fields")
    return TrainBatch(**{n: tensors[n] for n in names})


@dataclass
class Command:
    """One rank 0 → every rank message: `command` in COMMANDS, the training `step`, and JSON `info`."""

    command: str
    step: int
    info: dict[str, Any] = field(default_factory=dict)


def encode_header(cmd: Command, tensors: dict[str, Tensor]) -> Tensor:
    """The header of `cmd` and the tensors that follow it, as JSON bytes in a uint8 tensor."""
    if cmd.command not in COMMANDS:
        raise ValueError(f"command: expected one of {COMMANDS}, got {cmd.command!r}")
    specs = []
    for name, t in tensors.items():
        if t.dtype not in _DTYPE_NAMES:
            raise ValueError(f"tensor {name!r}: dtype {t.dtype} cannot travel; expected one of {sorted(DTYPES)}")
        specs.append({"name": name, "shape": list(t.shape), "dtype": _DTYPE_NAMES[t.dtype]})
    doc = {"command": cmd.command, "step": int(cmd.step), "info": cmd.info, "tensors": specs}
    raw = json.dumps(doc, separators=(",", ":")).encode()
    if len(raw) > MAX_HEADER_BYTES:
        raise ValueError(f"header: {len(raw)} bytes, expected at most {MAX_HEADER_BYTES}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8)


def decode_header(data: Tensor) -> tuple[Command, list[tuple[str, tuple[int, ...], torch.dtype]]]:
    """Parse `encode_header` output: the command and the (name, shape, dtype) of each tensor that follows."""
    try:
        doc = json.loads(bytes(data.numpy().tobytes()).decode())
        cmd = Command(str(doc["command"]), int(doc["step"]), dict(doc["info"]))
        specs = [(str(s["name"]), tuple(int(x) for x in s["shape"]), DTYPES[s["dtype"]]) for s in doc["tensors"]]
    except (ValueError, KeyError, TypeError) as e:
        raise ValueError(f"control header: expected JSON with command, step, info, tensors; {e}") from e
    if cmd.command not in COMMANDS:
        raise ValueError(f"control header: command expected one of {COMMANDS}, got {cmd.command!r}")
    return cmd, specs


def json_bytes(doc: Any) -> Tensor:
    return torch.frombuffer(bytearray(json.dumps(doc, separators=(",", ":")).encode()), dtype=torch.uint8)


# ---- collectives ------------------------------------------------------------------------------------------

def _wait(work: dist.Work | None, timeout_s: float, what: str) -> None:
    if work is None:
        return
    try:
        work.wait(timeout=timedelta(seconds=timeout_s))
    except RuntimeError as e:
        raise ChannelTimeout(f"{what}: not completed within {timeout_s:.0f}s ({e})") from e


class ControlChannel:
    """Rank 0's command broadcast and the ranks' JSON gather over a dedicated gloo group.

    Create it on every rank at the same point (`create` is collective: `dist.new_group`). `group_timeout_s` is
    the process-group timeout: at least the longest `timeout_s` any call will pass.
    """

    def __init__(self, group: dist.ProcessGroup | None, rank: int, world_size: int) -> None:
        self.group, self.rank, self.world_size = group, rank, world_size

    @classmethod
    def create(cls, group_timeout_s: float) -> ControlChannel:
        group = dist.new_group(backend="gloo", timeout=timedelta(seconds=group_timeout_s))
        return cls(group, dist.get_rank(), dist.get_world_size())

    @property
    def is_leader(self) -> bool:
        return self.rank == 0

    def _bcast(self, t: Tensor, timeout_s: float, what: str) -> None:
        _wait(dist.broadcast(t, 0, group=self.group, async_op=True), timeout_s, what)

    def send(self, cmd: Command, tensors: dict[str, Tensor] | None, timeout_s: float) -> None:
        """Rank 0: broadcast `cmd` and then `tensors` (CPU, made contiguous) to every other rank."""
        if not self.is_leader:
            raise RuntimeError("ControlChannel.send: only rank 0 sends commands")
        tensors = {n: t.detach().cpu().contiguous() for n, t in (tensors or {}).items()}
        header = encode_header(cmd, tensors)
        what = f"training rank 0: sending {cmd.command!r} of step {cmd.step}"
        self._bcast(torch.tensor([header.numel()], dtype=torch.int64), timeout_s, what)
        self._bcast(header, timeout_s, what)
        for name, t in tensors.items():
            self._bcast(t, timeout_s, f"{what} (tensor {name!r})")

    def receive(self, timeout_s: float) -> tuple[Command, dict[str, Tensor]]:
        """Ranks 1..W−1: wait up to `timeout_s` for rank 0's next command, then receive its tensors."""
        if self.is_leader:
            raise RuntimeError("ControlChannel.receive: rank 0 sends, it does not receive commands")
        what = f"training rank {self.rank}: waiting for the leader's (rank 0) next command"
        length = torch.zeros(1, dtype=torch.int64)
        self._bcast(length, timeout_s, what)
        n = int(length[0])
        if not 0 < n <= MAX_HEADER_BYTES:
            raise ValueError(f"control header: length {n}, expected 1..{MAX_HEADER_BYTES}")
        header = torch.zeros(n, dtype=torch.uint8)
        self._bcast(header, timeout_s, what)
        cmd, specs = decode_header(header)
        out: dict[str, Tensor] = {}
        for name, shape, dtype in specs:
            t = torch.empty(shape, dtype=dtype)
            self._bcast(t, timeout_s, f"{what} (tensor {name!r} of {cmd.command!r} step {cmd.step})")
            out[name] = t
        return cmd, out

    def all_gather_json(self, doc: Any, timeout_s: float) -> list[Any]:
        """Every rank's `doc` (JSON-serialisable), in rank order, on every rank."""
        data = json_bytes(doc)
        what = f"training rank {self.rank}: gathering JSON from every rank"
        lengths = [torch.zeros(1, dtype=torch.int64) for _ in range(self.world_size)]
        work = dist.all_gather(lengths, torch.tensor([data.numel()], dtype=torch.int64), group=self.group,
                               async_op=True)
        _wait(work, timeout_s, what)
        size = max(int(x[0]) for x in lengths)
        padded = torch.zeros(size, dtype=torch.uint8)
        padded[: data.numel()] = data
        bufs = [torch.zeros(size, dtype=torch.uint8) for _ in range(self.world_size)]
        _wait(dist.all_gather(bufs, padded, group=self.group, async_op=True), timeout_s, what)
        return [json.loads(bytes(b[: int(n[0])].numpy().tobytes()).decode()) for b, n in zip(bufs, lengths,
                                                                                            strict=True)]


class Decisions:
    """Rank 0's decisions on every rank: `share` is one broadcast over the control channel (nothing with W = 1).

    Every rank calls `share` at the same point: rank 0 with its `Command` (and the batch, if any), the others with
    None; they receive both within `wait_s` (`ChannelTimeout` past it). Rank 0 gets back what it passed (its own
    batch, not a copy). `peers_idle()` (every rank, after the step's last collective) marks that the other ranks now
    wait in `share`: until rank 0's next `share`, a failure of rank 0 may still tell them to stop (`stop_peers`).
    """

    def __init__(self, channel: ControlChannel | None, send_timeout_s: float) -> None:
        self.channel = channel
        self.send_timeout_s = send_timeout_s
        self.peers_waiting = False

    @property
    def is_rank0(self) -> bool:
        return self.channel is None or self.channel.is_leader

    def share(self, cmd: Command | None, batch: TrainBatch | None, wait_s: float) -> tuple[Command, TrainBatch | None]:
        if self.channel is None or self.channel.is_leader:
            if cmd is None:
                raise ValueError("Decisions.share: rank 0 decides, it must pass the command")
            if self.channel is not None:
                self.peers_waiting = False
                self.channel.send(cmd, batch_tensors(batch) if batch is not None else None, self.send_timeout_s)
            return cmd, batch
        got, tensors = self.channel.receive(wait_s)
        return got, batch_from_tensors(tensors) if tensors else None

    def peers_idle(self) -> None:
        self.peers_waiting = self.channel is not None and self.channel.is_leader

    def stop_peers(self, step: int) -> None:
        """Rank 0, failing: tell the other ranks to stop, if they wait in `share` (else they miss a deadline)."""
        if not self.peers_waiting:
            return
        try:
            self.share(Command("stop", step, {"failed": True}), None, 0.0)
        except Exception as e:  # the original error is the one to raise
            log.warning("could not tell the other training ranks to stop: %s", e)
