#!/usr/bin/env python3
"""Independent numpy quantizers (the default rules of shared/spec/formats.md) for checking the numbers that
tools/refit_sparsity.py reads from `mxq delta make` / `mxq delta inspect`.

The device run measures with the mxq binary itself; this module exists so the measurement path can be checked
without a GPU: `python3 tools/refit_sparsity_ref.py` first checks these quantizers byte for byte against the
golden oracles in tests/golden/format (vLLM ceil rule, compressed-tensors MXFP4, DeepSeek 128x128 cast), then
tools/refit_sparsity.py --selftest compares per-tensor changed-entry counts of mxq deltas with counts from these
quantizers. Dependencies: numpy, ml_dtypes.
"""
import os
import sys

import ml_dtypes
import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
GOLDEN = os.path.join(ROOT, "tests", "golden", "format")
FLT_MIN = np.float32(np.finfo(np.float32).tiny)


def bf16_to_f32(bits_u16):
    return (np.asarray(bits_u16, np.uint16).astype(np.uint32) << 16).view(np.float32)


def f32_to_bf16_bits(x):
    return np.asarray(x, np.float32).astype(ml_dtypes.bfloat16).view(np.uint16)


def _e4m3(x):
    """f32 -> E4M3 bytes, RNE, saturating at +-448, sign of zero kept."""
    return np.clip(x, -448, 448).astype(ml_dtypes.float8_e4m3fn).view(np.uint8)


def _exact_ceil_log2(q):
    m, e = np.frexp(q.astype(np.float64))  # q = m * 2^e, m in [0.5, 1); q > 0 here
    return np.where(m == 0.5, e - 1, e)


