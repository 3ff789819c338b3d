"""The trainer client's numpy quantizers (python/mxq_client/quantize.py, the installed package) against mxq's C++
codecs, byte for byte: (a) the golden files tests/format/*_test.cpp compare the C++ against (torch, vLLM,
compressed-tensors, microxcaling and DeepSeek oracles) and the C++ tests' hand cases and refusals; (b) `mxq
quantize` itself on small random Qwen3 checkpoints (dense, per-expert MoE, stacked MoE) seeded with edge values:
every quantized tensor's values and scales bytes, the NaN refusal message, and which tensors get quantized."""

import json
import pathlib
import struct

import ml_dtypes
import numpy as np
import pytest

import mxq_client as mc
from mxq_client import quantize as q

ROOT = pathlib.Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "golden" / "format"
CKPT = ROOT / "tests" / "golden" / "ckpt"
BF16 = np.dtype(ml_dtypes.bfloat16)


def load(name):
    return np.load(GOLDEN / f"{name}.npy")


def bf16(bits):
    return np.ascontiguousarray(bits, np.uint16).view(BF16)


def test_installed_package_is_the_source_tree():
    """The tests import the package pip installed (scripts/setup), and it holds the current sources."""
    pkg = pathlib.Path(mc.__file__).parent
    assert "site-packages" in str(pkg), f"mxq_client imported from {pkg}, not the installed package"
    for src in (ROOT / "python" / "mxq_client").glob("*.py"):
        assert (pkg / src.name).read_bytes() == src.read_bytes(), f"{src.name} is stale: run scripts/setup"


# ---- (a) goldens of the C++ codec tests -----------------------------------------------------------------
@pytest.mark.parametrize("codec", ["e4m3", "e5m2"])
def test_element_encode_sweep_matches_torch(codec):
    x = load(f"encode_{codec}_in").view(np.float32)
    assert np.array_equal(getattr(q, f"encode_{codec}")(x), load(f"encode_{codec}_out").reshape(-1))


def test_bf16_f16_encode_sweep_matches_torch():
    x = load("encode_16_in").view(np.float32)
    assert np.array_equal(q.encode_bf16(x), load("encode_bf16_out"))
    assert np.array_equal(q.encode_f16(x), load("encode_f16_out"))


def test_e2m1_sweep_and_nibble_order_match_compressed_tensors():
    x = load("encode_e2m1_in").view(np.float32)
    assert np.array_equal(q.pack_e2m1(q.encode_e2m1(x)), load("encode_e2m1_packed"))
    # byte j = element 2j (bits 3:0) | element 2j+1 (bits 7:4): 0.5 -> code 1, -6 -> code 15
    assert q.pack_e2m1(q.encode_e2m1(np.float32([0.5, -6.0]))).tolist() == [0xF1]


def test_e8m0_round_up():
    x = np.float32([0, 2.0**-127, 2.0**-126, 1.0, 1.5, 3e38, np.inf, -4.0, np.nan])
    assert q.encode_e8m0(x).tolist() == [0, 0, 1, 127, 128, 254, 254, 129, 255]


# The golden script's block recipe (tests/format/quantize_test.cpp amax_blocks): block i has amax bits i + 1
# (every positive finite bf16); element j = bf16 bits max(a - DELTAS[j], 0), negated for odd j.
DELTAS = [0, 1, 2, 3, 5, 8, 13, 21, 0x40, 0x41, 0x80, 0x81, 0xC0, 0x100, 0x180, 0x200, 0x280, 0x300, 0x380, 0x400,
          0x480, 0x500, 0x600, 0x700, 0x800, 0x900, 0xA00, 0xB00, 0xC00, 0xE00, 0x1000, 0x7F7F]
RULES = [("mxfp8", "ceil"), ("mxfp8", "ocp"), ("mxfp8", "floor"), ("mxfp8", "ct"), ("mxfp4", "ct")]


