"""mxq quantize / inspect against the real binary. Oracles: the python `safetensors` reader and ml_dtypes' float8 /
float4 casts (code nobody here wrote); the scale rules are the formulas of shared/spec/formats.md."""
import filecmp
import json
import os
import shutil
import subprocess

import ml_dtypes
import numpy as np
import pytest

# note: safetensors' numpy backend looks float8 dtypes up on numpy itself; ml_dtypes provides them (and bf16).
np.float8_e4m3fn = ml_dtypes.float8_e4m3fn
from safetensors.numpy import load_file  # noqa: E402

from conftest import CKPT, MXQ, MXQ_BENCH, ROOT

DENSE = CKPT / "qwen3-dense-bf16"
MOE = CKPT / "qwen3-moe-bf16"
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight",
                   "gate_proj.weight", "up_proj.weight", "down_proj.weight")


def load_dir(d):
    out = {}
    for f in sorted(os.listdir(d)):
        if f.endswith(".safetensors"):
            out.update(load_file(os.path.join(d, f)))
    return out


def to_f32(a):
    return a.astype(np.float32)  # exact for bf16 / f16 (ml_dtypes)


def is_linear(name):
    return name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES) and ".mlp.gate.weight" not in name


def e8m0_ceil(amax):
    # b = clamp(ceil(log2(max(amax, FLT_MIN) / 448)) + 127, 0, 254), exact via frexp (formats.md, MXFP8 rule ceil).
    q = (np.maximum(amax, np.finfo(np.float32).tiny) / np.float32(448)).astype(np.float32)
    m, e = np.frexp(q)  # q = m * 2^e, m in [0.5, 1)
    ceil_log2 = np.where(m == 0.5, e - 1, e)
    return np.clip(ceil_log2 + 127, 0, 254).astype(np.uint8)


def e8m0_ct_fp4(amax):
    # b = clamp(127 + k - 2 + [m >= 1.75], 0, 254) with amax = m * 2^k (formats.md, MXFP4 rule ct).
    m, e = np.frexp(amax.astype(np.float32))
    k = e - 1
    m2 = m * 2
    b = 127 + k - 2 + (m2 >= 1.75)
    return np.where(amax == 0, 0, np.clip(b, 0, 254)).astype(np.uint8)


def pow2(b):
    return np.ldexp(np.float32(1), b.astype(np.int32) - 127).astype(np.float32)


def oracle_mxfp8(w):
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    b = e8m0_ceil(np.abs(blocks).max(axis=-1))
    scaled = blocks * pow2(254 - b)[..., None]  # x * 2^(127-b), exact
    vals = scaled.astype(ml_dtypes.float8_e4m3fn).view(np.uint8).reshape(n, k)
    return vals, b


