"""Pure wire format of the weight broadcast: bucket planning, packing, unpacking, the JSON manifest,
and the fusing-invariant weights checksum. No I/O, no process groups (see `asyncrl.weights.sync`).

Wire protocol (trainer = rank 0 broadcasts, every generation worker receives):
1. an int64 tensor of shape [1]: the manifest's length L in bytes;
2. a uint8 tensor of shape [L]: the manifest as UTF-8 JSON (never pickle);
3. one uint8 tensor per bucket, of exactly `manifest.bucket_sizes[i]` bytes.

Invariants of a `Manifest` built by `plan_buckets`:
- tensors keep their input order; bucket indexes are non-decreasing along that order;
- every tensor starts at an offset that is a multiple of `ALIGN` inside its bucket, so a byte slice can be
  re-viewed as any dtype without copying;
- a bucket holds at most `bucket_bytes` bytes, except a bucket holding a single tensor larger than
  `bucket_bytes` (such a tensor is never split: the receiver needs it whole to load it);
- a bucket's size is the end of its last tensor (the last bucket is usually smaller than `bucket_bytes`).
"""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

FORMAT = "asyncrl-weights/1"
ALIGN = 16
MAX_MANIFEST_BYTES = 256 * 1024 * 1024

DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float64": torch.float64,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}
_DTYPE_NAMES = {v: k for k, v in DTYPES.items()}


def dtype_name(dtype: torch.dtype) -> str:
    if dtype not in _DTYPE_NAMES:
        raise ValueError(f"weight dtype: expected one of {sorted(DTYPES)}, got {dtype}")
    return _DTYPE_NAMES[dtype]


def wire_tensors(named_tensors: Iterable[tuple[str, torch.Tensor]], dtype: torch.dtype | None
                 ) -> list[tuple[str, torch.Tensor]]:
    """The tensors as they travel to engines that run in `dtype`: every floating-point tensor in another dtype cast
    to it (round to nearest even, as the engine's own load of a float32 checkpoint casts), the rest as they are
    (detached, no copy). None: all as they are. The checksum a trainer publishes is of these tensors, so it stays
    comparable with what the engines received."""
    out = []
    for name, t in named_tensors:
        t = t.detach()
        if dtype is not None and t.is_floating_point() and t.dtype != dtype:
            t = t.to(dtype)
        out.append((name, t))
    return out


