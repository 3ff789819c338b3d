"""mxq's quantizers, byte-exact with src/format (spec: formats.md), for numpy arrays and torch tensors.

One algorithm, two array backends: every step is integer bit arithmetic on int32 views of f32 values, an f32
multiply, an f32 add or an f32 division, written once against the small `_Ops` shim below, so the numpy path
(tested in CI against the C++ codecs and `mxq quantize`) and the torch path (CUDA or CPU tensors, on the
trainer's device) run the same operations. Outputs are the canonical planes as numpy uint8 arrays: values
(E4M3 bytes, or packed E2M1 nibbles) and scales (E8M0 bytes, or little-endian f32 bytes for FP8-B128).
"""

from __future__ import annotations

import numpy as np

QUANTIZED = ("mxfp8", "mxfp4", "fp8-b128")
PLAIN = ("bf16", "f16", "f32")
RULES = ("ceil", "ocp", "floor", "ct")
DEFAULT_RULE = {"mxfp8": "ceil", "mxfp4": "ct"}

_ABS = 0x7FFFFFFF
_INF = 0x7F800000
_B128_MIN_AMAX = 1e-4  # note: DeepSeek clamps the f32 amax at 1e-4 rounded to f32 (as the C++ kB128MinAmax)


class _NumpyOps:
    name = "numpy"

    @staticmethod
    def i32(x):  # f32 -> int32 bit view
        return x.view(np.int32)

    @staticmethod
    def f32(x):  # int32 -> f32 bit view
        return x.view(np.float32)

    minimum, maximum = staticmethod(np.minimum), staticmethod(np.maximum)

    @staticmethod
    def where(c, a, b):  # note: every select here picks int32 codes; np.where widens python ints to int64
        return np.where(c, a, b).astype(np.int32, copy=False)

    @staticmethod
    def clamp(x, lo, hi):
        return np.clip(x, lo, hi)

    @staticmethod
    def amax(x, axes):
        return x.max(axis=axes)

    @staticmethod
    def div(num, den):  # f32 num / den, correctly rounded; either may be a python float
        return np.divide(np.float32(num), np.float32(den), dtype=np.float32)

    @staticmethod
    def u8(x):
        return x.astype(np.uint8)

    @staticmethod
    def pad(x, rows, cols):
        return np.pad(x, [(0, 0)] * (x.ndim - 2) + [(0, rows), (0, cols)])

    @staticmethod
    def any(x):
        return bool(x.any())

    @staticmethod
    def to_numpy(x):
        return np.ascontiguousarray(x)

    @staticmethod
    def flat_u8(x):
        return np.ascontiguousarray(x).reshape(-1).view(np.uint8)


class _TorchOps:
    """The same operations in torch. note: torch turns `tensor / python scalar` into a multiply by the
    reciprocal on CUDA, and `scalar / tensor` into reciprocal() * scalar (formats.md), so every division here
    is tensor / tensor of equal shape (IEEE division on CPU and CUDA, torch builds without fast-math)."""
    name = "torch"

    def __init__(self, torch):
        self.t = torch

    def i32(self, x):
        return x.view(self.t.int32)

    def f32(self, x):
        return x.view(self.t.float32)

    def where(self, c, a, b):
        t = self.t
        ref = c
        a = a if isinstance(a, t.Tensor) else t.full_like(ref, a, dtype=t.int32)
        b = b if isinstance(b, t.Tensor) else t.full_like(ref, b, dtype=t.int32)
        return t.where(c, a, b)

    def minimum(self, a, b):
        return self.t.clamp(a, max=b) if not isinstance(b, self.t.Tensor) else self.t.minimum(a, b)

    def maximum(self, a, b):
        return self.t.clamp(a, min=b) if not isinstance(b, self.t.Tensor) else self.t.maximum(a, b)

    def clamp(self, x, lo, hi):
        return self.t.clamp(x, lo, hi)

    def amax(self, x, axes):
        return self.t.amax(x, dim=axes)

    def div(self, num, den):
        t = self.t
        ref = num if isinstance(num, t.Tensor) else den
        num = num if isinstance(num, t.Tensor) else t.full_like(ref, num, dtype=t.float32)
        den = den if isinstance(den, t.Tensor) else t.full_like(ref, den, dtype=t.float32)
        return t.div(num, den)

    def u8(self, x):
        return x.to(self.t.uint8)

    def pad(self, x, rows, cols):
        return self.t.nn.functional.pad(x, (0, cols, 0, rows))

    def any(self, x):
        return bool(x.any())

    def to_numpy(self, x):
        return x.contiguous().cpu().numpy()

    def flat_u8(self, x):
        return x.contiguous().reshape(-1).view(self.t.uint8)


