"""The Python trainer client (python/mxq_client) against the real mxq binary (conftest's `mxq` runner): a delta
the client writes is read by `mxq delta inspect`, rewritten by `mxq delta recode` to the same body bytes, and
refused by name when a record breaks a W-xx rule; a delta `mxq delta make` writes for a model step turns the
base's planes into the target's, byte for byte. Needs build/mxq and numpy, zstandard, xxhash, safetensors."""

import json
import os
import struct
import sys

import numpy as np
import pytest
import xxhash

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.join(ROOT, "python"))
import zstandard  # noqa: E402
import mxq_client as mc  # noqa: E402
from mxq_client import delta as mcd  # noqa: E402

sys.path.insert(0, os.path.join(ROOT, "tests", "golden"))
import make_refit_golden  # noqa: E402


# (name, format, shape, changed fraction, clustered)
TENSORS = [
    ("model.layers.0.mlp.up_proj.weight", "mxfp8", (96, 256), 0.002, False),
    ("model.layers.0.mlp.gate_proj.weight", "mxfp8", (96, 256), 0.05, True),
    ("model.layers.0.mlp.down_proj.weight", "mxfp4", (64, 128), 0.25, False),
    ("model.layers.0.self_attn.o_proj.weight", "fp8-b128", (200, 130), 0.01, False),
    ("model.layers.0.post_attention_layernorm.weight", "bf16", (256,), 0.5, False),
    ("model.norm.weight", "f32", (64,), 0.0, False),
    ("model.layers.0.mlp.experts.down_proj", "mxfp8", (4, 32, 64), 1.0, False),
]


def random_planes(rng, fmt, shape):
    return make_refit_golden.random_planes(rng, fmt, shape, scale_bytes=(0, 255))


def stepped(rng, plane, fresh, width, fraction, clustered):
    n = plane.size // width
    mask = np.zeros(n, bool)
    if clustered:
        for s in rng.choice(n, max(1, int(n * fraction / 16)), replace=False):
            mask[s:s + 16] = True
    else:
        mask = rng.random(n) < fraction
    out = plane.reshape(n, width).copy()
    out[mask] = fresh.reshape(n, width)[mask]
    return out.reshape(-1)


def make_delta(seed):
    rng = np.random.default_rng(seed)
    tensors, expect = [], {}
    for name, fmt, shape, fraction, clustered in TENSORS:
        old, fresh = random_planes(rng, fmt, shape), random_planes(rng, fmt, shape)
        new = (stepped(rng, old[0], fresh[0], mc.entry_bytes(fmt, "values"), fraction, clustered),
               stepped(rng, old[1], fresh[1], max(1, mc.entry_bytes(fmt, "scales")), fraction / 4, False))
        t = mc.diff_tensor(name, fmt, shape, old, new)
        tensors.append(t)
        expect[name] = (t, new)
    return mc.Delta(10 + seed, 11 + seed, tensors), expect


def _run(mxq, *args):
    """`mxq` is conftest's runner (it fails when build/mxq is missing); exit codes are checked here."""
    return mxq(*args, check=False)


def body_of(data):
    return zstandard.ZstdDecompressor().decompress(data[32:])


@pytest.mark.parametrize("seed,level", [(0, 3), (1, 3), (2, 3), (0, 0), (1, None)])
def test_cpp_reads_what_python_writes(mxq, tmp_path, seed, level):
    delta, expect = make_delta(seed)
    path = tmp_path / "d.mxqd"
    path.write_bytes(mc.write_delta(delta, level=level))
    r = _run(mxq, "delta", "inspect", "--json", str(path))
    assert r.returncode == 0, r.stderr
    got = json.loads(r.stdout)
    assert (got["base_version"], got["new_version"]) == (delta.base_version, delta.new_version)
    assert [t["name"] for t in got["tensors"]] == [t.name for t in delta.tensors]
    for j in got["tensors"]:
        t, new = expect[j["name"]]
        # The checksum the client wrote is the xxhash PyPI package's XXH3-64 of the new planes.
        assert int(j["checksum"], 16) == t.checksum
        assert j["kind"] == ("anchor" if t.anchor else "sparse")
        for plane, p in mcd._planes(t):
            entries = mcd._entries(t, plane)
            assert j[plane]["entries"] == entries
            assert j[plane]["changed"] == (entries if t.anchor else len(p.indices))
            if not t.anchor:
                names = ["gaps", "bitmap", "runs"]
                assert j[plane]["encoding"] == names[mcd.choose_encoding(p.indices, entries)]


@pytest.mark.parametrize("seed", [3, 4])
def test_cpp_writer_makes_the_python_bytes(mxq, tmp_path, seed):
    delta, _ = make_delta(seed)
    src, dst = tmp_path / "py.mxqd", tmp_path / "cpp.mxqd"
    src.write_bytes(mc.write_delta(delta, level=19))
    r = _run(mxq, "delta", "recode", str(src), "-o", str(dst), "--level", "5")
    assert r.returncode == 0, r.stderr
    cpp = dst.read_bytes()
    assert body_of(cpp) == mc.encode_body(delta)
    # Same header apart from nothing: sizes and body hash agree; Python reads the C++ file back.
    assert cpp[:32] == mc.write_delta(delta)[:32]
    back = mc.read_delta(cpp)
    assert mc.encode_body(back) == mc.encode_body(delta)


