"""The client's torch quantizers (same algorithm as the numpy path, torch ops, on CPU and CUDA tensors) against
the numpy path, which test_client_quantize.py pins to the C++ codecs byte for byte. Skipped where torch is not
installed (CI); run on the GPU machine: `python -m pytest tests/e2e/test_client_torch.py`."""

import pathlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import mxq_client as mc  # noqa: E402
from mxq_client import quantize as q  # noqa: E402

GOLDEN = pathlib.Path(__file__).resolve().parents[2] / "tests" / "golden" / "format"
DEVICES = ["cpu"] + (["cuda"] if torch.cuda.is_available() else [])


def load(name):
    return np.load(GOLDEN / f"{name}.npy")


def bf16_tensor(bits, device):
    return torch.from_numpy(np.ascontiguousarray(bits, np.uint16).view(np.int16)).view(torch.bfloat16).to(device)


def same(a, b):
    return all(np.array_equal(x, y) for x, y in zip(a, b))


@pytest.mark.parametrize("device", DEVICES)
def test_goldens_through_torch(device):
    x = torch.from_numpy(load("random_f32_in").view(np.float32)).to(device)
    for rule in ("ceil", "ocp", "floor", "ct"):
        v, s = q.quantize_tensor("mxfp8", x, "random", rule)
        assert np.array_equal(s, load(f"random_mxfp8_{rule}_scale").reshape(-1)), rule
        assert np.array_equal(v, load(f"random_mxfp8_{rule}_elems").reshape(-1)), rule
    v, s = q.quantize_tensor("mxfp4", bf16_tensor(load("random_bf16_in"), device), "random")
    assert np.array_equal(v, load("random_mxfp4_ct_elems").reshape(-1))
    for tag in ("bf16_129x131", "bf16_130x7", "f32_40x140"):
        raw = load(f"b128_{tag}_in")
        t = bf16_tensor(raw, device) if tag.startswith("bf16") else torch.from_numpy(raw.view(np.float32)).to(device)
        v, s = q.quantize_tensor("fp8-b128", t, tag)
        assert np.array_equal(v, load(f"b128_{tag}_values").reshape(-1)), tag
        assert np.array_equal(s, load(f"b128_{tag}_scales").reshape(-1).view(np.uint8)), tag


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "fp8-b128"])
def test_torch_equals_numpy(device, fmt):
    """Random f32 / bf16 tensors with a wide magnitude spread, f32 subnormals, zeros, stacked experts."""
    g = torch.Generator().manual_seed(0)
    x = torch.randn(3, 200, 256, generator=g) * torch.exp2(torch.randint(-60, 60, (3, 200, 1), generator=g).float())
    x[0, 0, :64] = 0
    x[1, 1, :32] = torch.tensor([1e-45, -1e-45, 3e-39, 448.0] * 8)
    x[2, 130:, 128:] = 0
    # note: f16 tops out at 65504; the clamp keeps its variant finite (an Inf block is refused, not quantized)
    for t in (x, x.bfloat16(), x.clamp(-6e4, 6e4).half().float()):
        want = q.quantize_tensor(fmt, _np(t), "w")
        got = q.quantize_tensor(fmt, t.to(device), "w")
        assert same(got, want), (fmt, t.dtype, device)


def _np(t):
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


@pytest.mark.parametrize("device", DEVICES)
def test_torch_refuses_nan_by_block(device):
    x = torch.ones(2, 130, 200)
    x[1, 129, 150] = float("nan")
    with pytest.raises(ValueError, match=r"w: block \(1, 1\) holds NaN/Inf \(rows 128..129, cols 128..199\) "
                                         r"\(expert 1\)"):
        q.quantize_tensor("fp8-b128", x.to(device), "w")