def mxfp8_ceil(x):
    """x f32 [rows, K], K % 32 == 0 -> (values u8 [rows, K], scales u8 [rows, K/32])."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    q = (np.maximum(amax, FLT_MIN) / np.float32(448)).astype(np.float32)
    b = np.clip(_exact_ceil_log2(q) + 127, 0, 254).astype(np.int64)
    mul = np.ldexp(np.float32(1), (127 - b)).astype(np.float32)[..., None]
    # note: 2^(127-b) reaches 2^127 for b = 0: a tiny block is scaled up, still exact in f32
    return _e4m3((xb * mul).reshape(rows, k)), b.astype(np.uint8)


_E2M1_GRID = np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6])


def _e2m1_codes(x):
    """f32 -> E2M1 codes, RNE to the nearest code (ties to the even code), saturating at +-6; a negative value
    rounding to zero is code 8 (-0), an input of +-0 is code 0."""
    a = np.minimum(np.abs(x), np.float32(6)).astype(np.float64)
    d = np.abs(a[..., None] - _E2M1_GRID.astype(np.float64))
    best = d.min(axis=-1, keepdims=True)
    cand = d == best
    # ties: prefer the even code (grid index even); otherwise the unique nearest
    even = cand & (np.arange(8) % 2 == 0)
    idx = np.where(cand.sum(-1) > 1, np.argmax(even, axis=-1), np.argmax(cand, axis=-1)).astype(np.uint8)
    neg = (x < 0)
    return np.where(neg, idx | 8, idx).astype(np.uint8)


def mxfp4_ct(x):
    """x f32 [rows, K] -> (packed values u8 [rows, K/2], scales u8 [rows, K/32])."""
    rows, k = x.shape
    xb = x.reshape(rows, k // 32, 32)
    amax = np.abs(xb).max(axis=-1)
    m, e = np.frexp(amax.astype(np.float64))  # amax = (2m) * 2^(e-1)
    b = np.where(amax == 0, 0, np.clip(127 + (e - 1) - 2 + (2 * m >= 1.75), 0, 254)).astype(np.int64)
    mul = np.ldexp(np.float32(1), (127 - b)).astype(np.float32)[..., None]
    codes = _e2m1_codes((xb * mul).reshape(rows, k))
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), b.astype(np.uint8)


def fp8_b128(x):
    """x f32 [rows, K] -> (values u8 [rows, K], scales f32 [cdiv(rows,128), cdiv(K,128)])."""
    rows, k = x.shape
    br, bc = -(-rows // 128), -(-k // 128)
    pad = np.zeros((br * 128, bc * 128), np.float32)
    pad[:rows, :k] = x
    blocks = pad.reshape(br, 128, bc, 128)
    amax = np.maximum(np.abs(blocks).max(axis=(1, 3)), np.float32(1e-4)).astype(np.float32)
    # note: m = fl(fl(1 / amax') * 448), torch's evaluation of the reference's 448.0 / amax (formats.md)
    mul = ((np.float32(1) / amax).astype(np.float32) * np.float32(448)).astype(np.float32)
    vals = _e4m3((blocks * mul[:, None, :, None]).astype(np.float32)).reshape(br * 128, bc * 128)[:rows, :k]
    return np.ascontiguousarray(vals), (amax / np.float32(448)).astype(np.float32)


QUANTIZERS = {"mxfp8": mxfp8_ceil, "mxfp4": mxfp4_ct, "fp8-b128": fp8_b128}


def check_golden():
    """Byte-compare the quantizers with the golden oracle outputs; returns a list of (name, ok)."""
    g = lambda n: np.load(os.path.join(GOLDEN, n + ".npy"))  # noqa: E731
    out = []
    x32 = g("random_f32_in").view(np.float32)
    v, s = mxfp8_ceil(x32)
    out.append(("mxfp8 ceil random f32", np.array_equal(v, g("random_mxfp8_ceil_elems").reshape(v.shape))
                and np.array_equal(s, g("random_mxfp8_ceil_scale").reshape(s.shape))))
    x16 = bf16_to_f32(g("random_bf16_in"))
    v, s = mxfp4_ct(x16)
    out.append(("mxfp4 ct random bf16", np.array_equal(v, g("random_mxfp4_ct_elems").reshape(v.shape))
                and np.array_equal(s, g("random_mxfp4_ct_scale").reshape(s.shape))))
    # every positive finite bf16 as a block amax (make_format_golden.py amax_blocks / element_subset)
    deltas = [0, 1, 2, 3, 5, 8, 13, 21, 0x40, 0x41, 0x80, 0x81, 0xC0, 0x100, 0x180, 0x200, 0x280, 0x300,
              0x380, 0x400, 0x480, 0x500, 0x600, 0x700, 0x800, 0x900, 0xA00, 0xB00, 0xC00, 0xE00, 0x1000, 0x7F7F]
    a = np.arange(1, 0x7F80, dtype=np.int64)[:, None]
    bits = np.maximum(a - np.array(deltas, dtype=np.int64)[None, :], 0)
    bits |= (np.arange(32) % 2 == 1)[None, :].astype(np.int64) << 15
    blocks = bf16_to_f32(bits.astype(np.uint16))
    a1 = a[:, 0]
    subset = np.nonzero((a1 % 37 == 0) | (a1 < 0x80) | (a1 > 0x7F00))[0]
    for name, fn in (("mxfp8_ceil", mxfp8_ceil), ("mxfp4_ct", mxfp4_ct)):
        v, s = fn(blocks)
        # note: compressed-tensors overflows for amax >= 1.75 * 2^127 (its scale rounds up to inf); the spec
        # pins b = 253 there, so those blocks are left out of the MXFP4 comparison (as in the C++ test).
        keep = np.ones(len(a1), bool) if name == "mxfp8_ceil" else np.abs(blocks).max(1) < 1.75 * 2.0**127
        out.append((f"{name} amax sweep", np.array_equal(s.reshape(-1)[keep], g(f"amax_{name}_scale").reshape(-1)[keep])
                    and np.array_equal(v[subset][keep[subset]], g(f"amax_{name}_elems")[keep[subset]])))
    for tag in ("b128_bf16_1x1", "b128_bf16_3x300", "b128_bf16_129x131", "b128_bf16_130x7", "b128_f32_40x140"):
        raw = g(tag + "_in")
        x = raw.view(np.float32) if raw.dtype == np.uint32 else bf16_to_f32(raw)
        v, s = fp8_b128(x)
        out.append((tag, np.array_equal(v, g(tag + "_values").reshape(v.shape))
                    and np.array_equal(s, g(tag + "_scales").reshape(s.shape))))
    return out


if __name__ == "__main__":
    results = check_golden()
    for name, ok in results:
        print(f"{'ok  ' if ok else 'FAIL'} {name}")
    sys.exit(0 if all(ok for _, ok in results) else 1)