@pytest.mark.parametrize("fmt,rule", RULES, ids=[f"{f}_{r}" for f, r in RULES])
def test_amax_sweep_matches_reference(fmt, rule):
    a = np.arange(1, 0x7F80, dtype=np.int64)[:, None]
    bits = np.maximum(a - np.array(DELTAS)[None, :], 0) | ((np.arange(32) % 2 == 1).astype(np.int64) << 15)
    values, scales = q.quantize_tensor(fmt, bf16(bits), "sweep", rule)
    want = load(f"amax_{fmt}_{rule}_scale")
    # note: compressed-tensors overflows amax >= 1.75·2^127 to inf; formats.md computes b in integers instead
    overflow = (a[:, 0] >= 0x7F60) if rule == "ct" else np.zeros(len(a), bool)
    want = np.where(overflow, 253 if fmt == "mxfp4" else 247, want)
    assert np.array_equal(scales, want)
    subset = np.flatnonzero((a[:, 0] % 37 == 0) | (a[:, 0] < 0x80) | (a[:, 0] > 0x7F00))
    rows = values.reshape(len(a), -1)[subset]
    keep = ~overflow[subset]
    assert np.array_equal(rows[keep], load(f"amax_{fmt}_{rule}_elems")[keep])


@pytest.mark.parametrize("fmt,rule", RULES, ids=[f"{f}_{r}" for f, r in RULES])
def test_random_tensor_matches_reference(fmt, rule):
    x = bf16(load("random_bf16_in")) if fmt == "mxfp4" else load("random_f32_in").view(np.float32)
    values, scales = q.quantize_tensor(fmt, x, "random", rule)
    assert np.array_equal(scales, load(f"random_{fmt}_{rule}_scale").reshape(-1))
    assert np.array_equal(values, load(f"random_{fmt}_{rule}_elems").reshape(-1))


@pytest.mark.parametrize("tag", ["bf16_1x1", "bf16_3x300", "bf16_129x131", "bf16_130x7", "f32_40x140",
                                 "ties_bf16_16x1448", "ties_f32_8x520"])
def test_fp8_b128_matches_deepseek_cast(tag):
    """Ragged shapes (short final blocks), a zero block and a tiny block (amax clamped at 1e-4); ties_*: block
    amaxes where torch's multiplier fl(fl(1/a)*448) != fl(448/a), elements on E4M3 ties (issue 22)."""
    raw = load(f"b128_{tag}_in")
    x = bf16(raw) if "bf16" in tag else raw.view(np.float32)
    values, scales = q.quantize_tensor("fp8-b128", x, tag)
    assert np.array_equal(values, load(f"b128_{tag}_values").reshape(-1))
    assert np.array_equal(scales, load(f"b128_{tag}_scales").reshape(-1).view(np.uint8))


# quantize_test.cpp Mxfp8Block: (name, rule, first elements (rest +0), scale byte, first element bytes)
BLOCKS = [
    ("worked_ceil", "ceil", [500, 1, 0.0078125, -3], 128, [0x78, 0x30, 0x02, 0xBC, 0]),
    ("worked_ocp", "ocp", [500, 1, 0.0078125, -3], 127, [0x7E, 0x38, 0x04, 0xC4, 0]),
    ("worked_floor", "floor", [500, 1, 0.0078125, -3], 135, [0x40, 0x02, 0x00, 0x86, 0]),
    ("zero_ceil", "ceil", [0.0, -0.0], 0, [0x00, 0x80]),
    ("zero_ct", "ct", [0.0, -0.0], 0, [0x00, 0x00]),
    ("zero_floor", "floor", [0.0, -0.0], 1, [0x00, 0x80]),
    ("tiny_ceil", "ceil", [2.0**-130, -(2.0**-140)], 0, [0x20, 0x80]),
    ("huge_ceil", "ceil", [3.4028235e38, -1.0], 247, [0x78, 0x80]),
    ("ct_bump", "ct", [448.0], 128, [0x76]),
    ("ct_negative_zero", "ct", [1.0, -0.0, -1e-20], 119, [0x78, 0x00, 0x80]),
    ("ceil_448", "ceil", [448.0], 127, [0x7E]),
    # issue 22, f32 max block: -2^-149·2^-120 underflows to -0 in f32, then ct's +0 zero point makes it +0
    # (compressed-tensors: two torch ops; mxq: no FMA); -2^-140 stays nonzero in f32 and keeps 0x80
    ("ct_underflow_to_plus_zero", "ct", [3.4028235e38, -(2.0**-149), -0.0, -(2.0**-20)], 247,
     [0x78, 0x00, 0x00, 0x80]),
    ("ceil_underflow_keeps_sign", "ceil", [3.4028235e38, -(2.0**-149)], 247, [0x78, 0x80]),
]