@pytest.mark.parametrize("device", DEVICES)
def test_plain_and_state_dict_mapping_from_torch(device):
    x = torch.randn(64, generator=torch.Generator().manual_seed(1)).to(device)
    assert np.array_equal(mc.plain_bytes("bf16", x, "n"), mc.plain_bytes("bf16", x.cpu().numpy(), "n"))
    assert np.array_equal(mc.plain_bytes("bf16", x.bfloat16(), "n"), mc.plain_bytes("bf16", x.cpu().numpy(), "n"))
    gu = torch.randn(2, 64, 32).to(device)
    table = {f"model.layers.0.mlp.experts.{e}.{p}_proj.weight": ("mxfp8", (32, 32)) for e in range(2)
             for p in ("gate", "up")}
    m = mc.map_state_dict({"model.layers.0.mlp.experts.gate_up_proj": gu}, table)
    assert torch.equal(m["model.layers.0.mlp.experts.1.up_proj.weight"], gu[1, 32:])


@pytest.mark.parametrize("device", DEVICES)
def test_plain_bytes_on_the_device_equal_the_numpy_encoders(device):
    """Plain tensors (embeddings, norms, lm_head) are converted on the tensor's device: the bytes equal the numpy
    encoders' (codec.cpp's twins) on ties of both parities, subnormals, signed zeros and values that round up to
    the largest finite bf16 / f16; an overflow to inf is refused by both."""
    rng = np.random.default_rng(5)
    hi = rng.integers(0, 1 << 16, 4096, dtype=np.uint32)  # any sign and exponent (non-finite dropped below)
    words = np.concatenate([(hi << 16) | 0x8000, (hi << 16) | 0x7FFF, (hi << 16) | 0x8001,
                            rng.integers(0, 1 << 32, 4096, dtype=np.uint64).astype(np.uint32),
                            np.uint32([0x80000000, 0, 0x00000001, 0x807FFFFF, 0x7F7F7FFF, 0xFF7F7FFF])])
    x = words.view(np.float32)
    x = x[np.isfinite(x)]
    for fmt, limit in (("bf16", 3.38e38), ("f16", 65504.0), ("f32", None)):
        ok = x if limit is None else x[np.abs(x) <= limit]
        t = torch.from_numpy(ok.copy()).to(device)
        assert np.array_equal(mc.plain_bytes(fmt, t, "n"), mc.plain_bytes(fmt, ok, "n")), fmt
        tb = t[t.abs() <= 3.38e38].bfloat16()  # a bf16 source (its overflow is a separate refusal)
        assert np.array_equal(mc.plain_bytes(fmt, tb, "n"), mc.plain_bytes(fmt, _np(tb.cpu()), "n"))
    for fmt, big in (("bf16", 3.4e38), ("f16", 65520.0)):
        for src in (np.float32([1, big]), ):
            with pytest.raises(ValueError, match="element 1 is NaN or Inf"):
                mc.plain_bytes(fmt, torch.from_numpy(src).to(device), "n")
            with pytest.raises(ValueError, match="element 1 is NaN or Inf"):
                mc.plain_bytes(fmt, src, "n")


# ---- POST /update_weights_from_tensor: packing, diff, the IPC handle -----------------------------------------
TABLE = {
    "model.embed_tokens.weight": ("bf16", (96, 64)),
    "model.layers.0.input_layernorm.weight": ("f32", (64,)),
    "model.layers.0.self_attn.q_proj.weight": ("mxfp8", (64, 64)),
    "model.layers.0.self_attn.k_proj.weight": ("mxfp4", (32, 64)),
    "model.layers.0.mlp.down_proj.weight": ("fp8-b128", (130, 200)),
}


def state_dict(device, seed=0, dtype=torch.float32):
    g = torch.Generator().manual_seed(seed)
    return {n: (torch.randn(*shape, generator=g) * 0.02).to(dtype).to(device) for n, (_, shape) in TABLE.items()}


def bf16_np(t):
    return t.detach().cpu().to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("on_trainer", [False, True])
