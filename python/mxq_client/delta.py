"""The mxq refit delta wire format, trainer side. docs/refit-format.md is the normative text; this module writes
the same body bytes as the C++ writer (src/refit/delta_format.cpp) for the same planes. Dependencies: numpy,
zstandard, xxhash."""

from __future__ import annotations

import struct
from dataclasses import dataclass, field

import numpy as np
import xxhash
import zstandard

MAGIC = b"MXQDELTA"
WIRE_VERSION = 1
# Canonical plane geometry per format: (element bits, block rows, block cols, scale bytes); 0 scale = plain.
FORMATS = {
    "bf16": (16, 1, 1, 0), "f16": (16, 1, 1, 0), "f32": (32, 1, 1, 0),
    "mxfp8": (8, 1, 32, 1), "mxfp4": (4, 1, 32, 1), "fp8-b128": (8, 128, 128, 4),
}
GAPS, BITMAP, RUNS = 0, 1, 2
_PLANE_HEADER = 17  # encoding byte + u64 changed count + u64 index byte count


def canonical_checksum(values: np.ndarray, scales: np.ndarray | None = None) -> int:
    """XXH3-64, seed 0, over the values plane bytes then the scales plane bytes, one stream."""
    h = xxhash.xxh3_64()
    h.update(np.ascontiguousarray(values).view(np.uint8).tobytes())
    if scales is not None:
        h.update(np.ascontiguousarray(scales).view(np.uint8).tobytes())
    return h.intdigest()


