#!/usr/bin/env python3
"""Golden files for the format module (tests/format/*), from oracles mxq did not write.

Run on a machine with torch + compressed-tensors (not CI):  python3 tests/golden/make_format_golden.py
Writes tests/golden/format/*.npy (small; the C++ tests compare bytes against them).

Oracles:
- torch float8_e4m3fn / float8_e5m2 / float8_e8m0fnu / bfloat16 / float16 casts (decode of every code and
  encode of f32 sweeps, inside the range where torch's cast does not overflow to NaN/inf).
- compressed-tensors (installed package): FP4 cast + pack (E2M1 encode), calculate_qparams + quantize +
  quantize_and_pack_fp4 + compress_mx_scale (MXFP4 and the MXFP8 "ct" rule).
- vLLM `_mxfp8_e4m3_quantize_torch` (vllm/model_executor/layers/quantization/utils/mxfp8_utils.py, newer
  version; rule "ceil"), re-typed here in torch since vLLM is not installed.
- older vLLM torch path (vllm-project/vllm@00134422, same file): `torch.floor(torch.log2(amax)) + 127`
  (rule "floor").
- microxcaling `mx/mx_ops.py` `_shared_exponents` (floor(log2 amax) - emax, emax = 8 for E4M3) with
  saturate_normals, elements cast by torch (rule "ocp").
- DeepGEMM / DeepSeek `per_block_cast_to_fp8` (128x128, amax.clamp(1e-4), x * (448 / amax), scale amax/448)
  on ragged shapes (FP8-B128).
"""
import math
import os

import numpy as np
import torch
from compressed_tensors.compressors.mx_utils import compress_mx_scale
from compressed_tensors.compressors.nvfp4.helpers import pack_fp4_to_uint8, quantize_and_pack_fp4
from compressed_tensors.quantization import QuantizationArgs, QuantizationType
from compressed_tensors.quantization.lifecycle.forward import quantize as ct_quantize
from compressed_tensors.quantization.utils.fp4_utils import cast_to_fp4
from compressed_tensors.quantization.utils.helpers import calculate_qparams

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "format")
FLT_MIN = torch.finfo(torch.float32).tiny
RNG = np.random.default_rng(20261129)


def save(name, arr):
    np.save(os.path.join(OUT, name + ".npy"), np.ascontiguousarray(arr))


def f32(bits):
    return np.asarray(bits, dtype=np.uint32).view(np.float32)


def bytes_of(t):
    return t.contiguous().view(torch.uint8).numpy()


# ---- element codecs ------------------------------------------------------------------------------------
def decode_tables():
    codes = torch.arange(256, dtype=torch.uint8)
    for name, dt in [("e4m3", torch.float8_e4m3fn), ("e5m2", torch.float8_e5m2), ("e8m0", torch.float8_e8m0fnu)]:
        save(f"decode_{name}", codes.view(dt).float().numpy().view(np.uint32))
    # compressed-tensors' own unpack of all 16 nibbles (low nibble first)
    e2m1 = torch.tensor([[c | (c << 4) for c in range(16)]], dtype=torch.uint8)
    save("decode_e2m1", ct_unpack(e2m1)[0, 0::2].numpy().view(np.uint32))


def ct_unpack(packed):
    from compressed_tensors.compressors.nvfp4.helpers import unpack_fp4_from_uint8
    return unpack_fp4_from_uint8(packed, packed.shape[0], packed.shape[1] * 2, dtype=torch.float32)


def grid_sweep(values, limit):
    """Every representable value, every midpoint, the midpoints +- 1 f32 ulp, negated; |x| <= limit."""
    v = np.unique(np.abs(values[np.isfinite(values)]).astype(np.float64))
    mids = (v[1:] + v[:-1]) / 2
    pts = np.concatenate([v, mids]).astype(np.float32)
    pts = np.concatenate([pts, np.nextafter(pts, np.float32(np.inf)), np.nextafter(pts, np.float32(0))])
    pts = pts[pts <= limit]
    return np.concatenate([pts, -pts])


def f32_extras(limit, count):
    """Log-uniform random magnitudes, f32 denormals, +-0."""
    mags = np.exp2(RNG.uniform(-30, math.log2(limit), count)).astype(np.float32)
    signs = np.where(RNG.random(count) < 0.5, -1, 1).astype(np.float32)
    denorm = f32([1, 2, 3, 0x400000, 0x7FFFFF, 0x80000001, 0x807FFFFF])
    return np.concatenate([mags * signs, denorm, f32([0, 0x80000000])])