def test_pack_lays_out_the_manifest_and_the_bytes(device, on_trainer):
    from mxq_client import ipc
    sd = state_dict(device)
    buf, tensors, planes = ipc.pack_state_dict(sd, TABLE, quantize_on_trainer=on_trainer)
    assert buf.dtype == torch.uint8 and buf.device.type == device and buf.numel() % 16 == 0
    raw = buf.cpu().numpy()
    for t in tensors:
        name, (fmt, shape) = t["name"], TABLE[t["name"]]
        assert t["shape"] == list(shape) and t["offset"] % 16 == 0
        got_v = raw[t["offset"]:t["offset"] + planes[name][0].numel()]
        if fmt in ("bf16", "f32"):  # plain live tensors: their live dtype
            assert t["dtype"] == fmt
            want = bf16_np(sd[name]) if fmt == "bf16" else sd[name].cpu().numpy().view(np.uint8)
            assert np.array_equal(got_v, want.reshape(-1)), name
        elif on_trainer:  # canonical planes of the bf16 source
            assert t["dtype"] == fmt and t["scales_offset"] % 16 == 0
            v, s = mc.quantize_tensor(fmt, sd[name].to(torch.bfloat16).cpu(), name)
            assert np.array_equal(got_v, v), name
            assert np.array_equal(raw[t["scales_offset"]:t["scales_offset"] + s.size], s), name
        else:  # the bf16 source (f32 masters rounded on the device)
            assert t["dtype"] == "bf16" and "scales_offset" not in t
            assert np.array_equal(got_v, bf16_np(sd[name]).reshape(-1)), name


@pytest.mark.parametrize("device", DEVICES)
def test_diff_packed_finds_the_changed_entries_of_every_plane(device):
    from mxq_client import ipc
    a, b = state_dict(device, 1), state_dict(device, 1)
    g = torch.Generator().manual_seed(2)
    for n in b:
        hit = torch.rand(b[n].shape, generator=g) < 0.02
        b[n] = torch.where(hit.to(device), b[n] * 3.0, b[n])
    old, tensors, pa = ipc.pack_state_dict(a, TABLE, quantize_on_trainer=True)
    new, tensors_b, pb = ipc.pack_state_dict(b, TABLE, quantize_on_trainer=True)
    assert tensors == tensors_b
    got = ipc.diff_packed(old, new, tensors)
    for t in tensors:
        name, fmt = t["name"], t["dtype"]
        for k, plane in enumerate(("values", "scales")):
            o, n = pa[name][k].cpu().numpy(), pb[name][k].cpu().numpy()
            if not o.size:
                continue
            width = mc.entry_bytes(fmt, plane) if fmt in mc.delta.FORMATS else 1
            idx = mc.changed_entries(o, n, width)
            have = got.get(name, {}).get(plane)
            if not idx.size:
                assert have is None, (name, plane)
                continue
            assert np.array_equal(have[0], idx), (name, plane)
            assert np.array_equal(have[1], n.reshape(-1, width)[idx].reshape(-1)), (name, plane)
    assert got, "the perturbation changed nothing"


# note: planes of every entry width (bf16 2, f32 4, FP8-B128 scales 4, the rest 1 byte), with plane ends inside
# 8-byte words (padding follows), and a last plane that ends the buffer; 26,576 bytes: a multiple of 8 but not of
# the diff's 64-byte chunk, so the final chunk is partial
DIFF_LAYOUT = [("a", "bf16", (37,)), ("b", "f32", (13,)), ("c", "mxfp8", (3, 64)), ("d", "fp8-b128", (130, 200)),
               ("e", "mxfp4", (5, 64)), ("f", "bf16", (16,))]