def entry_bytes(fmt: str, plane: str) -> int:
    bits, _, _, scale = FORMATS[fmt]
    return scale if plane == "scales" else max(1, bits // 8)


def plane_geometry(fmt: str, shape: tuple[int, ...]) -> tuple[int, int]:
    """(values bytes, scales bytes) of the canonical planes; leading dims of a quantized tensor are a batch."""
    if fmt not in FORMATS:
        raise ValueError(f"format {fmt!r} cannot be carried by a delta")
    bits, br, bc, sb = FORMATS[fmt]
    if any(d < 0 for d in shape):
        raise ValueError(f"negative dimension in {shape}")
    n = int(np.prod(shape, dtype=object)) if shape else 1
    if sb == 0:
        return n * bits // 8, 0
    if len(shape) < 2:
        raise ValueError(f"a {fmt} tensor needs rank >= 2, got {len(shape)}")
    rows, cols = shape[-2], shape[-1]
    if br == 1 and cols % bc:
        raise ValueError(f"K = {cols} is not a multiple of {bc} ({fmt})")
    batch = n // (rows * cols) if rows and cols else 0
    return (batch * rows * ((cols * bits + 7) // 8),
            batch * -(-rows // br) * -(-cols // bc) * sb)


@dataclass
class PlaneDelta:
    indices: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # entry indices, increasing
    data: bytes = b""  # new bytes: len(indices) entries, or the whole plane for an anchor


@dataclass
class TensorDelta:
    name: str
    format: str
    shape: tuple[int, ...]
    anchor: bool
    checksum: int
    values: PlaneDelta
    scales: PlaneDelta


@dataclass
class Delta:
    base_version: int
    new_version: int
    tensors: list[TensorDelta]


# ---- index encodings ---------------------------------------------------------------------------------------
def _varint(v: int) -> bytes:
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)


def _varints(v: np.ndarray) -> bytes:
    """The varints of every value of v (non-negative int64), back to back; vectorized: one pass per byte
    position, not a Python loop per index (a 1% delta of an 8B model has ~70 M indices)."""
    v = np.asarray(v, np.int64).reshape(-1)
    if v.size == 0:
        return b""
    sizes = _varint_sizes(v)
    starts = np.cumsum(sizes) - sizes
    out = np.empty(int(sizes.sum()), np.uint8)
    for k in range(int(sizes.max())):
        sel = np.flatnonzero(sizes > k)
        group = (v[sel] >> (7 * k)) & 0x7F
        out[starts[sel] + k] = group | np.where(sizes[sel] > k + 1, 0x80, 0)
    return out.tobytes()


def _varint_sizes(v: np.ndarray) -> np.ndarray:
    size = np.ones(v.shape, np.int64)
    for k in range(1, 10):
        size += v >= (1 << (7 * k))
    return size


def _runs(idx: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(starts, lengths) of the maximal runs of consecutive indices."""
    if idx.size == 0:
        return idx, idx
    breaks = np.flatnonzero(np.diff(idx) != 1) + 1
    starts = idx[np.concatenate(([0], breaks))]
    ends = idx[np.concatenate((breaks - 1, [idx.size - 1]))] + 1
    return starts, ends - starts


def _run_skips(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    prev_end = np.concatenate(([0], (starts + lengths)[:-1]))
    return starts - prev_end


def encoded_size(enc: int, idx: np.ndarray, entries: int) -> int:
    if enc == GAPS:
        return int(_varint_sizes(np.diff(idx, prepend=0)).sum()) if idx.size else 0
    if enc == BITMAP:
        return (entries + 7) // 8
    starts, lengths = _runs(idx)
    return int(_varint_sizes(_run_skips(starts, lengths)).sum() + _varint_sizes(lengths).sum())


def choose_encoding(idx: np.ndarray, entries: int) -> int:
    """Smallest encoding, ties to the lower code; an empty set is GAPS."""
    if idx.size == 0:
        return GAPS
    sizes = [encoded_size(e, idx, entries) for e in (GAPS, BITMAP, RUNS)]
    return sizes.index(min(sizes))


def encode_indices(enc: int, idx: np.ndarray, entries: int) -> bytes:
    if enc == GAPS:
        return _varints(np.diff(idx, prepend=0))
    if enc == BITMAP:
        bits = np.zeros(-(-entries // 8) * 8, np.uint8)
        bits[idx] = 1
        return np.packbits(bits, bitorder="little").tobytes()
    starts, lengths = _runs(idx)
    return _varints(np.stack([_run_skips(starts, lengths), lengths], 1))  # note: skip, length, skip, ...


def _read_varint(buf: bytes, pos: int) -> tuple[int, int]:
    v, shift = 0, 0
    while True:
        if pos >= len(buf) or shift >= 63:
            raise ValueError("varint cut off or over 63 bits")
        b = buf[pos]
        pos += 1
        v |= (b & 0x7F) << shift
        if not b & 0x80:
            if b == 0 and shift:
                raise ValueError("non-minimal varint")
            if v >= 1 << 63:
                raise ValueError("varint exceeds 2^63 - 1")
            return v, pos
        shift += 7


def decode_indices(enc: int, buf: bytes, count: int, entries: int) -> np.ndarray:
    out: list[int] = []
    if enc == GAPS:
        pos, prev = 0, 0
        for k in range(count):
            v, pos = _read_varint(buf, pos)
            if k and v == 0:
                raise ValueError(f"index {prev} repeats (W-02)")
            prev = prev + v if k else v
            out.append(prev)
        if pos != len(buf):
            raise ValueError("bytes left after gap-coded indices")
    elif enc == BITMAP:
        if len(buf) != (entries + 7) // 8:
            raise ValueError("bitmap size differs from the plane")
        idx = np.flatnonzero(np.unpackbits(np.frombuffer(buf, np.uint8), bitorder="little"))
        out = idx.tolist()
        if len(out) != count:
            raise ValueError(f"bitmap sets {len(out)} bits, record says {count} (W-03)")
    elif enc == RUNS:
        pos, end = 0, 0
        while pos < len(buf):
            skip, pos = _read_varint(buf, pos)
            length, pos = _read_varint(buf, pos)
            if (out and skip == 0) or length == 0:
                raise ValueError("empty or touching run")
            if length > count - len(out) or end + skip + length > entries:
                raise ValueError("runs pass the changed count or the plane end (W-01/W-03)")
            out.extend(range(end + skip, end + skip + length))
            end += skip + length
        if len(out) != count:
            raise ValueError(f"runs cover {len(out)} entries, record says {count} (W-03)")
    else:
        raise ValueError(f"index encoding {enc} is not one of 0, 1, 2")
    idx = np.asarray(out, np.int64)
    _check_indices(idx, entries, "decoded indices")
    return idx


# ---- trainer-side diff ---------------------------------------------------------------------------------------
def changed_entries(old: np.ndarray, new: np.ndarray, width: int) -> np.ndarray:
    """Indices of the `width`-byte entries that differ between two planes of equal size."""
    a = np.ascontiguousarray(old).view(np.uint8).reshape(-1, width)
    b = np.ascontiguousarray(new).view(np.uint8).reshape(-1, width)
    return np.flatnonzero((a != b).any(axis=1)).astype(np.int64)


def _check_indices(idx: np.ndarray, entries: int, what: str) -> None:
    if idx.size and (idx.min() < 0 or idx.max() >= entries):
        raise ValueError(f"{what}: index outside [0, {entries}) (W-01)")
    d = np.diff(idx)
    if (d == 0).any():
        raise ValueError(f"{what}: duplicate index (W-02)")
    if (d < 0).any():
        raise ValueError(f"{what}: indices must increase (W-04)")


def _check_new_entries(fmt: str, plane: str, data: bytes, what: str) -> None:
    """W-05 policy, as the C++ validator: no E4M3 NaN code, no 0xFF E8M0 scale (0x00 = 2^-127 is legal), f32
    scales finite and > 0, plain floats finite."""
    raw = np.frombuffer(data, np.uint8)
    if plane == "scales":
        bad = (raw == 0xFF) if FORMATS[fmt][3] == 1 else ~(np.isfinite(raw.view("<f4")) & (raw.view("<f4") > 0))
    elif fmt in ("mxfp8", "fp8-b128"):
        bad = (raw & 0x7F) == 0x7F
    elif fmt in ("bf16", "f16", "f32"):
        as_f = {"bf16": lambda r: (r.view("<u2").astype(np.uint32) << 16).view("<f4"),
                "f16": lambda r: r.view("<f2"), "f32": lambda r: r.view("<f4")}[fmt](raw)
        bad = ~np.isfinite(as_f)
    else:
        return
    if bad.any():
        raise ValueError(f"{what}: entry {int(np.flatnonzero(bad)[0])} of the new bytes is refused (W-05)")


def _sparse(old: np.ndarray, new: np.ndarray, width: int) -> PlaneDelta:
    idx = changed_entries(old, new, width)
    rows = np.ascontiguousarray(new).view(np.uint8).reshape(-1, width)
    return PlaneDelta(idx, rows[idx].tobytes())


def _u8(a: np.ndarray | None) -> np.ndarray:
    return np.zeros(0, np.uint8) if a is None else np.ascontiguousarray(a).reshape(-1).view(np.uint8)


def diff_tensor(name: str, fmt: str, shape: tuple[int, ...], old: tuple | None, new: tuple,
                force_anchor: bool = False) -> TensorDelta:
    """The record taking canonical planes old=(values, scales) to new=(values, scales); scales None for plain
    formats. Anchor for a new tensor, when forced, or when the sparse record is no smaller (as the C++ encoder)."""
    vb, sb = plane_geometry(fmt, tuple(shape))
    nv, ns = _u8(new[0]), _u8(new[1])
    if nv.size != vb or ns.size != sb:
        raise ValueError(f"{name}: planes of {nv.size} + {ns.size} bytes, expected {vb} + {sb}")
    t = TensorDelta(name, fmt, tuple(int(d) for d in shape), False, canonical_checksum(nv, ns), PlaneDelta(),
                    PlaneDelta())
    if old is not None and not force_anchor:
        ov, os_ = _u8(old[0]), _u8(old[1])
        if ov.size != vb or os_.size != sb:
            raise ValueError(f"{name}: old planes of {ov.size} + {os_.size} bytes, expected {vb} + {sb}")
        t.values = _sparse(ov, nv, entry_bytes(fmt, "values"))
        if sb:
            t.scales = _sparse(os_, ns, entry_bytes(fmt, "scales"))
        if _sparse_record_bytes(t) < vb + sb:
            return t
    t.anchor = True
    t.values, t.scales = PlaneDelta(data=nv.tobytes()), PlaneDelta(data=ns.tobytes())
    return t


def _planes(t: TensorDelta):
    yield "values", t.values
    if FORMATS[t.format][3]:
        yield "scales", t.scales


def _entries(t: TensorDelta, plane: str) -> int:
    vb, sb = plane_geometry(t.format, t.shape)
    return (vb if plane == "values" else sb) // entry_bytes(t.format, plane)


def _sparse_record_bytes(t: TensorDelta) -> int:
    total = 0
    for plane, p in _planes(t):
        entries = _entries(t, plane)
        total += _PLANE_HEADER + encoded_size(choose_encoding(p.indices, entries), p.indices, entries) + len(p.data)
    return total


# ---- body and file -------------------------------------------------------------------------------------------
def encode_body(delta: Delta) -> bytes:
    if delta.new_version <= delta.base_version:
        raise ValueError("new version must exceed the base version (W-12)")
    out = [struct.pack("<QQI", delta.base_version, delta.new_version, len(delta.tensors))]
    seen = set()
    for t in delta.tensors:
        name = t.name.encode()
        if not 1 <= len(name) <= 4096 or any(ch < 0x20 or ch == 0x7F for ch in name) or t.name in seen:
            raise ValueError(f"{t.name!r}: bad or repeated tensor name")
        seen.add(t.name)
        fmt = t.format.encode()
        out.append(struct.pack(f"<H{len(name)}sB{len(fmt)}sB", len(name), name, len(fmt), fmt, len(t.shape)))
        out.append(struct.pack(f"<{len(t.shape)}q", *t.shape))
        out.append(struct.pack("<BQ", 1 if t.anchor else 0, t.checksum))
        vb, sb = plane_geometry(t.format, t.shape)
        for plane, p in _planes(t):
            _check_new_entries(t.format, plane, p.data, f"{t.name} {plane}")
            if t.anchor:
                if len(p.data) != (vb if plane == "values" else sb):
                    raise ValueError(f"{t.name}: anchor {plane} of the wrong size (W-08)")
                out.append(p.data)
                continue
            entries, width = _entries(t, plane), entry_bytes(t.format, plane)
            raw_idx = np.asarray(p.indices)
            if raw_idx.ndim != 1 or (raw_idx.size and not np.issubdtype(raw_idx.dtype, np.integer)):
                raise ValueError(f"{t.name} {plane}: indices must be a 1-D integer array, got "
                                 f"{raw_idx.ndim}-D {raw_idx.dtype} (W-03)")
            idx = raw_idx.astype(np.int64)
            _check_indices(idx, entries, f"{t.name} {plane}")
            if len(p.data) != idx.size * width:
                raise ValueError(f"{t.name} {plane}: {idx.size} indices but {len(p.data)} new bytes (W-03)")
            enc = choose_encoding(idx, entries)
            index_data = encode_indices(enc, idx, entries)
            out.append(struct.pack("<BQQ", enc, idx.size, len(index_data)))
            out.append(index_data)
            out.append(p.data)
    return b"".join(out)


RAW_BODY = 1  # header flags bit 0: the body follows the header as it is, no zstd frame (refit-format.md §1)


def wrap_body(body: bytes, level: int | None = 3) -> bytes:
    """The delta file of an encoded body: zstd at `level`; level 0 stores the body raw (flags bit 0), which
    costs the reader no decompression; None chooses: raw when zstd-1 shrinks a 1 MiB sample by less than 20%
    (near-random fp8 bytes and index gaps: 1% changed entries shrink about 7%), else zstd-3."""
    if level is None:
        sample = body[len(body) // 2:len(body) // 2 + (1 << 20)]
        small = len(zstandard.ZstdCompressor(level=1).compress(sample)) if sample else 0
        level = 0 if small > 0.8 * len(sample) else 3
    head = MAGIC + struct.pack("<IIQQ", WIRE_VERSION, RAW_BODY if level == 0 else 0, len(body),
                               xxhash.xxh3_64_intdigest(body))
    if level == 0:
        return head + body
    return head + zstandard.ZstdCompressor(level=level, write_content_size=True).compress(body)


def write_delta(delta: Delta, level: int | None = 3) -> bytes:
    """The delta file of `delta` (wrap_body's `level`)."""
    return wrap_body(encode_body(delta), level)


def decode_body(body: bytes) -> Delta:
    base, new, count = struct.unpack_from("<QQI", body, 0)
    pos = 20
    tensors = []
    for _ in range(count):
        (nlen,) = struct.unpack_from("<H", body, pos)
        name = body[pos + 2:pos + 2 + nlen].decode()
        pos += 2 + nlen
        flen = body[pos]
        fmt = body[pos + 1:pos + 1 + flen].decode()
        pos += 1 + flen
        rank = body[pos]
        shape = struct.unpack_from(f"<{rank}q", body, pos + 1)
        pos += 1 + 8 * rank
        kind, checksum = struct.unpack_from("<BQ", body, pos)
        pos += 9
        t = TensorDelta(name, fmt, tuple(shape), kind == 1, checksum, PlaneDelta(), PlaneDelta())
        vb, sb = plane_geometry(fmt, t.shape)
        for plane, _ in list(_planes(t)):
            if t.anchor:
                size = vb if plane == "values" else sb
                p = PlaneDelta(data=body[pos:pos + size])
                pos += size
            else:
                enc, n, ilen = struct.unpack_from("<BQQ", body, pos)
                pos += 17
                idx = decode_indices(enc, body[pos:pos + ilen], n, _entries(t, plane))
                pos += ilen
                size = n * entry_bytes(fmt, plane)
                p = PlaneDelta(idx, body[pos:pos + size])
                pos += size
            setattr(t, plane, p)
        tensors.append(t)
    if pos != len(body):
        raise ValueError(f"{len(body) - pos} bytes after the last record")
    return Delta(base, new, tensors)


def read_delta(data: bytes) -> Delta:
    if len(data) < 32 or data[:8] != MAGIC:
        raise ValueError("not an mxq delta")
    version, flags, body_bytes, body_hash = struct.unpack_from("<IIQQ", data, 8)
    if version != WIRE_VERSION or flags & ~RAW_BODY:
        raise ValueError(f"wire version {version} flags {flags}, expected {WIRE_VERSION} and 0 or 1")
    if flags & RAW_BODY:
        body = bytes(data[32:])
    else:
        body = zstandard.ZstdDecompressor().decompress(data[32:], max_output_size=body_bytes)
    if len(body) != body_bytes or xxhash.xxh3_64_intdigest(body) != body_hash:
        raise ValueError("body size or XXH3-64 differs from the header")
    return decode_body(body)
