#!/usr/bin/env python3
"""FP8-B128 edge-case goldens: block amaxes and elements that separate the torch multiplier rule from
fl(448 / amax') (issue 22).

Run:  python3 tests/golden/make_b128_ties_golden.py        (torch optional; see "Oracle")
Writes tests/golden/format/b128_ties_{bf16_16x1448,f32_8x520}_{in,values,scales}.npy.

The reference cast (DeepGEMM `per_block_cast_to_fp8`, vLLM test utils) is `x * (448.0 / amax)` in torch, and
torch evaluates `python scalar / tensor` as `tensor.reciprocal() * scalar`, so the multiplier is
m = fl(fl(1 / amax') * 448) in f32 (spec/formats.md), not fl(448 / amax'). The two differ by one ulp for some
amax (15% of bf16 amax values); an element whose product lands on an E4M3 tie under one multiplier and off it
under the other then changes its byte. Random tensors almost never hit such products, so these inputs are
built for them:
- bf16: the amax mantissas whose two multipliers differ and that separate the most bf16 elements (found by
  a scan over every bf16 element <= amax; the set is the same in every octave), at several exponents; each
  block holds +-amax, every separating element (random signs, repeated), and random fill.
- f32: random f32 amaxes whose multipliers differ; elements x = fl(t / m) for E4M3 midpoints t, kept when
  the two multipliers give different bytes.
The script asserts that the stored bytes differ from the fl(448 / amax') rule on a good share of elements.

Oracle: torch's own ops (`per_block_cast_to_fp8` below, as make_format_golden.py) when torch is importable.
Without torch (the dev machine that wrote the committed files had none), the same f32 operations are
emulated in numpy, each rounded to f32 as torch does: r = fl(1 / amax'), m = fl(r * 448), p = fl(x * m), then
E4M3 round-to-nearest-even from an exact table (no product reaches torch's non-saturating range > 464), and
scale = fl(amax' / 448). numpy's float32 ufuncs are IEEE-correctly rounded, so the emulation is exact.
"""
import os

import numpy as np

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "format")
RNG = np.random.default_rng(20261202)
F = np.float32
MIN_AMAX = F(1e-4)  # torch's clamp(1e-4) on an f32 tensor rounds the bound to f32


def save(name, arr):
    np.save(os.path.join(OUT, name + ".npy"), np.ascontiguousarray(arr))


# ---- E4M3 by an exact table (independent of mxq's bit-trick encoders) -----------------------------------
def _e4m3_table():
    c = np.arange(0x7F)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m * 2.0**-9, (1 + m / 8) * 2.0 ** (e - 7))


E4M3 = _e4m3_table()  # codes 0..0x7E, increasing


def e4m3_rne(x):
    """f32 -> float8_e4m3fn bytes, RNE ties to even, sign of zero kept; |x| <= 464 (torch == spec there)."""
    x = np.asarray(x, np.float32).astype(np.float64)
    a = np.abs(x)
    assert (a <= 464).all()
    hi = np.minimum(np.searchsorted(E4M3, a, side="left"), 0x7E)
    lo = np.maximum(hi - 1, 0)
    d_lo, d_hi = a - E4M3[lo], E4M3[hi] - a
    code = np.where((d_lo < d_hi) | ((d_lo == d_hi) & (lo % 2 == 0)), lo, hi)
    code = np.where(a >= E4M3[0x7E], 0x7E, code)
    return (code | (np.signbit(x).astype(np.int64) << 7)).astype(np.uint8)


def mul_torch(a):  # torch's 448.0 / amax': reciprocal, then times 448, each rounded to f32
    return (F(1) / np.asarray(a, F)).astype(F) * F(448)


def mul_div(a):  # the rule mxq used before issue 22: one f32 division
    return F(448) / np.asarray(a, F)


