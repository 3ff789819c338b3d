"""POST /update_weights_from_tensor on `mxq serve --device cuda` from another process on the same GPU (CUDA IPC,
docs/serve.md "Update from a CUDA buffer"): this process plays the colocated trainer with torch. New bf16 weights
land as the client's numpy quantizer makes them (checksums), the CUDA-graph engine then decodes exactly as a fresh
server loaded with the same weights from disk, a NaN or a wrong checksum leaves every byte, and the original
weights come back bit-exact. Skipped without torch + a GPU (CI); run on the GPU machine:
`python -m pytest tests/e2e/test_serve_tensor_gpu.py`."""
import base64
import json
import shutil

import numpy as np
import pytest

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs a CUDA GPU", allow_module_level=True)
safetensors_torch = pytest.importorskip("safetensors.torch")

from serve_fixtures import DEFAULT_MODEL, ROOT  # noqa: E402
import sys  # noqa: E402

sys.path.insert(0, str(ROOT / "python"))
from mxq_client import delta as mcd  # noqa: E402
from mxq_client import quantize as mq  # noqa: E402

PROMPT = list(range(300, 340))


def checkpoint():
    out = {}
    for f in sorted(DEFAULT_MODEL.glob("*.safetensors")):
        out.update(safetensors_torch.load_file(str(f)))
    return out


def greedy(server, n=24):
    # note: the prefix cache is flushed first, so every call prefills the whole prompt (a cached prefix takes
    # other kernels for the rest, and a noisy model's near-ties then flip tokens)
    server.post_json("/flush_cache", {})
    return server.completion(prompt=PROMPT, max_tokens=n, temperature=0)["choices"][0]["text"]


def manifest_of(weights, live, planes=False):
    """One flat CUDA buffer and its manifest: each live tensor's bf16 weights, or (planes) its canonical planes
    quantized by the client, 16-byte aligned."""
    chunks, tensors, at = [], [], 0

    def put(t):
        nonlocal at
        b = t.contiguous().view(torch.uint8).reshape(-1)
        pad = (-b.numel()) % 16
        chunks.append(torch.cat([b, torch.zeros(pad, dtype=torch.uint8, device=b.device)]) if pad else b)
        at, off = at + b.numel() + pad, at
        return off

    for name, (fmt, shape) in live.items():
        w = weights[name].to("cuda", torch.bfloat16)
        if planes and fmt in mq.QUANTIZED:
            v, s = mq.quantize_tensor(fmt, w, name)
            entry = {"name": name, "dtype": fmt, "shape": list(shape),
                     "offset": put(torch.from_numpy(v).cuda()), "scales_offset": put(torch.from_numpy(s).cuda()),
                     "checksum": f"{mcd.canonical_checksum(v, s):016x}"}
        else:
            entry = {"name": name, "dtype": "bfloat16", "shape": list(shape), "offset": put(w)}
        tensors.append(entry)
    buf = torch.cat(chunks)
    torch.cuda.synchronize()
    share = buf.untyped_storage()._share_cuda_()
    body = {"ipc_handle": base64.b64encode(share[1]).decode(), "ipc_offset": share[3] + buf.storage_offset(),
            "size": buf.numel(), "tensors": tensors}
    return buf, body


def expected_checksums(weights, live):
    out = {}
    for name, (fmt, shape) in live.items():
        if fmt in mq.QUANTIZED:
            v, s = mq.quantize_tensor(fmt, weights[name].to(torch.bfloat16), name)
        else:
            v, s = weights[name].to(torch.bfloat16).view(torch.int16).numpy().view(np.uint8).reshape(-1), None
        out[name] = f"{mcd.canonical_checksum(v, s):016x}"
    return out


@pytest.fixture
def cuda_server(serve_factory):
    return serve_factory("--device", "cuda", "--quantization", "mxfp8", "--model", str(DEFAULT_MODEL),
                         device_cpu=False)


def live_table(server):
    info = json.loads(server.get("/get_model_info")[2])
    return {t["name"]: (t["format"], tuple(t["shape"])) for t in info["tensors"]}


def test_ipc_update_equals_a_fresh_load_and_failures_leave_every_byte(cuda_server, serve_factory, tmp_path):
    s = cuda_server
    live = live_table(s)
    a = checkpoint()
    tokens_a = greedy(s)
    sums_a = s.post_json("/weights_checker", {"action": "checksum"})["checksums"]
    g = torch.Generator().manual_seed(7)
    b = {k: (v.float() * (1 + 0.5 * torch.randn(v.shape, generator=g))).to(torch.bfloat16) for k, v in a.items()}
    buf, body = manifest_of(b, live)
    j = s.post_json("/update_weights_from_tensor", body)
    assert j["success"] and j["weight_version"] == "1", j
    del buf
    assert s.post_json("/weights_checker", {"action": "checksum"})["checksums"] == expected_checksums(b, live)
    tokens_b = greedy(s)
    # a fresh server on the same weights from disk decodes the same tokens (graphs replayed on moved-into bytes)
    d = tmp_path / "b"
    shutil.copytree(DEFAULT_MODEL, d)
    for f in d.glob("*.safetensors"):
        f.unlink()
    safetensors_torch.save_file({k: v.contiguous() for k, v in b.items()}, str(d / "model.safetensors"),
                                metadata={"format": "pt"})
    fresh = serve_factory("--device", "cuda", "--quantization", "mxfp8", "--model", str(d), device_cpu=False)
    assert greedy(fresh) == tokens_b
    fresh.stop(30)
    # a NaN source block and a wrong plane checksum: refused, every byte stays
    sums_b = s.post_json("/weights_checker", {"action": "checksum"})["checksums"]
    bad = dict(b)
    name = next(n for n, (f, _) in live.items() if f == "mxfp8")
    bad[name] = b[name].clone()
    bad[name].view(-1)[123] = float("nan")
    buf, body = manifest_of(bad, live)
    status, _, out = s.post("/update_weights_from_tensor", body)
    assert status == 400 and name in json.loads(out)["message"], out
    buf, body = manifest_of(a, live, planes=True)
    entry = next(t for t in body["tensors"] if "checksum" in t)
    entry["checksum"] = f"{int(entry['checksum'], 16) ^ 1:016x}"
    status, _, out = s.post("/update_weights_from_tensor", body)
    assert status == 400 and "W-06" in json.loads(out)["message"], out
    assert s.post_json("/weights_checker", {"action": "checksum"})["checksums"] == sums_b
    assert greedy(s) == tokens_b
    # back to A as canonical planes from the client: bit-exact, A's tokens again
    buf, body = manifest_of(a, live, planes=True)
    j = s.post_json("/update_weights_from_tensor", body)
    assert j["success"] and j["weight_version"] == "2", j
    assert s.post_json("/weights_checker", {"action": "checksum"})["checksums"] == sums_a
    assert greedy(s) == tokens_a