def _align(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclass(frozen=True)
class TensorSlot:
    """Where one named tensor lives on the wire: bytes [offset, offset + nbytes) of bucket `bucket`."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    bucket: int
    offset: int
    nbytes: int


@dataclass(frozen=True)
class Manifest:
    version: int
    bucket_bytes: int
    tensors: tuple[TensorSlot, ...]
    bucket_sizes: tuple[int, ...]

    def to_json_bytes(self) -> bytes:
        doc = {
            "format": FORMAT,
            "version": self.version,
            "bucket_bytes": self.bucket_bytes,
            "bucket_sizes": list(self.bucket_sizes),
            "tensors": [
                {"name": t.name, "dtype": t.dtype, "shape": list(t.shape), "bucket": t.bucket, "offset": t.offset,
                 "nbytes": t.nbytes}
                for t in self.tensors
            ],
        }
        return json.dumps(doc, separators=(",", ":")).encode("utf-8")

    @staticmethod
    def from_json_bytes(data: bytes) -> Manifest:
        """Parse and validate a manifest; raises ValueError naming the bad field."""
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise ValueError(f"weight manifest: expected UTF-8 JSON, got undecodable bytes ({e})") from e
        if not isinstance(doc, dict) or doc.get("format") != FORMAT:
            raise ValueError(f"weight manifest.format: expected {FORMAT!r}, got {doc.get('format') if isinstance(doc, dict) else doc!r}")
        sizes = tuple(int(s) for s in doc["bucket_sizes"])
        slots = []
        for i, t in enumerate(doc["tensors"]):
            if t["dtype"] not in DTYPES:
                raise ValueError(f"weight manifest.tensors[{i}].dtype: expected one of {sorted(DTYPES)}, got {t['dtype']!r}")
            shape = tuple(int(d) for d in t["shape"])
            slot = TensorSlot(str(t["name"]), t["dtype"], shape, int(t["bucket"]), int(t["offset"]), int(t["nbytes"]))
            expected = math.prod(shape) * DTYPES[slot.dtype].itemsize
            if slot.nbytes != expected:
                raise ValueError(f"weight manifest.tensors[{i}].nbytes: expected {expected} for {slot.name}, got {slot.nbytes}")
            if not (0 <= slot.bucket < len(sizes)) or slot.offset < 0 or slot.offset + slot.nbytes > sizes[slot.bucket]:
                raise ValueError(f"weight manifest.tensors[{i}]: {slot.name} does not fit in bucket {slot.bucket}")
            slots.append(slot)
        return Manifest(int(doc["version"]), int(doc["bucket_bytes"]), tuple(slots), sizes)


def plan_buckets(
    specs: Sequence[tuple[str, torch.dtype, Sequence[int]]], bucket_bytes: int, version: int
) -> Manifest:
    """Lay tensors (name, dtype, shape) out into buckets greedily, in order (see module invariants)."""
    if bucket_bytes < ALIGN:
        raise ValueError(f"bucket_bytes: expected >= {ALIGN}, got {bucket_bytes}")
    slots: list[TensorSlot] = []
    sizes: list[int] = []
    cursor = 0  # aligned start of the next tensor in the current (last) bucket
    seen: set[str] = set()
    for name, dtype, shape in specs:
        if name in seen:
            raise ValueError(f"weights: duplicate tensor name {name!r}")
        seen.add(name)
        nbytes = math.prod(shape) * dtype.itemsize
        if not sizes or (cursor > 0 and cursor + nbytes > bucket_bytes):
            sizes.append(0)
            cursor = 0
        slots.append(TensorSlot(name, dtype_name(dtype), tuple(int(d) for d in shape), len(sizes) - 1, cursor, nbytes))
        sizes[-1] = cursor + nbytes
        cursor = _align(cursor + nbytes)
    return Manifest(version, bucket_bytes, tuple(slots), tuple(sizes))


def pack_bucket(manifest: Manifest, index: int, tensors: dict[str, torch.Tensor], device: torch.device | str = "cpu") -> torch.Tensor:
    """The bytes of bucket `index`: each tensor's raw bytes at its offset, zero padding in between."""
    buf = torch.zeros(manifest.bucket_sizes[index], dtype=torch.uint8, device=device)
    for slot in manifest.tensors:
        if slot.bucket != index:
            continue
        t = tensors[slot.name]
        if dtype_name(t.dtype) != slot.dtype or tuple(t.shape) != slot.shape:
            raise ValueError(f"weights[{slot.name}]: expected {slot.dtype}{list(slot.shape)}, got {t.dtype}{list(t.shape)}")
        buf[slot.offset : slot.offset + slot.nbytes] = t.detach().contiguous().reshape(-1).view(torch.uint8).to(device)
    return buf


def unpack_bucket(manifest: Manifest, index: int, buf: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
    """Views (no copies) into `buf` of the tensors of bucket `index`, in manifest order."""
    if buf.dtype != torch.uint8 or buf.numel() != manifest.bucket_sizes[index]:
        raise ValueError(f"bucket {index}: expected {manifest.bucket_sizes[index]} uint8 bytes, got {buf.numel()} {buf.dtype}")
    out = []
    for slot in manifest.tensors:
        if slot.bucket == index:
            raw = buf[slot.offset : slot.offset + slot.nbytes]
            out.append((slot.name, raw.view(DTYPES[slot.dtype]).view(slot.shape)))
    return out


def _unique(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[torch.Tensor]:
    seen: set[tuple[int, int, tuple[int, ...]]] = set()
    out = []
    for _, t in named_tensors:
        key = (t.data_ptr(), t.numel(), tuple(t.shape))
        if t.numel() == 0 or key in seen:
            continue
        seen.add(key)
        out.append(t)
    return out


_CHUNK = 1 << 24


def _unsigned_bits(flat: torch.Tensor) -> torch.Tensor:
    """Each element's raw bit pattern as a non-negative int64 (8-byte dtypes: as two 32-bit words)."""
    width = flat.element_size()
    if width == 8:
        return flat.view(torch.int32).to(torch.int64) & 0xFFFFFFFF
    int_view = {1: torch.uint8, 2: torch.int16, 4: torch.int32}[width]
    return flat.view(int_view).to(torch.int64) & ((1 << (8 * width)) - 1)


def weights_checksum(named_tensors: Iterable[tuple[str, torch.Tensor]]) -> dict[str, int | float]:
    """A fingerprint of a set of weights that does not depend on how they are named, split or fused.

    Every component is a sum (or XOR) over all elements of all unique tensors, so it is invariant to
    permuting, concatenating or splitting tensors: vLLM's fused `qkv_proj` (the rows of q, k and v stacked)
    and `gate_up_proj` give the same result as the separate HF tensors, and a tied `lm_head` that shares
    storage with `embed_tokens` is counted once (tensors are deduplicated by storage pointer and shape; the
    HF side lists tied weights once in `named_parameters()`). Elements whose bits are all zero add nothing,
    so zero padding (vLLM pads the vocabulary dimension of embeddings to a multiple of 64) is invisible too.
    Components:
    - `nonzero`: count of elements with a non-zero bit pattern; `bits_sum` (mod 2**64) and `bits_xor`: over each element's raw bit pattern
      read as an unsigned integer (8-byte dtypes: as two 32-bit words): exact, sensitive to every bit, independent of summation order;
    - `sum`, `sumsq`: float64 sums of the values, readable but rounding-order dependent (compare with a
      tolerance, see `checksums_match`).
    Compare checksums of the same dtype only (bit patterns differ between float32 and bfloat16).
    """
    nonzero = 0
    bits_sum = 0
    bits_xor = 0
    total = 0.0
    total_sq = 0.0
    for t in _unique(named_tensors):
        flat = t.detach().reshape(-1).cpu().contiguous()
        bits = _unsigned_bits(flat)
        nonzero += int(torch.count_nonzero(bits))
        bits_xor ^= int(np.bitwise_xor.reduce(bits.numpy())) if bits.numel() else 0
        for i in range(0, bits.numel(), _CHUNK):  # each chunk's int64 sum of 32-bit words cannot overflow
            bits_sum += int(bits[i : i + _CHUNK].sum())
        if flat.is_floating_point():
            f = flat.to(torch.float64)
            total += float(f.sum())
            total_sq += float((f * f).sum())
    return {"nonzero": nonzero, "bits_sum": bits_sum % (1 << 64), "bits_xor": bits_xor, "sum": total, "sumsq": total_sq}


def checksums_match(a: dict[str, int | float], b: dict[str, int | float], rel_tol: float = 1e-9) -> bool:
    """Exact on the integer components, `rel_tol` on the float64 sums."""
    if any(a[k] != b[k] for k in ("nonzero", "bits_sum", "bits_xor")):
        return False
    return all(math.isclose(float(a[k]), float(b[k]), rel_tol=rel_tol, abs_tol=1e-9) for k in ("sum", "sumsq"))