def oracle_mxfp4(w):
    n, k = w.shape
    blocks = w.reshape(n, k // 32, 32)
    b = e8m0_ct_fp4(np.abs(blocks).max(axis=-1))
    scaled = np.clip(blocks * pow2(254 - b)[..., None], -6, 6)
    codes = scaled.astype(ml_dtypes.float4_e2m1fn).view(np.uint8).reshape(n, k) & 0xF
    codes = np.where(w.reshape(n, k) == 0, 0, codes)  # an input of +-0 is code 0 (compressed-tensors)
    return (codes[:, 0::2] | (codes[:, 1::2] << 4)).astype(np.uint8), b


def oracle_fp8_b128(w):
    n, k = w.shape
    nb, kb = -(-n // 128), -(-k // 128)
    vals = np.empty((n, k), np.uint8)
    s = np.empty((nb, kb), np.float32)
    for i in range(nb):
        for j in range(kb):
            blk = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128]
            amax = np.float32(max(np.abs(blk).max(), np.float32(1e-4)))
            vals[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (
                (blk * (np.float32(448) / amax)).astype(ml_dtypes.float8_e4m3fn).view(np.uint8))
            s[i, j] = amax / np.float32(448)
    return vals, s


CASES = {
    # format: (scales suffix, values suffix replacement, oracle)
    "mxfp8": ("weight_scale", "weight", oracle_mxfp8),
    "mxfp4": ("weight_scale", "weight_packed", oracle_mxfp4),
    "fp8-b128": ("weight_scale_inv", "weight", oracle_fp8_b128),
}


@pytest.mark.parametrize("model", [DENSE, MOE], ids=["dense", "moe"])
@pytest.mark.parametrize("fmt", list(CASES))
def test_quantize_matches_oracle(mxq, tmp_path, model, fmt):
    out = tmp_path / "out"
    mxq("quantize", "--to", fmt, model, out)
    src, dst = load_dir(model), load_dir(out)
    scale_suffix, values_suffix, oracle = CASES[fmt]
    n_linear = 0
    for name, t in src.items():
        if not is_linear(name):
            assert name in dst, f"{name} (not a linear) must be copied unchanged"
            assert dst[name].tobytes() == t.tobytes(), name
            continue
        n_linear += 1
        m = name[: -len(".weight")]
        vals, scales = oracle(to_f32(t))
        got_v, got_s = dst[f"{m}.{values_suffix}"], dst[f"{m}.{scale_suffix}"]
        assert got_v.view(np.uint8).tobytes() == vals.tobytes(), f"{m}: values differ from the oracle"
        assert got_s.tobytes() == scales.tobytes(), f"{m}: scales differ from the oracle"
    assert n_linear > 0
    info = json.loads(mxq("inspect", out, "--json").stdout)
    assert info["format"] == fmt


def test_quantize_is_deterministic(mxq, tmp_path):
    a, b = tmp_path / "a", tmp_path / "b"
    mxq("quantize", "--to", "mxfp8", DENSE, a)
    mxq("quantize", "--to", "mxfp8", DENSE, b)
    cmp = filecmp.dircmp(a, b)
    assert not cmp.diff_files and not cmp.left_only and not cmp.right_only
    for f in cmp.common_files:
        assert (a / f).read_bytes() == (b / f).read_bytes(), f


def test_quantize_copies_side_files(mxq, tmp_path):
    out = tmp_path / "out"
    mxq("quantize", "--to", "mxfp4", DENSE, out)
    for f in os.listdir(DENSE):
        if f.endswith(".safetensors") or f in ("config.json", "model.safetensors.index.json"):
            continue
        assert (out / f).read_bytes() == (DENSE / f).read_bytes(), f
    cfg = json.loads((out / "config.json").read_text())
    assert cfg["quantization_config"]["format"] == "mxfp4-pack-quantized"


def test_bad_input_exit_2_and_no_partial_output(mxq, tmp_path):
    bad = tmp_path / "bad"
    shutil.copytree(DENSE, bad)
    st = bad / "model.safetensors"
    st.write_bytes(st.read_bytes()[:-7])  # truncated: shape x dtype no longer matches the byte range
    out = tmp_path / "out"
    p = mxq("quantize", "--to", "mxfp8", bad, out, check=False)
    assert p.returncode == 2, p.stderr
    assert "model.safetensors" in p.stderr and len(p.stderr.strip().splitlines()) == 1, p.stderr
    assert not out.exists() and not any(tmp_path.glob("out*")), "no partial output may be left"
    p = mxq("inspect", bad, check=False)
    assert p.returncode == 2 and "model.safetensors" in p.stderr


def test_refuses_quantized_input_and_existing_output(mxq, tmp_path):
    out = tmp_path / "out"
    mxq("quantize", "--to", "mxfp8", DENSE, out)
    p = mxq("quantize", "--to", "mxfp4", out, tmp_path / "again", check=False)
    assert p.returncode == 2 and "already quantized" in p.stderr, p.stderr
    p = mxq("quantize", "--to", "mxfp4", DENSE, out, check=False)
    assert p.returncode == 2 and "exists" in p.stderr, p.stderr
    p = mxq("quantize", "--to", "nvfp4", DENSE, tmp_path / "x", check=False)
    assert p.returncode == 2 and "nvfp4" in p.stderr


def test_bench_quantize_device_is_checked():
    # --device takes cpu or cuda; anything else is refused by name before any work (exit 2, nothing printed)
    p = subprocess.run([str(MXQ_BENCH), "quantize", "--device", "tpu", "--reps", "1"], capture_output=True,
                       text=True, timeout=120)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "'tpu'" in p.stderr and "cpu or cuda" in p.stderr
    assert p.stdout == ""
    # a small CPU run prints one row per format / rule / input dtype, with a positive rate
    p = subprocess.run([str(MXQ_BENCH), "quantize", "--rows", "128", "--cols", "256", "--threads", "1",
                        "--reps", "1"], capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    rows = [r.split() for r in p.stdout.splitlines() if r.split() and r.split()[0] in ("mxfp8", "mxfp4", "fp8-b128")]
    assert len(rows) == 12 and all(float(r[4]) > 0 for r in rows)


def test_index_total_size_is_the_tensor_bytes(mxq, tmp_path):
    # issue 22: total_size was the sum of the shard files' sizes (headers included); transformers writes the
    # tensors' bytes.
    out = tmp_path / "q"
    mxq("quantize", "--to", "mxfp8", ROOT / "models" / "default", out)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    tensor_bytes = 0
    for shard in sorted(set(index["weight_map"].values())):
        with open(out / shard, "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
        tensor_bytes += sum(v["data_offsets"][1] - v["data_offsets"][0] for k, v in header.items()
                            if k != "__metadata__")
    assert index["metadata"]["total_size"] == tensor_bytes


def test_to_names_only_the_quantized_targets(mxq, tmp_path):
    p = mxq("quantize", "--to", "nvfp4", CKPT / "qwen3-dense-bf16", tmp_path / "q", check=False)
    assert p.returncode == 2 and "--to nvfp4: expected mxfp8, mxfp4 or fp8-b128" in p.stderr, p.stderr
    assert "bf16" not in p.stderr