def test_raw_bodies_both_ways(mxq, tmp_path):
    """Flags bit 0 (refit-format.md §1): the body after the header as it is, the same bytes from both writers."""
    delta, _ = make_delta(5)
    py = mc.write_delta(delta, level=0)
    body = mc.encode_body(delta)
    assert struct.unpack_from("<I", py, 12)[0] == mcd.RAW_BODY and py[32:] == body
    src, dst = tmp_path / "py.mxqd", tmp_path / "cpp.mxqd"
    src.write_bytes(mc.write_delta(delta))
    r = _run(mxq, "delta", "recode", str(src), "-o", str(dst), "--level", "0")
    assert r.returncode == 0, r.stderr
    assert dst.read_bytes() == py
    assert mc.encode_body(mc.read_delta(py)) == body
    # the writer's choice: near-random bytes go raw, a compressible body goes through zstd
    noise = bytes(np.random.default_rng(0).integers(0, 256, 1 << 16, dtype=np.uint8))
    assert struct.unpack_from("<I", mcd.wrap_body(noise, None), 12)[0] == mcd.RAW_BODY
    assert struct.unpack_from("<I", mcd.wrap_body(bytes(1 << 16), None), 12)[0] == 0
    cut = tmp_path / "cut.mxqd"
    cut.write_bytes(py[:-1])
    r = _run(mxq, "delta", "inspect", str(cut))
    assert r.returncode != 0 and "a raw body of" in r.stderr, r.stderr


def forge(delta, edit):
    """A file whose body was edited after the client's checks (what a buggy or hostile writer sends)."""
    body = bytearray(mc.encode_body(delta))
    edit(body)
    frame = zstandard.ZstdCompressor(write_content_size=True).compress(bytes(body))
    return mcd.MAGIC + struct.pack("<IIQQ", 1, 0, len(body), xxhash.xxh3_64_intdigest(bytes(body))) + frame


def one_tensor(fmt, shape, anchor=False):
    rng = np.random.default_rng(9)
    old = random_planes(rng, fmt, shape)
    new = (old[0].copy(), old[1].copy())
    new[0][5] ^= 1
    if new[1].size:
        new[1][0] = (int(new[1][0]) + 1) % 0xFE
    return mc.Delta(1, 2, [mc.diff_tensor("w", fmt, shape, None if anchor else old, new)])


BAD = [
    # covers W-05: the new scale byte 0xFF is the E8M0 NaN
    ("e8m0_nan", "mxfp8", False, lambda b: b.__setitem__(len(b) - 1, 0xFF), "0xFF"),
    # covers W-05: an E4M3 NaN value code in an anchor (its last value byte sits before 64 scale bytes)
    ("e4m3_nan", "mxfp8", True, lambda b: b.__setitem__(len(b) - 65, 0x7F), "E4M3 NaN"),
    # covers G-08: a format name the reader does not know
    ("unknown_format", "mxfp8", False, lambda b: b.__setitem__(20 + 2 + 1 + 1 + 4, ord("Z")), "unknown format"),
]


@pytest.mark.parametrize("name,fmt,anchor,edit,expect", BAD, ids=[c[0] for c in BAD])
def test_cpp_refuses_by_name(mxq, tmp_path, name, fmt, anchor, edit, expect):
    path = tmp_path / f"{name}.mxqd"
    path.write_bytes(forge(one_tensor(fmt, (32, 64), anchor), edit))
    r = _run(mxq, "delta", "inspect", str(path))
    assert r.returncode == 2, r.stdout
    assert expect in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_client_refuses_what_cpp_refuses():
    delta = one_tensor("mxfp8", (32, 64))
    delta.tensors[0].values.data = b"\x7f" + delta.tensors[0].values.data[1:]  # covers W-05
    with pytest.raises(ValueError, match="W-05"):
        mc.encode_body(delta)
    delta = one_tensor("mxfp8", (32, 64))
    delta.tensors[0].values = mc.PlaneDelta(np.array([6, 5], np.int64), b"\x01\x02")  # covers W-04
    with pytest.raises(ValueError, match="W-04"):
        mc.encode_body(delta)
    for bad in (np.array([[5]], np.int64), np.array([5.0])):  # covers W-03: non-1-D, not integers
        delta.tensors[0].values = mc.PlaneDelta(bad, b"\x01")
        with pytest.raises(ValueError, match="W-03"):
            mc.encode_body(delta)
    with pytest.raises(ValueError, match="W-12"):
        mc.encode_body(mc.Delta(5, 5, []))