@pytest.mark.parametrize("name,rule,head,scale,want", BLOCKS, ids=[b[0] for b in BLOCKS])
def test_mxfp8_hand_blocks(name, rule, head, scale, want):
    x = np.zeros((1, 32), np.float32)
    x[0, :len(head)] = head
    values, scales = q.quantize_tensor("mxfp8", x, name, rule)
    assert scales.tolist() == [scale]
    assert values[:len(want)].tolist() == want


def test_mxfp4_huge_and_zero_blocks():
    x = np.zeros((1, 64), np.uint16)
    x[0, 0], x[0, 1], x[0, 33] = 0x7F7F, 0x8000, 0xBC00  # 1.99·2^127, -0, -2^-7
    values, scales = q.quantize_tensor("mxfp4", bf16(x), "w")
    assert scales.tolist() == [253, 127 - 7 - 2]
    assert values[0] == 0x06 and values[16] == 0xE0


# quantize_test.cpp Refuses: (format, rows, cols, poisoned flat index or -2 for -inf last, message part)
REFUSALS = [
    ("mxfp8", 2, 96, 32 * 4 + 5, "layers.0.w: block (1, 1) holds NaN/Inf (rows 1..1, cols 32..63)"),
    ("mxfp4", 2, 64, -2, "layers.0.w: block (1, 1) holds NaN/Inf"),
    ("fp8-b128", 130, 200, 129 * 200 + 150, "layers.0.w: block (1, 1) holds NaN/Inf (rows 128..129, cols 128..199)"),
    ("mxfp8", 2, 48, -1, "layers.0.w: mxfp8 needs cols % 32 == 0 (got cols 48)"),
    ("mxfp4", 1, 16, -1, "cols % 32"),
    ("e4m3", 1, 32, -1, "cannot quantize to e4m3"),
]


@pytest.mark.parametrize("fmt,rows,cols,poison,expect", REFUSALS)
def test_refuses_by_name(fmt, rows, cols, poison, expect):
    x = np.ones(rows * cols, np.float32)
    if poison >= 0:
        x[poison] = np.nan
    if poison == -2:
        x[-1] = -np.inf
    with pytest.raises(ValueError) as e:
        q.quantize_tensor(fmt, x.reshape(rows, cols), "layers.0.w")
    assert expect in str(e.value) and "\n" not in str(e.value)


def test_refuses_bad_sources_and_rules():
    with pytest.raises(ValueError, match="w: dtype int32 cannot be quantized"):
        q.quantize_tensor("mxfp8", np.ones((1, 32), np.int32), "w")
    with pytest.raises(ValueError, match="mxfp4 supports scale rule ct only"):
        q.quantize_tensor("mxfp4", np.ones((1, 32), np.float32), "w", "ceil")
    with pytest.raises(ValueError, match="rank 1"):
        q.quantize_tensor("mxfp8", np.ones(32, np.float32), "w")
    with pytest.raises(ValueError, match="n.w: element 1 is NaN or Inf as bf16"):
        q.plain_bytes("bf16", np.float32([1, 3.4e38]), "n.w")  # overflows bf16's range after RNE


def test_plain_bytes_of_the_engines_own_dtype_are_the_bytes():
    """A source already in the plain format goes as its bytes (the fast path), equal to the path through f32 for
    every finite value, and a NaN or Inf in it is refused by position, as through f32."""
    import ml_dtypes
    rng = np.random.default_rng(6)
    words = rng.integers(0, 1 << 16, 4096, dtype=np.uint16)
    for fmt, dt, exp in (("bf16", ml_dtypes.bfloat16, 0x7F80), ("f16", np.float16, 0x7C00)):
        finite = words[(words & exp) != exp]
        x = finite.view(dt)
        assert q.plain_bytes(fmt, x, "w").tobytes() == finite.tobytes()
        assert q.plain_bytes(fmt, x, "w").tobytes() == q.plain_bytes(fmt, x.astype(np.float32), "w").tobytes()
        bad = finite.copy()
        bad[7] = exp | 1  # a NaN
        with pytest.raises(ValueError, match=f"w: element 7 is NaN or Inf as {fmt}"):
            q.plain_bytes(fmt, bad.view(dt), "w")
    f = rng.standard_normal(64).astype(np.float32)
    kept = q.plain_bytes("f32", f, "w")
    assert kept.tobytes() == f.tobytes()
    f[0] += 1  # the trainer's next step, in place: the planes the client kept do not move with it
    assert kept.tobytes() != f.tobytes()
    f[3] = np.inf
    with pytest.raises(ValueError, match="w: element 3 is NaN or Inf as f32"):
        q.plain_bytes("f32", f, "w")


