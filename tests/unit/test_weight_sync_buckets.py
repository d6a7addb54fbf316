"""Bucket planning, packing and unpacking of the weight broadcast; the fusing-invariant checksum."""

from __future__ import annotations

import pytest
import torch

from asyncrl.weights.buckets import (
    ALIGN,
    Manifest,
    TensorSlot,
    checksums_match,
    pack_bucket,
    plan_buckets,
    unpack_bucket,
    weights_checksum,
    wire_tensors,
)


def test_plan_exact_layout() -> None:
    specs = [
        ("a", torch.float32, (3,)),  # 12 bytes at 0
        ("b", torch.bfloat16, (5,)),  # 10 bytes at 16 (aligned), ends at 26
        ("c", torch.float32, (10,)),  # 40 bytes: 32 + 40 > 64 -> new bucket
        ("d", torch.int64, (2, 2)),  # 32 bytes: at 48 in bucket 1? 48 + 32 = 80 > 64 -> new bucket
        ("e", torch.uint8, (100,)),  # 100 bytes > 64: a bucket of its own
        ("f", torch.float16, (1,)),  # 2 bytes: new bucket after the oversized one
    ]
    m = plan_buckets(specs, bucket_bytes=64, version=7)
    assert ALIGN == 16
    assert m.version == 7 and m.bucket_bytes == 64
    assert m.tensors == (
        TensorSlot("a", "float32", (3,), 0, 0, 12),
        TensorSlot("b", "bfloat16", (5,), 0, 16, 10),
        TensorSlot("c", "float32", (10,), 1, 0, 40),
        TensorSlot("d", "int64", (2, 2), 2, 0, 32),
        TensorSlot("e", "uint8", (100,), 3, 0, 100),
        TensorSlot("f", "float16", (1,), 4, 0, 2),
    )
    assert m.bucket_sizes == (26, 40, 32, 100, 2)


def test_plan_fills_bucket_to_the_byte() -> None:
    m = plan_buckets([("a", torch.float32, (4,)), ("b", torch.float32, (4,))], bucket_bytes=32, version=1)
    assert [(t.bucket, t.offset) for t in m.tensors] == [(0, 0), (0, 16)]
    assert m.bucket_sizes == (32,)


def test_plan_rejects_duplicates_and_unknown_dtypes() -> None:
    with pytest.raises(ValueError, match="duplicate tensor name 'a'"):
        plan_buckets([("a", torch.float32, (1,)), ("a", torch.float32, (1,))], 64, 1)
    with pytest.raises(ValueError, match="weight dtype"):
        plan_buckets([("a", torch.complex64, (1,))], 64, 1)


def test_pack_unpack_roundtrip_is_bit_exact() -> None:
    g = torch.Generator().manual_seed(0)
    tensors = {
        "w": torch.randn(7, 5, generator=g),
        "b": torch.randn(3, generator=g).to(torch.bfloat16),
        "i": torch.arange(6, dtype=torch.int64).reshape(2, 3),
        "t": torch.randn(4, 4, generator=g).t(),  # non-contiguous input
    }
    m = plan_buckets([(n, t.dtype, tuple(t.shape)) for n, t in tensors.items()], bucket_bytes=160, version=3)
    got = {}
    for i in range(len(m.bucket_sizes)):
        buf = pack_bucket(m, i, tensors)
        assert buf.dtype == torch.uint8 and buf.numel() == m.bucket_sizes[i]
        for name, t in unpack_bucket(m, i, buf):
            got[name] = t.clone()
    assert list(got) == list(tensors)
    for name, t in tensors.items():
        assert got[name].dtype == t.dtype and got[name].shape == t.shape
        assert torch.equal(got[name].view(-1).view(torch.uint8), t.contiguous().view(-1).view(torch.uint8))


def test_pack_bytes_and_zero_padding() -> None:
    a = torch.tensor([1], dtype=torch.int32)
    b = torch.tensor([2], dtype=torch.int16)
    m = plan_buckets([("a", a.dtype, (1,)), ("b", b.dtype, (1,))], bucket_bytes=64, version=1)
    buf = pack_bucket(m, 0, {"a": a, "b": b})
    assert buf.tolist() == [1, 0, 0, 0] + [0] * 12 + [2, 0]  # little-endian, b aligned to 16


def test_pack_rejects_wrong_shape() -> None:
    m = plan_buckets([("a", torch.float32, (2,))], 64, 1)
    with pytest.raises(ValueError, match=r"weights\[a\]: expected float32\[2\]"):
        pack_bucket(m, 0, {"a": torch.zeros(3)})