def encode_sweeps():
    codes = torch.arange(256, dtype=torch.uint8)
    for name, dt, limit in [("e4m3", torch.float8_e4m3fn, 464.0), ("e5m2", torch.float8_e5m2, 57344.0)]:
        # note: torch's cast is not saturating: e4m3 > 464 and e5m2 >= 61440 leave the sweep (spec saturates)
        x = np.concatenate([grid_sweep(codes.view(dt).float().numpy(), limit), f32_extras(limit, 3000)])
        save(f"encode_{name}_in", x.view(np.uint32))
        save(f"encode_{name}_out", bytes_of(torch.from_numpy(x).to(dt)))
    # bf16 / f16: random bit patterns over the whole finite f32 range plus the ties of each format
    rand = RNG.integers(0, 0x7F800000, 6000, dtype=np.uint32) | (RNG.integers(0, 2, 6000, dtype=np.uint32) << 31)
    ties16 = (RNG.integers(0x00010000, 0x7F7F0000, 1000, dtype=np.uint32) & 0xFFFF0000) | 0x8000
    ties16 = np.concatenate([ties16, ties16 | 0x10000])
    f16_ties = (RNG.integers(0x33000000, 0x477F0000, 1000, dtype=np.uint32) & 0xFFFFE000) | 0x1000
    x = np.concatenate([f32(rand), f32(ties16), f32(f16_ties), f32_extras(60000.0, 2000),
                        np.float32([65504, 65519, 65520, 1e9, -1e9, 2.0**-24, 2.0**-25, 3 * 2.0**-26])])
    save("encode_16_in", x.view(np.uint32))
    save("encode_bf16_out", bytes_of(torch.from_numpy(x).to(torch.bfloat16)).view(np.uint16))
    save("encode_f16_out", bytes_of(torch.from_numpy(x).to(torch.float16)).view(np.uint16))
    # E2M1: compressed-tensors' CPU cast_to_fp4 followed by its pack_fp4_to_uint8 (pairs -> one byte)
    e2m1 = np.float32([0, 0.5, 1, 1.5, 2, 3, 4, 6])
    x = np.concatenate([grid_sweep(e2m1, 8.0), f32_extras(16.0, 2000), np.float32([-1e-3, -0.2, -0.25, 100])])
    x = x[: len(x) // 2 * 2]
    save("encode_e2m1_in", x.view(np.uint32))
    save("encode_e2m1_packed", pack_fp4_to_uint8(cast_to_fp4(torch.from_numpy(x).clone()).reshape(1, -1))[0].numpy())


# ---- MX block quantizers -------------------------------------------------------------------------------
# note: the C++ test rebuilds these blocks from the same integer recipe, so only outputs are stored.
BLOCK_DELTAS = [0, 1, 2, 3, 5, 8, 13, 21, 0x40, 0x41, 0x80, 0x81, 0xC0, 0x100, 0x180, 0x200, 0x280, 0x300,
                0x380, 0x400, 0x480, 0x500, 0x600, 0x700, 0x800, 0x900, 0xA00, 0xB00, 0xC00, 0xE00, 0x1000, 0x7F7F]
ELEMENT_SUBSET_STRIDE = 37


def amax_blocks():
    """Block i: amax bits a = i + 1 (every positive finite bf16); element j = bf16 bits max(a - d_j, 0),
    negated for odd j (so the last one is -0)."""
    a = np.arange(1, 0x7F80, dtype=np.int64)[:, None]
    bits = np.maximum(a - np.array(BLOCK_DELTAS, dtype=np.int64)[None, :], 0)
    bits |= (np.arange(32) % 2 == 1)[None, :].astype(np.int64) << 15
    return torch.from_numpy(bits.astype(np.uint16).view(np.int16)).view(torch.bfloat16)


def element_subset():
    a = np.arange(1, 0x7F80)
    return np.nonzero((a % ELEMENT_SUBSET_STRIDE == 0) | (a < 0x80) | (a > 0x7F00))[0]


def vllm_ceil(x):  # vLLM _mxfp8_e4m3_quantize_torch, 2-D [rows, K]
    xb = x.to(torch.float32).view(x.shape[0], -1, 32)
    amax = xb.abs().amax(dim=-1).clamp(min=FLT_MIN)
    b = (torch.ceil(torch.log2(amax / 448.0)) + 127.0).clamp(0, 254)
    q = (xb / torch.exp2(b - 127.0).unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn)
    return b.to(torch.uint8), q


def vllm_floor(x):  # older vLLM torch path: floor(log2(amax)) + 127
    xb = x.to(torch.float32).view(x.shape[0], -1, 32)
    amax = xb.abs().amax(dim=-1).clamp(min=FLT_MIN)
    b = (torch.floor(torch.log2(amax)) + 127.0).clamp(0, 254)
    q = (xb / torch.exp2(b - 127.0).unsqueeze(-1)).view(x.shape).to(torch.float8_e4m3fn)
    return b.to(torch.uint8), q


def ocp_reference(x):  # microxcaling: shared_exp = floor(log2(amax)) - emax, clamp at -127, saturate normals
    xb = x.to(torch.float32).view(x.shape[0], -1, 32)
    amax = xb.abs().amax(dim=-1)
    e = torch.floor(torch.log2(amax + FLT_MIN * (amax == 0))) - 8
    e = e.clamp(min=-127)
    q = (xb / torch.exp2(e).unsqueeze(-1)).clamp(-448, 448).view(x.shape).to(torch.float8_e4m3fn)
    return (e + 127).to(torch.uint8), q


def ct_args(bits):
    return QuantizationArgs(num_bits=bits, type=QuantizationType.FLOAT, strategy="group", group_size=32,
                            symmetric=True, scale_dtype=torch.uint8, zp_dtype=torch.uint8)


def ct_scales(x, args):
    g = x.view(x.shape[0], -1, 32)
    scale, zp = calculate_qparams(torch.amin(g, dim=-1), torch.amax(g, dim=-1), args)
    return scale, zp, compress_mx_scale(scale, torch.uint8)


def ct_mxfp8(x):
    args = ct_args(8)
    scale, zp, b = ct_scales(x, args)
    return b, ct_quantize(x, scale, zp, args, dtype=torch.float8_e4m3fn)


def ct_mxfp4(x):
    scale, _, b = ct_scales(x, ct_args(4))
    return b, quantize_and_pack_fp4(x, scale, group_size=32)


MX_ORACLES = {"mxfp8_ceil": vllm_ceil, "mxfp8_floor": vllm_floor, "mxfp8_ocp": ocp_reference,
              "mxfp8_ct": ct_mxfp8, "mxfp4_ct": ct_mxfp4}


def mx_goldens():
    blocks, subset = amax_blocks(), element_subset()
    for name, oracle in MX_ORACLES.items():
        b, q = oracle(blocks.reshape(-1, 32))
        save(f"amax_{name}_scale", b.reshape(-1).numpy())
        save(f"amax_{name}_elems", bytes_of(q).reshape(blocks.shape[0], -1)[subset])
    # random tensors with a per-row magnitude spread; f32 input for MXFP8 (checked against the exact
    # ceil(log2) so a float log2 ulp error cannot slip into the golden), bf16 for MXFP4
    mag = torch.from_numpy(np.exp2(RNG.uniform(-40, 40, (16, 1)))).float()
    x32 = torch.from_numpy(RNG.standard_normal((16, 256)).astype(np.float32)) * mag
    for name in ["mxfp8_ceil", "mxfp8_floor", "mxfp8_ocp", "mxfp8_ct"]:
        b, q = MX_ORACLES[name](x32)
        if name == "mxfp8_ceil":
            amax = x32.view(16, -1, 32).abs().amax(-1).numpy()
            exact = [exact_ceil_log2(float(np.float32(a) / np.float32(448))) + 127 for a in amax.reshape(-1)]
            assert np.array_equal(np.clip(exact, 0, 254), b.reshape(-1).numpy()), "float log2 ulp case: reseed"
        save(f"random_{name}_scale", b.numpy())
        save(f"random_{name}_elems", bytes_of(q))
    save("random_f32_in", x32.numpy().view(np.uint32))
    x16 = (torch.from_numpy(RNG.standard_normal((16, 256)).astype(np.float32)) * mag).to(torch.bfloat16)
    b, q = ct_mxfp4(x16)
    save("random_bf16_in", bytes_of(x16).view(np.uint16))
    save("random_mxfp4_ct_scale", b.numpy())
    save("random_mxfp4_ct_elems", q.numpy())


def exact_ceil_log2(q):
    m, e = math.frexp(q)  # q = m * 2^e, m in [0.5, 1)
    return e - 1 if m == 0.5 else e


# ---- FP8-B128 ------------------------------------------------------------------------------------------
def per_block_cast_to_fp8(x):  # DeepGEMM tests / DeepSeek weight cast, 128x128 blocks, ragged edges padded
    m, n = x.shape
    pm, pn = -(-m // 128) * 128, -(-n // 128) * 128
    xp = torch.zeros((pm, pn), dtype=x.dtype)
    xp[:m, :n] = x
    xv = xp.view(-1, 128, pn // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
    return q.view_as(xp)[:m, :n].contiguous(), (amax / 448.0).view(xv.size(0), xv.size(2))


B128_CASES = [("bf16", 1, 1), ("bf16", 3, 300), ("bf16", 129, 131), ("bf16", 130, 7), ("f32", 40, 140)]


def b128_goldens():
    for dtype, rows, cols in B128_CASES:
        x = torch.from_numpy(RNG.standard_normal((rows, cols)).astype(np.float32))
        x *= torch.from_numpy(np.exp2(RNG.uniform(-8, 8, (rows, 1)))).float()
        if rows > 128 and cols > 128:
            x[128:, :128] = 0  # an all-zero block: amax clamps to 1e-4
            x[:128, 128:] *= 1e-7  # a tiny block below the clamp
        x = x.to(torch.bfloat16 if dtype == "bf16" else torch.float32)
        q, s = per_block_cast_to_fp8(x)
        tag = f"b128_{dtype}_{rows}x{cols}"
        save(tag + "_in", bytes_of(x).view(np.uint16 if dtype == "bf16" else np.uint32).reshape(rows, cols))
        save(tag + "_values", bytes_of(q))
        save(tag + "_scales", s.numpy())


if __name__ == "__main__":
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    decode_tables()
    encode_sweeps()
    mx_goldens()
    b128_goldens()
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total} bytes, to {OUT}")
