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
    for t in (x, x.bfloat16(), x.half().float()):
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