def test_manifest_json_roundtrip_and_validation() -> None:
    m = plan_buckets([("x", torch.float32, (2, 3)), ("y", torch.bfloat16, (4,))], 1024, version=5)
    data = m.to_json_bytes()
    assert b"pickle" not in data and data.startswith(b"{")
    assert Manifest.from_json_bytes(data) == m
    bad = data.replace(b'"nbytes":24', b'"nbytes":25')
    with pytest.raises(ValueError, match=r"tensors\[0\]\.nbytes: expected 24"):
        Manifest.from_json_bytes(bad)
    with pytest.raises(ValueError, match="format"):
        Manifest.from_json_bytes(b'{"format": "other"}')
    with pytest.raises(ValueError, match="UTF-8 JSON"):
        Manifest.from_json_bytes(b"\xff\xfe")


def test_checksum_exact_small_values() -> None:
    # 1.0 = 0x3F800000, 2.0 = 0x40000000, -1.0 = 0xBF800000
    c = weights_checksum([("a", torch.tensor([1.0, 2.0])), ("b", torch.tensor([-1.0]))])
    assert c["nonzero"] == 3
    assert c["bits_sum"] == 0x3F800000 + 0x40000000 + 0xBF800000
    assert c["bits_xor"] == 0x3F800000 ^ 0x40000000 ^ 0xBF800000
    assert c["sum"] == 2.0 and c["sumsq"] == 6.0


def test_checksum_invariant_to_fusing_and_tying() -> None:
    g = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(8, 4, generator=g) for _ in range(3))
    gate, up = torch.randn(6, 4, generator=g), torch.randn(6, 4, generator=g)
    emb = torch.randn(10, 4, generator=g)
    hf = [("q", q), ("k", k), ("v", v), ("gate", gate), ("up", up), ("embed", emb)]
    fused = [("qkv", torch.cat([q, k, v])), ("gate_up", torch.cat([gate, up])), ("embed", emb), ("lm_head", emb)]
    a, b = weights_checksum(hf), weights_checksum(fused)
    assert a["nonzero"] == b["nonzero"] == 3 * 32 + 2 * 24 + 40  # the tied lm_head is counted once
    assert (a["bits_sum"], a["bits_xor"]) == (b["bits_sum"], b["bits_xor"])
    assert checksums_match(a, b)
    padded = [("qkv", torch.cat([q, k, v])), ("gate_up", torch.cat([gate, up])), ("embed", torch.cat([emb, torch.zeros(6, 4)]))]
    assert weights_checksum(padded) == b  # vocabulary padding with zero rows is invisible
    changed = [("qkv", torch.cat([q, k, v]).clone()), ("gate_up", torch.cat([gate, up])), ("embed", emb)]
    changed[0][1][3, 2] = torch.nextafter(changed[0][1][3, 2], torch.tensor(10.0))  # one ulp
    assert not checksums_match(a, weights_checksum(changed))


def test_wire_tensors_cast_floating_point_only_and_round_to_nearest_even() -> None:
    half_ulp, three_quarter_ulp = 1.0 + 2.0**-8, 1.0 + 3 * 2.0**-9  # bf16 spacing at 1.0 is 2**-7
    w = torch.tensor([half_ulp, three_quarter_ulp, -2.0], dtype=torch.float32)
    ids = torch.tensor([3, 4], dtype=torch.int64)
    already = torch.tensor([0.5], dtype=torch.bfloat16)
    out = dict(wire_tensors([("w", w), ("ids", ids), ("b", already)], torch.bfloat16))
    assert out["w"].dtype == torch.bfloat16 and out["w"].tolist() == [1.0, 1.0078125, -2.0]  # a tie goes to even
    assert out["ids"] is not ids and out["ids"].data_ptr() == ids.data_ptr()  # detached, not copied
    assert out["b"].data_ptr() == already.data_ptr()
    # what an engine in bf16 holds after loading the float32 tensor (a copy into its bf16 parameter) is bit-identical
    loaded = torch.empty(3, dtype=torch.bfloat16).copy_(w)
    assert weights_checksum([("w", loaded)]) == weights_checksum([("w", out["w"])])
    assert weights_checksum([("w", w)]) != weights_checksum([("w", out["w"])])
    same = wire_tensors([("w", w)], None)
    assert same[0][1].dtype == torch.float32 and same[0][1].data_ptr() == w.data_ptr()


def test_rendezvous_refuses_an_address_this_host_does_not_have() -> None:
    from asyncrl.weights.sync import WeightSyncError, listen_socket

    with pytest.raises(WeightSyncError, match="master_addr: cannot listen on '203.0.113.7'"):
        listen_socket("203.0.113.7")  # TEST-NET-3: never an address of this machine
    sock = listen_socket("127.0.0.1")
    try:
        assert sock.getsockname()[0] == "127.0.0.1" and sock.getsockname()[1] > 0
    finally:
        sock.close()