def _is_torch(x) -> bool:
    return type(x).__module__.startswith("torch")


def _ops_for(x):
    if _is_torch(x):
        import torch  # noqa: PLC0415  (optional dependency, imported only for torch inputs)
        return _TorchOps(torch)
    return _NumpyOps()


# ---- source widening ----------------------------------------------------------------------------------------
def source_dtype(x) -> str:
    """mxq's name of an input's element type: bf16, f16 or f32 (anything else is refused by the callers)."""
    if _is_torch(x):
        return {"torch.bfloat16": "bf16", "torch.float16": "f16", "torch.float32": "f32"}.get(str(x.dtype),
                                                                                            str(x.dtype))
    dt = np.asarray(x).dtype
    if dt.name == "bfloat16":  # ml_dtypes' numpy bfloat16
        return "bf16"
    return {"float16": "f16", "float32": "f32"}.get(dt.name, dt.name)


def widen_f32(x, name: str = "tensor"):
    """bf16 / f16 / f32 -> f32, exact (numpy bf16 is ml_dtypes' bfloat16; a torch tensor stays on its device)."""
    src = source_dtype(x)
    if src not in PLAIN:
        raise ValueError(f"{name}: dtype {src} cannot be quantized, expected bf16, f16 or f32")
    if _is_torch(x):
        return x.detach().float().contiguous()
    a = np.ascontiguousarray(x)
    if src == "bf16":
        return (a.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    return a.astype(np.float32)


# ---- element encoders (element_encode.h) ---------------------------------------------------------------------
def _round_normal(a, shift: int, bias: int):
    lsb = (a >> shift) & 1
    return (a - ((127 - bias) << 23) + ((1 << (shift - 1)) - 1) + lsb) >> shift


def _round_subnormal(ops, a, magic_bits: int):
    # note: |x| + C with ulp(C) = the target's subnormal step rounds with the FPU's own RNE (one rounding)
    magic = float(np.int32(magic_bits).view(np.float32))
    return ops.i32(ops.f32(a) + magic) - magic_bits


def _e4m3(ops, xf):
    """E4M3 codes (int32) of f32 values: RNE, saturating to +-448, NaN -> 0x7F|sign, sign of zero kept."""
    bits = ops.i32(xf)
    a = bits & _ABS
    sign = (bits >> 24) & 0x80
    normal = ops.minimum(_round_normal(a, 20, 7), 0x7E)  # note: 0x7E = 448; past the 464 tie saturates
    sub = _round_subnormal(ops, a, 0x46800000)  # note: 2^14, whose ulp is 2^-9
    return ops.where(a < 0x3C800000, sub, ops.where(a > _INF, 0x7F, normal)) | sign


def _e5m2(ops, xf):
    bits = ops.i32(xf)
    a = bits & _ABS
    sign = (bits >> 24) & 0x80
    normal = ops.minimum(_round_normal(a, 21, 15), 0x7B)  # note: 0x7B = 57344
    sub = _round_subnormal(ops, a, 0x43000000)
    return ops.where(a < 0x38800000, sub, ops.where(a > _INF, 0x7F, normal)) | sign


def _e2m1(ops, scaled, sign_src):
    """E2M1 codes: RNE to the nearest code (ties to the even code), saturating at 6; bit 3 from sign_src < 0."""
    a = ops.f32(ops.i32(scaled) & _ABS)
    # note: midpoints 0.25 .. 5; `>` where the lower code is even (it wins the tie), `>=` where the upper is
    parts = [a > 0.25, a >= 0.75, a > 1.25, a >= 1.75, a > 2.5, a >= 3.5, a > 5.0]
    mag = _sum_bool(ops, parts)
    return mag | ops.where(sign_src < 0, 8, 0)


def _sum_bool(ops, parts):
    total = None
    for p in parts:
        v = ops.where(p, 1, 0)
        total = v if total is None else total + v
    return total


def _e8m0_ceil(ops, abs_bits):
    """E8M0 round-up of |x| from its bits (finite input): exponent, +1 when any mantissa bit is set, <= 254."""
    e = abs_bits >> 23
    man = abs_bits & 0x7FFFFF
    b = ops.where(e != 0, e + ops.where(man != 0, 1, 0), ops.where(man > 0x400000, 1, 0))
    return ops.minimum(b, 254)


def encode_e4m3(x) -> np.ndarray:
    ops = _ops_for(x)
    return ops.to_numpy(ops.u8(_e4m3(ops, _as_f32(ops, x))))


def encode_e5m2(x) -> np.ndarray:
    ops = _ops_for(x)
    return ops.to_numpy(ops.u8(_e5m2(ops, _as_f32(ops, x))))


def encode_e2m1(x) -> np.ndarray:
    """E2M1 codes of f32 values, one per byte (unpacked); see `pack_e2m1`."""
    ops = _ops_for(x)
    xf = _as_f32(ops, x)
    return ops.to_numpy(ops.u8(_e2m1(ops, xf, xf)))


def pack_e2m1(codes: np.ndarray) -> np.ndarray:
    """Byte j = element 2j in bits 3:0, element 2j+1 in bits 7:4 (formats.md)."""
    c = np.asarray(codes, np.uint8)
    return (c[..., 0::2] | (c[..., 1::2] << 4)).astype(np.uint8)


def encode_e8m0(x) -> np.ndarray:
    ops = _ops_for(x)
    a = ops.i32(_as_f32(ops, x)) & _ABS
    return ops.to_numpy(ops.u8(ops.where(a > _INF, 0xFF, _e8m0_ceil(ops, a))))


def encode_bf16(x) -> np.ndarray:
    """f32 -> bf16 bits (uint16): RNE, overflow carries into inf, NaN stays NaN (codec.cpp f32_to_bf16)."""
    # note: u32 arithmetic is enough: a non-NaN word plus 0x8000 stays below 2^32 (NaN words are replaced)
    xf = np.ascontiguousarray(x, np.float32).view(np.uint32)
    lsb = (xf >> 16) & 1
    with np.errstate(over="ignore"):
        out = ((xf + np.uint32(0x7FFF) + lsb) >> 16).astype(np.uint16)
    nan = (xf & _ABS) > _INF
    return np.where(nan, ((xf >> 16) | 0x40).astype(np.uint16), out)


def encode_f16(x) -> np.ndarray:
    """f32 -> f16 bits (uint16): RNE, overflow -> inf (IEEE conversion, as codec.cpp f32_to_f16)."""
    with np.errstate(over="ignore"):
        return np.ascontiguousarray(x, np.float32).astype(np.float16).view(np.uint16)


def _as_f32(ops, x):
    if ops.name == "numpy":
        return np.ascontiguousarray(x, np.float32)
    return x.float().contiguous()


# ---- block quantizers (quantize.cpp) -------------------------------------------------------------------------
def _refuse_nan_block(name, amax_i32, block_rows, block_cols, rows, cols, batch_shape, ops):
    """NaN/Inf in a block: the first block (batch, block row, block col) in order, named as the C++ does.
    note: one scalar read on the device path (torch), the block map only once a block is bad."""
    if not ops.any(amax_i32 >= _INF):
        return
    bad = np.asarray(ops.to_numpy(amax_i32 >= _INF))
    pos = np.unravel_index(int(np.flatnonzero(bad.reshape(-1))[0]), bad.shape)
    b, br, bc = (int(np.ravel_multi_index(pos[:-2], bad.shape[:-2])) if bad.ndim > 2 else 0), int(pos[-2]), \
        int(pos[-1])
    r0, c0 = br * block_rows, bc * block_cols
    msg = (f"{name}: block ({br}, {bc}) holds NaN/Inf (rows {r0}..{min(rows, r0 + block_rows) - 1}, "
           f"cols {c0}..{min(cols, c0 + block_cols) - 1})")
    if len(batch_shape):
        msg += f" (expert {b})"
    raise ValueError(msg)


def _mx_scale(ops, rule: str, fp4: bool, amax):
    """E8M0 scale codes of the blocks from their amax bits (finite)."""
    e = amax >> 23
    man = amax & 0x7FFFFF
    emax = 2 if fp4 else 8
    if rule == "ceil":
        # note: the rule is ceil(log2 fl(max(amax, FLT_MIN) / elem_max)) + 127, in integers: with elem_max =
        # 1.75 * 2^emax (448, 6), fl(m / elem_max) <= 2^(e - 127 - emax) exactly when m's mantissa is <= 1.75's
        # (0x600000; 6 = 1.5 * 2^2: 0x400000), so b = e - emax + (man > threshold); where the quotient is
        # subnormal (e == emax) the tie rounds down one mantissa step later. Checked against the f32 division
        # for every finite amax (tests/e2e/test_client_quantize.py samples it); no division, so it compiles.
        a = ops.maximum(amax, 0x00800000)
        e, man = a >> 23, a & 0x7FFFFF
        threshold = (0x400000 if fp4 else 0x600000) + ops.where(e == emax, 1, 0)
        b = e - emax + ops.where(man > threshold, 1, 0)
    elif rule == "ocp":
        b = ops.where(e == 0, 0, e - emax)
    elif rule == "floor":
        b = ops.where(e == 0, 1, e)  # note: the reference clamps amax to FLT_MIN (e = 1) before its log2
    elif rule == "ct":
        # note: m >= 1.75 <=> the top two mantissa bits are set; computed in integers, no overflow to inf
        b = ops.where(e == 0, 0, e + ops.where(man >= 0x600000, 1, 0) - emax)
    else:
        raise ValueError(f"unknown scale rule {rule!r} (expected one of ceil, ocp, floor, ct)")
    return ops.clamp(b, 0, 254)


def _mx_inv_scale(ops, b):
    # 2^(127-b) as f32; b = 254 gives the subnormal 2^-127
    return ops.f32(ops.where(b == 254, 0x00400000, (254 - b) << 23))


# MX: one step (the block amax and the encoding, integer and f32 multiplies only). FP8-B128: three, the amax
# (a reduction over the source), the divisions on the per-block values, and the encoding. note: the divisions
# stay out of compiled steps: Triton's f32 `/` is an approximate division (Inductor emits div_rn only behind a
# version-dependent switch); they touch 1/16384 of the elements.
def _mx_step(ops, x, fmt, rule):
    xf = _as_f32(ops, x)
    cols = xf.shape[-1]
    blocks = xf.reshape(*xf.shape[:-1], cols // 32, 32)
    amax = ops.amax(ops.i32(blocks) & _ABS, -1)
    fp4 = fmt == "mxfp4"
    b = _mx_scale(ops, rule, fp4, amax)
    scaled = blocks * _mx_inv_scale(ops, b)[..., None]
    if fp4:
        codes = _e2m1(ops, scaled, blocks)
        codes = codes.reshape(*xf.shape[:-1], cols // 2, 2)
        values = codes[..., 0] | (codes[..., 1] << 4)
    else:
        if rule == "ct":
            # note: compressed-tensors computes fl(x / scale) + zero_point in two torch ops (zero_point = +0),
            # so a product that is zero in f32 (a -0 input, or a negative product that underflows) becomes
            # +0 (0x00); a nonzero negative product that rounds to zero in E4M3 keeps 0x80. As quantize.cpp
            # (plus_zero_point), a select on the rounded product: no add that a backend could fuse.
            zero = (ops.i32(scaled) & _ABS) == 0
            scaled = ops.f32(ops.where(zero, 0, ops.i32(scaled)))
        values = _e4m3(ops, scaled)
    return ops.flat_u8(ops.u8(values)), ops.flat_u8(ops.u8(b)), amax.max() >= _INF


def _quantize_mx(ops, x, fmt, rule, name, batch_shape, step, nan_flags):
    values, scales, bad = step(ops, x, fmt, rule)
    if nan_flags is not None and ops.name == "torch":
        nan_flags.append((name, bad, lambda: _mx_amax(ops, x), 1, 32, tuple(x.shape)))
    elif ops.any(bad):
        _refuse_nan_block(name, _mx_amax(ops, x), 1, 32, x.shape[-2], x.shape[-1], batch_shape, ops)
    return values, scales


def _mx_amax(ops, x):
    xf = _as_f32(ops, x)
    return ops.amax(ops.i32(xf.reshape(*xf.shape[:-1], xf.shape[-1] // 32, 32)) & _ABS, -1)


def _b128_blocks(ops, xf):
    rows, cols = xf.shape[-2], xf.shape[-1]
    rb, cb = -(-rows // 128), -(-cols // 128)
    # note: zero padding leaves every block amax as it is; a short final block is legal
    return ops.pad(xf, rb * 128 - rows, cb * 128 - cols).reshape(*xf.shape[:-2], rb, 128, cb, 128)


def _b128_amax(ops, x):
    xf = _as_f32(ops, x)
    nb = len(xf.shape) - 2
    return ops.amax(ops.i32(_b128_blocks(ops, xf)) & _ABS, (nb + 1, nb + 3))


def _b128_encode(ops, x, mul):
    xf = _as_f32(ops, x)
    rows, cols = xf.shape[-2], xf.shape[-1]
    blocks = _b128_blocks(ops, xf)
    rb, cb = blocks.shape[-4], blocks.shape[-2]
    mul_b = mul.reshape(*xf.shape[:-2], rb, 1, cb, 1)
    values = _e4m3(ops, blocks * mul_b).reshape(*xf.shape[:-2], rb * 128, cb * 128)[..., :rows, :cols]
    return ops.flat_u8(ops.u8(values))


def _quantize_b128(ops, x, name, batch_shape, steps, nan_flags):
    amax_step, encode_step = steps
    amax = amax_step(ops, x)
    _check_finite(ops, name, amax, 128, 128, x, batch_shape, nan_flags)
    a = ops.maximum(ops.f32(amax), float(np.float32(_B128_MIN_AMAX)))
    # note: m = fl(fl(1 / amax') * 448) in f32, as the C++ codec (quantize.cpp): the reference's
    # `x * (448.0 / amax)` is torch's `amax.reciprocal() * 448`, one ulp off fl(448 / amax') for some amax
    mul = ops.div(1.0, a) * 448.0
    scale_inv = ops.div(a, 448.0)  # weight_scale_inv, a multiplier despite its name
    # note: the scales plane is the f32 multipliers' little-endian bytes (numpy and CUDA are little-endian)
    return encode_step(ops, x, mul), ops.flat_u8(scale_inv)


def _check_finite(ops, name, amax, block_rows, block_cols, x, batch_shape, nan_flags):
    """Refuses a NaN/Inf block now, or (nan_flags, a list) leaves a device flag there for `raise_nan_flags`:
    no host synchronisation per tensor."""
    bad = amax.max() >= _INF
    if nan_flags is not None and ops.name == "torch":
        nan_flags.append((name, bad, lambda: amax, block_rows, block_cols, tuple(x.shape)))
        return
    if ops.any(bad):
        _refuse_nan_block(name, amax, block_rows, block_cols, x.shape[-2], x.shape[-1], batch_shape, ops)


def raise_nan_flags(nan_flags) -> None:
    """One host read for every tensor quantized with `nan_flags`; raises for the first with a NaN/Inf block."""
    if not nan_flags:
        return
    torch = _torch()
    if not bool(torch.stack([f[1] for f in nan_flags]).any()):
        return
    for name, bad, amax, br, bc, shape in nan_flags:
        if bool(bad):
            _refuse_nan_block(name, amax(), br, bc, shape[-2], shape[-1], shape[:-2], _TorchOps(torch))


def _torch():
    import torch  # noqa: PLC0415
    return torch


_EAGER = {"mx": _mx_step, "b128": (_b128_amax, _b128_encode)}
_COMPILED: dict = {}


def _steps(kind: str, fused: bool):
    """The steps, eager or through torch.compile (a kernel or two per shape instead of ~30 eager passes over f32
    and int32 temporaries); tests/e2e/test_client_torch.py holds both to the same bytes."""
    if not fused:
        return _EAGER[kind]
    if kind not in _COMPILED:
        torch = _torch()
        steps = _EAGER[kind]
        compile_ = lambda f: torch.compile(f, dynamic=False, fullgraph=True)  # noqa: E731
        _COMPILED[kind] = compile_(steps) if callable(steps) else tuple(compile_(f) for f in steps)
    return _COMPILED[kind]


def quantize_planes(fmt: str, x, name: str = "tensor", rule: str | None = None, *, fused: bool = False,
                    nan_flags: list | None = None):
    """As `quantize_tensor`, but the planes stay where x is: uint8 torch tensors on x's device for a torch input
    (no copy to the host; the trainer-side diff and the IPC update read them there), numpy for numpy.
    `fused` (torch inputs): the amax and encoding steps through torch.compile, same bytes, several times faster
    on a GPU (the first call per shape compiles, seconds). `nan_flags` (torch): a list that collects each
    tensor's NaN/Inf flag on the device instead of a host read per tensor; `raise_nan_flags(nan_flags)` checks
    them all at once (the planes of a refused tensor are garbage until then)."""
    if fmt not in QUANTIZED:
        raise ValueError(f"{name}: cannot quantize to {fmt} (expected mxfp8, mxfp4 or fp8-b128)")
    rule = rule or DEFAULT_RULE.get(fmt, "ceil")
    if fmt == "mxfp4" and rule != "ct":
        raise ValueError(f"{name}: mxfp4 supports scale rule ct only (got {rule})")
    if rule not in RULES:
        raise ValueError(f"{name}: unknown scale rule {rule!r} (expected one of ceil, ocp, floor, ct)")
    shape = tuple(int(d) for d in x.shape)
    if len(shape) < 2:
        raise ValueError(f"{name}: rank {len(shape)} tensor cannot be quantized as a matrix")
    if fmt != "fp8-b128" and shape[-1] % 32:
        raise ValueError(f"{name}: {fmt} needs cols % 32 == 0 (got cols {shape[-1]})")
    ops = _ops_for(x)
    fused = fused and ops.name == "torch"
    if ops.name == "torch":  # note: widened inside the steps (inside the compiled kernels when fused)
        if source_dtype(x) not in PLAIN:
            raise ValueError(f"{name}: dtype {source_dtype(x)} cannot be quantized, expected bf16, f16 or f32")
        xf = x.detach().contiguous()
    else:
        xf = widen_f32(x, name)
    if 0 in shape:
        empty = ops.flat_u8(ops.u8(xf.reshape(-1)[:0]))
        return empty, empty
    if fmt == "fp8-b128":
        return _quantize_b128(ops, xf, name, shape[:-2], _steps("b128", fused), nan_flags)
    return _quantize_mx(ops, xf, fmt, rule, name, shape[:-2], _steps("mx", fused), nan_flags)


def quantize_tensor(fmt: str, x, name: str = "tensor", rule: str | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Canonical planes (values, scales) of x, a [..., N, K] bf16/f16/f32 numpy array or torch tensor (any
    device; leading dims are a batch, e.g. stacked experts), as mxq's `quantize_tensor` makes them with the
    format's default rule (MXFP8 ceil, MXFP4 ct) unless `rule` names another MXFP8 rule."""
    v, s = quantize_planes(fmt, x, name, rule)
    if _is_torch(v):
        return v.cpu().numpy(), s.cpu().numpy()
    return v, s


def plain_bytes(fmt: str, x, name: str = "tensor") -> np.ndarray:
    """The values plane (uint8) of a plain tensor in the engine's dtype `fmt` (bf16, f16 or f32), converted
    from the input's dtype through f32 with mxq's encoders (RNE, codec.cpp); NaN/Inf, also from a narrowing
    overflow, are refused by name, as the delta validator refuses them (W-05)."""
    if fmt not in PLAIN:
        raise ValueError(f"{name}: {fmt} is not a plain format (expected bf16, f16 or f32)")
    if not _is_torch(x) and source_dtype(x) == fmt:
        # note: already in the engine's dtype: the bytes as they are (widening and re-encoding is the identity
        # for every finite value), only the non-finite check (exponent all ones) is left
        a = np.ascontiguousarray(x).reshape(-1)
        bits, exp = {"bf16": (np.uint16, 0x7F80), "f16": (np.uint16, 0x7C00), "f32": (np.uint32, 0x7F800000)}[fmt]
        bad = (a.view(bits) & bits(exp)) == bits(exp)
        if bad.any():
            raise ValueError(f"{name}: element {int(np.flatnonzero(bad)[0])} is NaN or Inf as {fmt} "
                             f"(source {fmt}); mxq refuses non-finite weights")
        # note: a copy: the client keeps these planes as the base of the next diff, and a trainer updates its
        # tensors in place
        return a.view(np.uint8).copy()
    xf = widen_f32(x, name)
    if _is_torch(xf):
        return _plain_bytes_torch(fmt, x, xf, name)
    xf = xf.reshape(-1)
    bits = {"bf16": encode_bf16, "f16": encode_f16, "f32": lambda v: np.ascontiguousarray(v, "<f4")}[fmt](xf)
    back = xf if fmt == "f32" else (
        (bits.astype(np.uint32) << 16).view(np.float32) if fmt == "bf16" else bits.view(np.float16))
    bad = ~(np.isfinite(xf) & np.isfinite(back))
    if bad.any():
        raise ValueError(f"{name}: element {int(np.flatnonzero(bad)[0])} is NaN or Inf as {fmt} "
                         f"(source {source_dtype(x)}); mxq refuses non-finite weights")
    return np.ascontiguousarray(bits).view(np.uint8)


def _plain_bytes_torch(fmt: str, x, xf, name: str) -> np.ndarray:
    """plain_bytes of a torch tensor, converted on its own device: torch's f32 -> bf16 / f16 conversions round to
    nearest even and carry overflow into inf, as codec.cpp's encoders do for every non-NaN input (a NaN or an
    overflow is refused below either way); only the result's bytes cross to the host."""
    import torch  # noqa: PLC0415
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[fmt]
    out = xf.reshape(-1).to(dtype)
    bad = ~(torch.isfinite(xf.reshape(-1)) & torch.isfinite(out))
    if bool(bad.any()):
        raise ValueError(f"{name}: element {int(torch.nonzero(bad)[0, 0])} is NaN or Inf as {fmt} "
                         f"(source {source_dtype(x)}); mxq refuses non-finite weights")
    return out.view(torch.uint8).cpu().numpy()