# ---- oracle ---------------------------------------------------------------------------------------------
def per_block_cast_numpy(x32):
    """x32: f32 [m, n] (exact widening of the input). Returns E4M3 bytes [m, n], f32 scales."""
    m, n = x32.shape
    pm, pn = -(-m // 128) * 128, -(-n // 128) * 128
    xp = np.zeros((pm, pn), F)
    xp[:m, :n] = x32
    xv = xp.reshape(pm // 128, 128, pn // 128, 128)
    amax = np.maximum(np.abs(xv).max(axis=(1, 3), keepdims=True), MIN_AMAX)
    q = e4m3_rne(xv * mul_torch(amax))
    return q.reshape(pm, pn)[:m, :n].copy(), (amax / F(448)).astype(F).reshape(pm // 128, pn // 128)


def per_block_cast_torch(torch, x):  # as make_format_golden.py (DeepGEMM tests / DeepSeek weight cast)
    m, n = x.shape
    pm, pn = -(-m // 128) * 128, -(-n // 128) * 128
    xp = torch.zeros((pm, pn), dtype=x.dtype)
    xp[:m, :n] = x
    xv = xp.view(-1, 128, pn // 128, 128)
    amax = xv.abs().float().amax(dim=(1, 3), keepdim=True).clamp(1e-4)
    q = (xv * (448.0 / amax)).to(torch.float8_e4m3fn)
    return (q.view_as(xp)[:m, :n].contiguous().view(torch.uint8).numpy(),
            (amax / 448.0).view(xv.size(0), xv.size(2)).numpy())


def oracle(x_bits, dtype):
    """x_bits: uint16 (bf16) or uint32 (f32) [m, n] -> (values u8, scales f32, oracle name)."""
    x32 = (x_bits.astype(np.uint32) << 16).view(F) if dtype == "bf16" else x_bits.view(F)
    try:
        import torch  # noqa: PLC0415
    except ImportError:
        return (*per_block_cast_numpy(x32), "numpy emulation of torch's f32 ops")
    t = torch.from_numpy(x32.copy())
    t = t.to(torch.bfloat16) if dtype == "bf16" else t
    return (*per_block_cast_torch(torch, t), f"torch {torch.__version__}")


# ---- inputs ---------------------------------------------------------------------------------------------
def bf16_value(bits):
    return (np.asarray(bits, np.uint32) << 16).view(F)


def bf16_separators(a):
    """Every positive bf16 x <= a whose E4M3 byte differs between the two multipliers."""
    xs = bf16_value(np.arange(1, 0x7F80, dtype=np.uint32))
    xs = xs[xs <= a]
    diff = e4m3_rne(xs * mul_torch(a)) != e4m3_rne(xs * mul_div(a))
    return (xs[diff].view(np.uint32) >> 16).astype(np.uint16)


def best_bf16_mantissas(count):
    scored = []
    for man in range(128):
        a = bf16_value(0x3F80 | man)[()]
        if mul_torch(a) != mul_div(a):
            scored.append((len(bf16_separators(a)), man))
    scored.sort(reverse=True)
    return [man for _, man in scored[:count]]


def fill_block(shape, amax_bits, separators, lead_sign):
    """One block of bf16 bits: amax at [0, 0], separators (random signs) over ~3/4 of the rest, random bf16
    below amax in the remaining quarter."""
    flat = np.zeros(shape, np.uint16).reshape(-1)
    n = flat.size
    amax = bf16_value(amax_bits)[()]
    rand = (RNG.standard_normal(n).astype(F) * amax / F(3)).clip(-amax, amax)
    rand_bits = (rand.view(np.uint32) >> 16).astype(np.uint16)  # truncation keeps |x| <= amax
    sep = np.resize(separators, n)
    sep = sep | (RNG.integers(0, 2, n).astype(np.uint16) << 15)
    flat[:] = np.where(RNG.random(n) < 0.75, sep, rand_bits)
    flat[0] = amax_bits | (lead_sign << 15)
    return flat.reshape(shape)


def bf16_case():
    rows, cols = 16, 11 * 128 + 40  # note: 12 column blocks, the last one short (40 columns)
    mans = best_bf16_mantissas(6)
    exps = [-12, -6, -1, 0, 3, 9, 15, 40, -30, 1, 5, -3]  # note: amax' >= 1e-4 > 2^-14, so no clamp
    x = np.zeros((rows, cols), np.uint16)
    for cb in range(12):
        man, e = mans[cb % len(mans)], exps[cb]
        amax_bits = np.uint16(((127 + e) << 7) | man)
        seps = bf16_separators(bf16_value(amax_bits)[()])
        assert len(seps) > 0
        x[:, cb * 128:(cb + 1) * 128] = fill_block(x[:, cb * 128:(cb + 1) * 128].shape, amax_bits, seps, cb % 2)
    return x


def f32_case():
    rows, cols = 8, 4 * 128 + 8  # note: 5 column blocks, the last one short (8 columns)
    x = np.zeros((rows, cols), F)
    mids = ((E4M3[1:] + E4M3[:-1]) / 2)
    mids = mids[mids >= 2.0**-9].astype(F)  # note: the tie points t, exact in f32
    cb = 0
    while cb < 5:
        a = F(np.exp2(RNG.uniform(-10, 10)))
        m1, m0 = mul_torch(a), mul_div(a)
        if m1 == m0:
            continue
        cand = np.concatenate([mids / m1, mids / m0]).astype(F)
        cand = cand[(cand > 0) & (cand < a)]
        cand = cand[e4m3_rne(cand * m1) != e4m3_rne(cand * m0)]
        if len(cand) < 16:
            continue
        block = x[:, cb * 128:(cb + 1) * 128].reshape(-1)
        n = block.size
        vals = np.resize(cand, n) * np.where(RNG.random(n) < 0.5, F(-1), F(1))
        rand = (RNG.standard_normal(n).astype(F) * a / F(3)).clip(-a, a)
        block[:] = np.where(RNG.random(n) < 0.75, vals, rand)
        block[0] = -a if cb % 2 else a
        x[:, cb * 128:(cb + 1) * 128] = block.reshape(rows, -1)
        cb += 1
    return x.view(np.uint32)


def main():
    os.makedirs(OUT, exist_ok=True)
    for dtype, bits in [("bf16", bf16_case()), ("f32", f32_case())]:
        values, scales, name = oracle(bits, dtype)
        rows, cols = bits.shape
        x32 = (bits.astype(np.uint32) << 16).view(F) if dtype == "bf16" else bits.view(F)
        # the old rule's bytes, to show the golden separates the rules
        xp = np.zeros((-(-rows // 128) * 128, -(-cols // 128) * 128), F)
        xp[:rows, :cols] = x32
        xv = xp.reshape(xp.shape[0] // 128, 128, xp.shape[1] // 128, 128)
        amax = np.maximum(np.abs(xv).max(axis=(1, 3), keepdims=True), MIN_AMAX)
        old = e4m3_rne(xv * mul_div(amax)).reshape(xp.shape)[:rows, :cols]
        differ = float((old != values).mean())
        assert differ > 0.05, f"{dtype}: only {differ:.2%} of bytes separate the rules"
        tag = f"b128_ties_{dtype}_{rows}x{cols}"
        save(tag + "_in", bits)
        save(tag + "_values", values)
        save(tag + "_scales", np.ascontiguousarray(scales, F))
        print(f"{tag}: oracle {name}; {differ:.1%} of bytes differ from fl(448 / amax')")


if __name__ == "__main__":
    main()