# The client's index encodings alone: the example bytes of docs/refit-format.md section 3, worked out by hand.
def test_client_index_bytes_match_the_spec_example():
    idx = np.array([0, 1, 2, 200], np.int64)
    assert mcd.encode_indices(mcd.GAPS, idx, 300) == bytes([0x00, 0x01, 0x01, 0xC6, 0x01])
    assert mcd.encode_indices(mcd.RUNS, idx, 300) == bytes([0x00, 0x03, 0xC5, 0x01, 0x01])
    bitmap = mcd.encode_indices(mcd.BITMAP, idx, 300)
    assert len(bitmap) == 38 and bitmap[0] == 0x07 and bitmap[25] == 0x01
    assert mcd.choose_encoding(idx, 300) == mcd.GAPS  # 5 bytes each for gaps and runs: the lower code


@pytest.mark.parametrize("enc", [mcd.GAPS, mcd.BITMAP, mcd.RUNS], ids=["gaps", "bitmap", "runs"])
@pytest.mark.parametrize("fraction", [0.0, 0.001, 0.2, 1.0])
def test_client_index_round_trip(enc, fraction):
    rng = np.random.default_rng(int(fraction * 1000) + enc)
    entries = 5003
    idx = np.flatnonzero(rng.random(entries) < fraction).astype(np.int64)
    data = mcd.encode_indices(enc, idx, entries)
    assert len(data) == mcd.encoded_size(enc, idx, entries)
    assert np.array_equal(mcd.decode_indices(enc, data, idx.size, entries), idx)


# ---- mxq delta make on the default model (models/default), f32 master weights ---------------------------
def _scatter(plane: bytes, p, width: int) -> bytes:
    out = np.frombuffer(plane, np.uint8).reshape(-1, width).copy()
    out[p.indices] = np.frombuffer(p.data, np.uint8).reshape(-1, width)
    return out.tobytes()


@pytest.fixture(scope="module")
def master_checkpoints(tmp_path_factory):
    """Base and target f32 checkpoints: the default model's weights off the bf16 grid, then one +-1e-5 step."""
    import ml_dtypes  # noqa: F401  (registers numpy bfloat16, which safetensors.numpy needs for BF16)
    from safetensors.numpy import load_file, save_file
    src = os.path.join(ROOT, "models", "default")
    if not os.path.isdir(src):
        pytest.skip("models/default is absent")
    rng = np.random.default_rng(0)
    tensors = {}
    for f in sorted(os.listdir(src)):
        if f.endswith(".safetensors"):
            tensors.update(load_file(os.path.join(src, f)))
    dirs = tmp_path_factory.mktemp("ckpt")
    base, target = dirs / "base", dirs / "target"
    for d in (base, target):
        d.mkdir()
        (d / "config.json").write_bytes(open(os.path.join(src, "config.json"), "rb").read())
    b = {n: t.astype(np.float32) * (1 + 1e-3 * rng.standard_normal(t.shape)).astype(np.float32)
         for n, t in tensors.items()}
    t = {n: w + np.where(rng.random(w.shape) < 0.5, 1e-5, -1e-5).astype(np.float32) for n, w in b.items()}
    save_file(b, str(base / "model.safetensors"))
    save_file(t, str(target / "model.safetensors"))
    return base, target


@pytest.mark.parametrize("quant", ["mxfp8", "mxfp4", "fp8-b128"])
def test_make_delta_applies_to_the_target_planes(mxq, master_checkpoints, tmp_path, quant):
    base, target = master_checkpoints
    files = {}
    for name, args in (("base", [base, base, "--anchor"]), ("target", [target, target, "--anchor"]),
                       ("step", [base, target, "--base-version", "3", "--new-version", "4"])):
        files[name] = tmp_path / f"{name}.mxqd"
        r = _run(mxq, "delta", "make", "--base", str(args[0]), "--target", str(args[1]), "--quantization", quant,
                "-o", str(files[name]), *map(str, args[2:]))
        assert r.returncode == 0, r.stderr
    assert "changed: values" in r.stdout and "file" in r.stdout, r.stdout
    anchors = {t.name: t for t in mc.read_delta(files["base"].read_bytes()).tensors}
    fresh = {t.name: t for t in mc.read_delta(files["target"].read_bytes()).tensors}
    step = mc.read_delta(files["step"].read_bytes())
    assert (step.base_version, step.new_version) == (3, 4)
    assert {t.name for t in step.tensors} == set(anchors)
    changed = 0
    for t in step.tensors:
        # Anchors of the base: the C++ checksum equals the xxhash package's over the real quantized planes.
        a = anchors[t.name]
        assert mc.canonical_checksum(np.frombuffer(a.values.data, np.uint8),
                                     np.frombuffer(a.scales.data, np.uint8)) == a.checksum
        values, scales = a.values.data, a.scales.data
        if t.anchor:
            values, scales = t.values.data, t.scales.data
        else:
            values = _scatter(values, t.values, mc.entry_bytes(t.format, "values"))
            if mcd.FORMATS[t.format][3]:
                scales = _scatter(scales, t.scales, mc.entry_bytes(t.format, "scales"))
            changed += len(t.values.indices)
        # base planes + the step's record == a fresh quantization of the target, byte for byte.
        assert (values, scales) == (fresh[t.name].values.data, fresh[t.name].scales.data), t.name
        assert xxhash.xxh3_64_intdigest(values + scales) == t.checksum
    assert changed > 0