def diff_layout(layout=DIFF_LAYOUT, align=16):
    from mxq_client import ipc
    entries = []
    for name, fmt, shape in layout:
        values, scales = (mc.delta.plane_geometry(fmt, shape) if fmt in mc.delta.FORMATS
                          else (ipc._source_bytes(fmt, shape), 0))
        entries.append((name, fmt, shape, values, scales))
    tensors, size = ipc.build_manifest(entries, align)
    return tensors, -(-size // 8) * 8


def reference_diff(old, new, tensors):
    """diff_packed's answer from host copies: np.nonzero over each plane's entries."""
    from mxq_client import ipc
    out = {}
    for name, plane, start, size, width in ipc._planes_of(tensors):
        a, b = old[start:start + size].reshape(-1, width), new[start:start + size].reshape(-1, width)
        idx = np.nonzero((a != b).any(1))[0]
        if idx.size:
            out.setdefault(name, {})[plane] = (idx, b[idx].reshape(-1))
    return out


def in_planes(tensors, size):
    from mxq_client import ipc
    inside = np.zeros(size, bool)
    for *_, start, n, _ in ipc._planes_of(tensors):
        inside[start:start + n] = True
    return inside


def wide_bytes(tensors, size, high):
    """The high (or low) byte of every entry of the planes whose entries are wider than a byte."""
    from mxq_client import ipc
    out = [start + np.arange(n // width) * width + (width - 1 if high else 0)
           for *_, start, n, width in ipc._planes_of(tensors) if width > 1]
    return np.concatenate(out)


def changed_bytes(case, tensors, size, rng):
    """Byte offsets that a case changes (each by a nonzero xor)."""
    inside = np.flatnonzero(in_planes(tensors, size))
    if case == "none":
        return np.zeros(0, np.int64)
    if case == "sparse":  # about 0.1% of the bytes, the trainer's case
        return rng.choice(inside, 30, replace=False)
    if case == "dense":  # most words several bytes, most chunks changed
        return inside[rng.random(inside.size) < 0.3]
    if case == "every byte":
        return inside
    if case == "chunk edges":  # both sides of every 64-byte chunk boundary, and of every 8-byte word in one chunk
        edges = np.concatenate([np.arange(64, size, 64) - 1, np.arange(0, size, 64), np.arange(1088, 1152, 8) - 1])
        return np.intersect1d(edges, inside)
    if case == "last bytes":  # the final, partial chunk: its first and its last byte (the buffer's last)
        assert size % 64 and inside[-1], "the layout must end the buffer with a partial chunk"
        return np.array([size // 64 * 64, size - 1])
    if case == "high byte only":
        return rng.choice(wide_bytes(tensors, size, high=True), 40, replace=False)
    if case == "low byte only":
        return rng.choice(wide_bytes(tensors, size, high=False), 40, replace=False)
    if case == "padding only":  # never happens (padding is written once, as zeros); the planes still did not change
        return np.flatnonzero(~in_planes(tensors, size))
    raise AssertionError(case)


DIFF_CASES = ["none", "sparse", "dense", "every byte", "chunk edges", "last bytes", "high byte only",
              "low byte only", "padding only"]


def check_diff(got, want, tensors):
    assert got.keys() == want.keys()
    for name in want:
        assert got[name].keys() == want[name].keys(), name
        t = next(t for t in tensors if t["name"] == name)
        for plane, (idx, data) in want[name].items():
            have_idx, have_data = got[name][plane]
            wide = (mc.entry_bytes(t["dtype"], plane) if t["dtype"] in mc.delta.FORMATS
                    else {"bf16": 2, "f32": 4}[t["dtype"]]) > 1
            assert have_idx.dtype == (np.int64 if wide else np.int32), (name, plane, have_idx.dtype)
            assert have_data.dtype == np.uint8, (name, plane)
            assert np.array_equal(have_idx, idx), (name, plane)
            assert np.array_equal(have_data, data), (name, plane)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("case", DIFF_CASES)
def test_diff_packed_equals_a_host_reference(device, case):
    from mxq_client import ipc
    tensors, size = diff_layout()
    assert size == 26576 and size % 64
    rng = np.random.default_rng(DIFF_CASES.index(case))
    old = rng.integers(0, 256, size, dtype=np.uint8)
    old[~in_planes(tensors, size)] = 0
    new = old.copy()
    at = changed_bytes(case, tensors, size, rng)
    new[at] ^= rng.integers(1, 256, at.size, dtype=np.uint8)
    got = ipc.diff_packed(torch.from_numpy(old).to(device), torch.from_numpy(new).to(device), tensors)
    want = reference_diff(old, new, tensors)
    assert bool(want) == (case not in ("none", "padding only")), case
    check_diff(got, want, tensors)


@pytest.mark.parametrize("device", DEVICES)
def test_diff_packed_with_byte_planes_that_share_words(device):
    """Byte-entry planes at any alignment: a changed word may hold the end of one plane and the start of the
    next, each byte is placed by its own offset."""
    from mxq_client import ipc
    tensors, size = diff_layout([("c", "mxfp8", (3, 64)), ("e", "mxfp4", (5, 64)), ("g", "mxfp8", (1, 32))], 1)
    assert any(t["offset"] % 8 for t in tensors)
    rng = np.random.default_rng(9)
    old = rng.integers(0, 256, size, dtype=np.uint8)
    new = old.copy()
    at = np.concatenate([rng.choice(size, 40, replace=False), [t["offset"] for t in tensors]])
    new[at] ^= 0x80
    got = ipc.diff_packed(torch.from_numpy(old).to(device), torch.from_numpy(new).to(device), tensors)
    check_diff(got, reference_diff(old, new, tensors), tensors)


def test_diff_packed_refuses_what_it_cannot_diff():
    from mxq_client import ipc
    tensors, size = diff_layout([("c", "mxfp8", (1, 32)), ("a", "bf16", (3,))], 2)
    buf = torch.zeros(size, dtype=torch.uint8)
    with pytest.raises(ValueError, match=r"a: values plane at byte 34, not a multiple of 8"):
        ipc.diff_packed(buf, buf, tensors)
    with pytest.raises(ValueError, match=r"packed buffers of 48 and 40 bytes"):
        ipc.diff_packed(torch.zeros(48, dtype=torch.uint8), torch.zeros(40, dtype=torch.uint8), tensors)


CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


@CUDA
@pytest.mark.parametrize("fmt", ["mxfp8", "mxfp4", "fp8-b128"])
def test_fused_quantizers_equal_the_eager_ones(fmt):
    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 256, 384, generator=g) * torch.exp2(torch.randint(-40, 40, (2, 256, 1), generator=g).float())
    x[0, 0, :64] = 0
    x[1, 1, :32] = torch.tensor([1e-45, -1e-45, 3e-39, 448.0] * 8)
    for t in (x.cuda(), x.bfloat16().cuda()):
        want = q.quantize_planes(fmt, t, "w")
        got = q.quantize_planes(fmt, t, "w", fused=True)
        assert all(torch.equal(a, b) for a, b in zip(got, want)), (fmt, t.dtype)
    # every positive finite bf16 as a block amax (the scale rules' whole domain for bf16 sources)
    amax = torch.arange(1, 0x7F80, dtype=torch.int32).to(torch.int16).view(torch.bfloat16).cuda()
    blocks = torch.zeros(amax.numel(), 128, dtype=torch.bfloat16, device="cuda")
    blocks[:, 0] = amax
    blocks[:, 1] = -amax * 0.3
    blocks = blocks[: amax.numel() // 128 * 128]
    want = q.quantize_planes(fmt, blocks, "w")
    got = q.quantize_planes(fmt, blocks, "w", fused=True)
    assert all(torch.equal(a, b) for a, b in zip(got, want)), fmt
    bad = x.cuda()
    bad[1, 200, 300] = float("inf")
    with pytest.raises(ValueError, match=r"holds NaN/Inf"):
        q.quantize_planes(fmt, bad, "w", fused=True)


@CUDA
def test_ipc_handle_is_the_allocation_and_the_offset():
    from mxq_client import ipc
    big = torch.empty(1 << 22, dtype=torch.uint8, device="cuda")
    view = big[4096:]
    handle, offset, counter = ipc.ipc_handle(view)
    assert len(handle) == 64 and offset == 4096 + ipc.ipc_handle(big)[1]
    ipc.release_ipc_counter(counter)


RECEIVER = r'''
import base64, json, sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
import cupy, numpy as np, xxhash
table = json.loads(sys.argv[1])
state = {"version": 0}

class H(BaseHTTPRequestHandler):
    def log_message(self, *a):
        pass

    def reply(self, code, obj):
        body = json.dumps(obj).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self):
        if self.path == "/get_model_info":
            return self.reply(200, {"tensors": table})
        if self.path == "/get_weight_version":
            return self.reply(200, {"weight_version": str(state["version"])})
        self.reply(404, {"success": False, "message": "no route"})

    def do_POST(self):
        req = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        handle = base64.b64decode(req["ipc_handle"])
        assert len(handle) == 64, len(handle)
        ptr = cupy.cuda.runtime.ipcOpenMemHandle(handle)
        host = np.empty(req["size"], np.uint8)
        cupy.cuda.runtime.memcpy(host.ctypes.data, ptr + req["ipc_offset"], req["size"], 2)  # device to host
        cupy.cuda.runtime.ipcCloseMemHandle(ptr)
        digests = {}
        for t in req["tensors"]:
            end = t.get("scales_offset", t["offset"])
            digests[t["name"]] = [t["dtype"], xxhash.xxh3_64_hexdigest(host[t["offset"]:t["offset"] + t["_values"]]),
                                  xxhash.xxh3_64_hexdigest(host[end:end + t.get("_scales", 0)])]
        state["version"] = int(req["weight_version"])
        self.reply(200, {"success": True, "message": "ok", "weight_version": req["weight_version"],
                         "digests": digests, "flush_cache": req["flush_cache"]})

s = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(s.server_address[1], flush=True)
s.serve_forever()
'''


@CUDA
@pytest.mark.parametrize("on_trainer", [False, True])
def test_update_weights_from_tensor_through_a_receiving_process(on_trainer, monkeypatch):
    """A second process opens the 64-byte handle (cupy: no torch framing), copies `size` bytes from
    `ipc_offset` and hashes each plane where the manifest says it is: the client's bytes, exactly."""
    pytest.importorskip("cupy")
    import json
    import subprocess
    import sys
    from mxq_client import ipc
    table = [{"name": n, "format": f, "shape": list(s)} for n, (f, s) in TABLE.items()]
    p = subprocess.Popen([sys.executable, "-c", RECEIVER, json.dumps(table)], stdout=subprocess.PIPE, text=True)
    try:
        port = int(p.stdout.readline())
        c = mc.Client(f"http://127.0.0.1:{port}")
        sd = state_dict("cuda", 3)
        # note: the receiver needs each plane's size; the test passes it beside the manifest's fields
        real = ipc.build_manifest

        def sized(entries, align=ipc.ALIGN):
            tensors, size = real(entries, align)
            for t, e in zip(tensors, entries):
                t["_values"], t["_scales"] = e[3], e[4]
            return tensors, size
        monkeypatch.setattr(ipc, "build_manifest", sized)
        reply = c.update_weights_from_tensor(sd, quantize_on_trainer=on_trainer)
        assert reply["weight_version"] == "1" and reply["flush_cache"] is True
        assert c.weight_version() == 1 and c.last_update["tensors"] == len(TABLE)
        for name, (fmt, _) in TABLE.items():
            dtype, hv, hs = reply["digests"][name]
            if fmt in ("bf16", "f32"):
                want = bf16_np(sd[name]) if fmt == "bf16" else sd[name].cpu().numpy().view(np.uint8)
                assert dtype == fmt and hv == f"{mc.canonical_checksum(want.reshape(-1)):016x}", name
            elif on_trainer:
                v, s = mc.quantize_tensor(fmt, sd[name].to(torch.bfloat16), name)
                assert dtype == fmt and (hv, hs) == (f"{mc.canonical_checksum(v):016x}",
                                                     f"{mc.canonical_checksum(s):016x}"), name
            else:
                assert dtype == "bf16" and hv == f"{mc.canonical_checksum(bf16_np(sd[name]).reshape(-1)):016x}"
        # kept planes: the trainer's canonical planes after a checked on-trainer update, none otherwise
        assert (c._planes_version == 1) == on_trainer
        with pytest.raises(TypeError, match="expected a CUDA tensor"):
            c.update_weights_from_tensor({k: v.cpu() for k, v in sd.items()})
    finally:
        p.kill()
        p.wait()