def test_source_dtypes_agree():
    """bf16 values given as bf16, f16 (where exact) and f32 make the same planes (quantize_test SourceDtypesAgree)."""
    rng = np.random.default_rng(5)
    x = rng.standard_normal((4, 256)).astype(np.float16).astype(np.float32)
    for fmt in ("mxfp8", "mxfp4", "fp8-b128"):
        want = q.quantize_tensor(fmt, x, "w")
        for src in (x.astype(np.float16), x.astype(BF16)):
            if np.array_equal(src.astype(np.float32), x):
                got = q.quantize_tensor(fmt, src, "w")
                assert all(np.array_equal(a, b) for a, b in zip(got, want)), (fmt, src.dtype)


# ---- (b) `mxq quantize` on random checkpoints with edge values ----------------------------------------------
def write_safetensors(path, tensors):
    header, blobs, off = {}, [], 0
    for name, (dtype, arr) in tensors.items():
        raw = np.ascontiguousarray(arr).tobytes()
        header[name] = {"dtype": dtype, "shape": list(arr.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    h = json.dumps(header).encode()
    h += b" " * (-len(h) % 8)
    path.write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def read_safetensors(path):
    data = path.read_bytes()
    (n,) = struct.unpack_from("<Q", data)
    header = json.loads(data[8:8 + n])
    header.pop("__metadata__", None)
    return {k: (v["dtype"], v["shape"], data[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in header.items()}


def model_tensors(cfg, moe, stacked):
    """HF names and shapes of a Qwen3 (MoE) checkpoint, as src/model/qwen3_weights.cpp lists them."""
    h, d, v = cfg["hidden_size"], cfg["head_dim"], cfg["vocab_size"]
    qd, kv = cfg["num_attention_heads"] * d, cfg["num_key_value_heads"] * d
    out = {"model.embed_tokens.weight": (v, h), "model.norm.weight": (h,), "lm_head.weight": (v, h)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        out.update({p + "input_layernorm.weight": (h,), p + "post_attention_layernorm.weight": (h,),
                    p + "self_attn.q_proj.weight": (qd, h), p + "self_attn.k_proj.weight": (kv, h),
                    p + "self_attn.v_proj.weight": (kv, h), p + "self_attn.o_proj.weight": (h, qd),
                    p + "self_attn.q_norm.weight": (d,), p + "self_attn.k_norm.weight": (d,)})
        if moe:
            e, im = cfg["num_experts"], cfg["moe_intermediate_size"]
            out[p + "mlp.gate.weight"] = (e, h)
            if stacked:
                out[p + "mlp.experts.gate_up_proj"] = (e, 2 * im, h)
                out[p + "mlp.experts.down_proj"] = (e, h, im)
            else:
                for x in range(e):
                    out.update({f"{p}mlp.experts.{x}.gate_proj.weight": (im, h),
                                f"{p}mlp.experts.{x}.up_proj.weight": (im, h),
                                f"{p}mlp.experts.{x}.down_proj.weight": (h, im)})
        else:
            im = cfg["intermediate_size"]
            out.update({p + "mlp.gate_proj.weight": (im, h), p + "mlp.up_proj.weight": (im, h),
                        p + "mlp.down_proj.weight": (h, im)})
    return out


def edge_bf16(rng, shape):
    """Random bf16 bits (1/16 of them E4M3 ties after an MX scale) with edge rows: an all-zero block with -0,
    the max finite bf16, tiny subnormals, exact E4M3 ties under a 448 block max, and a zero B128 block."""
    x = rng.standard_normal(shape).astype(np.float32) * np.exp2(rng.integers(-6, 3, shape[:-1] + (1,)))
    bits = q.encode_bf16(x).reshape(shape)
    m = bits.reshape(-1, shape[-2], shape[-1])
    m[:, 0, :32] = 0
    m[:, 0, 1:32:2] = 0x8000  # -0
    m[:, 1, :4] = [0x7F7F, 0xFF7F, 0x0001, 0x3F80]  # +-max finite next to tiny and 1
    m[:, 2, :32] = rng.choice([0x0001, 0x8001, 0x0003, 0x8000, 0x007F], 32)  # subnormal-only block
    m[:, 3, :8] = [0x43E0, 0x3F88, 0xBF98, 0x3FA8, 0x4188, 0x40C8, 0x3C80, 0xBC90]  # 448 and ties of E4M3
    m[:, 4, :8] = [0x40C0, 0x3E80, 0x3F40, 0xBFA0, 0x3FE0, 0x4020, 0x4060, 0x40A0]  # 6 and E2M1 midpoints
    m[:, 5, :2] = [0x43E0, 0x43DF]  # 448 (ct bumps at m >= 1.75) and just below
    if shape[-2] > 128 and shape[-1] > 128:
        m[:, 128:, 128:] = 0  # a zero FP8-B128 block (short in both dims)
    return bits


def edge_f32(rng, shape):
    """f32 sources: the bf16 edges widened, plus full-mantissa values, f32 subnormals and the max finite f32."""
    x = bf16(edge_bf16(rng, shape)).astype(np.float32)
    m = x.reshape(-1, shape[-2], shape[-1])
    m[:, 6, :] *= np.float32(1 + 2.0**-20) + rng.random(shape[-1]).astype(np.float32) * np.float32(2.0**-10)
    m[:, 7, :4] = np.uint32([1, 0x807FFFFF, 0x00400000, 0x7F7FFFFF]).view(np.float32)
    return x


def edge_f16(rng, shape):
    """f16 sources: random values with f16 subnormals, the max finite f16 and a zero block."""
    x = (rng.standard_normal(shape) * np.exp2(rng.integers(-12, 6, shape[:-1] + (1,)))).astype(np.float16)
    m = x.reshape(-1, shape[-2], shape[-1])
    m[:, 0, :32] = 0
    m[:, 1, :4] = np.uint16([0x7BFF, 0xFBFF, 0x0001, 0x8003]).view(np.float16)
    m[:, 2, :32] = np.uint16([0x0001, 0x8002, 0x03FF, 0x0000] * 8).view(np.float16)
    return x


SOURCES = {"BF16": (edge_bf16, np.uint16), "F32": (edge_f32, np.float32), "F16": (edge_f16, np.float16)}


def make_checkpoint(tmp, base, edits, moe, stacked, seed, poison=None, dtype="BF16"):
    cfg = json.loads((CKPT / base / "config.json").read_text())
    cfg.update(edits)
    rng = np.random.default_rng(seed)
    edge, np_dtype = SOURCES[dtype]
    tensors = {}
    for name, shape in model_tensors(cfg, moe, stacked).items():
        plain = rng.standard_normal(shape).astype(np.float32)
        tensors[name] = (dtype, edge(rng, shape) if len(shape) >= 2 and shape[-2] >= 8 else
                         q.encode_bf16(plain).reshape(shape) if dtype == "BF16" else plain.astype(np_dtype))
    if poison:
        name, index = poison
        tensors[name][1].reshape(-1)[index] = 0x7FC0  # bf16 NaN
    tmp.mkdir()
    (tmp / "config.json").write_text(json.dumps(cfg))
    write_safetensors(tmp / "model.safetensors", tensors)
    return {n: bf16(t) if dtype == "BF16" else t for n, (_, t) in tensors.items()}


DENSE = dict(hidden_size=160, intermediate_size=224, num_hidden_layers=1, vocab_size=64)
MOE = dict(hidden_size=160, moe_intermediate_size=96, num_hidden_layers=1, vocab_size=64, num_experts=3,
           num_local_experts=3, num_experts_per_tok=2)
MODELS = {"dense": ("qwen3-dense-bf16", DENSE, False, False), "moe": ("qwen3-moe-bf16", MOE, True, False),
          "moe_stacked": ("qwen3-moe-bf16", MOE, True, True)}
SCALES = {"mxfp8": ".weight_scale", "mxfp4": ".weight_scale", "fp8-b128": ".weight_scale_inv"}
FORMATS = ("mxfp8", "mxfp4", "fp8-b128")
CASES = [(m, f, None, "BF16") for m in MODELS for f in FORMATS] + \
        [("dense", "mxfp8", r, "BF16") for r in ("ocp", "floor", "ct")] + \
        [("dense", f, None, d) for d in ("F32", "F16") for f in FORMATS] + [("dense", "mxfp8", "ct", "F32")]


@pytest.mark.parametrize("model,fmt,rule,dtype", CASES,
                         ids=[f"{m}-{f}-{d}" + (f"-{r}" if r else "") for m, f, r, d in CASES])
def test_matches_mxq_quantize(mxq, tmp_path, model, fmt, rule, dtype):
    base, edits, moe, stacked = MODELS[model]
    src = make_checkpoint(tmp_path / "in", base, edits, moe, stacked, seed=len(model) + len(fmt), dtype=dtype)
    mxq("quantize", "--to", fmt, *(["--rule", rule] if rule else []), "--threads", "2", tmp_path / "in",
        tmp_path / "out")
    out = read_safetensors(tmp_path / "out" / "model.safetensors")
    quantized = set()
    for name, x in src.items():
        module = name[:-7] if name.endswith(".weight") else name
        if module + SCALES[fmt] not in out:
            assert out[name][2] == x.tobytes(), f"{name} was not carried as stored"
            continue
        quantized.add(name)
        values = out[module + (".weight_packed" if fmt == "mxfp4" else ".weight")][2]
        got_v, got_s = q.quantize_tensor(fmt, x, name, rule)
        assert got_v.tobytes() == values, f"{name}: values differ from mxq quantize --to {fmt}"
        assert got_s.tobytes() == out[module + SCALES[fmt]][2], f"{name}: scales differ"
    # the selection rule: mxq quantizes exactly the tensors the client quantizes
    assert quantized == {n for n in src if mc.is_linear(n)}
    assert len(quantized) == (7 if model == "dense" else 4 + (2 if stacked else 9))


@pytest.mark.parametrize("model,fmt,tensor,index", [
    ("dense", "mxfp8", "model.layers.0.mlp.down_proj.weight", 7 * 224 + 100),
    ("moe_stacked", "fp8-b128", "model.layers.0.mlp.experts.gate_up_proj", 2 * 192 * 160 + 130 * 160 + 5),
])
def test_nan_refusal_names_the_same_block(mxq, tmp_path, model, fmt, tensor, index):
    base, edits, moe, stacked = MODELS[model]
    src = make_checkpoint(tmp_path / "in", base, edits, moe, stacked, seed=1, poison=(tensor, index))
    r = mxq("quantize", "--to", fmt, tmp_path / "in", tmp_path / "out", check=False)
    assert r.returncode != 0
    with pytest.raises(ValueError) as e:
        q.quantize_tensor(fmt, src[tensor], tensor)
    assert str(e.value) in r.stderr, (str(e.value), r.stderr)


@pytest.mark.parametrize("fp4, elem_max", [(False, 448.0), (True, 6.0)])
def test_ceil_rule_in_integers_equals_the_f32_division(fp4, elem_max):
    """The ceil rule's scale is computed without a division (so the torch steps compile; Triton's f32 `/` is
    approximate): against the definition, ceil(log2 fl(max(amax, FLT_MIN) / elem_max)) + 127 from the
    quotient's bits, on every exponent's mantissas around the thresholds and on random finite amax (the whole
    f32 range was checked once: the two agree on all of it)."""
    ops = q._NumpyOps()
    e = np.arange(0, 255, dtype=np.int64)[:, None] << 23
    man = np.concatenate([np.arange(0, 8), 0x3FFFF8 + np.arange(16), 0x5FFFF8 + np.arange(16),
                          0x7FFFF8 + np.arange(8)])[None, :]
    rng = np.random.default_rng(0)
    amax = np.concatenate([(e | man).reshape(-1), rng.integers(0, 0x7F800000, 1 << 20)]).astype(np.int32)
    quot = np.divide(np.maximum(amax.view(np.float32), np.float32(1.1754944e-38)), np.float32(elem_max),
                     dtype=np.float32)
    want = np.clip(q._e8m0_ceil(ops, quot.view(np.int32) & 0x7FFFFFFF), 0, 254)
    assert np.array_equal(q._mx_scale(ops, "ceil", fp4, amax), want)
