"""The client side of POST /update_weights_from_tensor without a GPU (CI): the manifest layout (16-byte aligned
offsets, every plane inside the buffer, planes disjoint, the table's order and coverage, refusals by name) and
the refusal of anything but torch CUDA tensors before any request. The torch path (packing, the IPC handle,
a receiving process) is in test_client_torch.py."""

import numpy as np
import pytest

from mxq_client import Client, build_manifest, plane_geometry
from mxq_client.ipc import check_cuda

# (name, dtype, shape): a Qwen3 layer's worth of every kind the manifest carries
CASES = [
    ("model.embed_tokens.weight", "bf16", (97, 64)),
    ("model.layers.0.input_layernorm.weight", "f32", (63,)),
    ("model.layers.0.self_attn.q_proj.weight", "mxfp8", (64, 96)),
    ("model.layers.0.self_attn.k_proj.weight", "mxfp4", (32, 96)),
    ("model.layers.0.mlp.down_proj.weight", "fp8-b128", (130, 200)),
    ("model.layers.0.mlp.experts.gate_up_proj", "mxfp8", (3, 64, 32)),
    ("model.norm.weight", "f16", (7,)),
    ("model.layers.0.mlp.up_proj.weight", "bf16", (33, 5)),
]


def entries(cases=CASES):
    out = []
    for name, dtype, shape in cases:
        vb, sb = plane_geometry(dtype, shape)
        out.append((name, dtype, shape, vb, sb))
    return out


@pytest.mark.parametrize("align", [16, 64, 1])
def test_manifest_offsets_are_aligned_disjoint_and_inside(align):
    ents = entries()
    tensors, size = build_manifest(ents, align=align)
    assert [t["name"] for t in tensors] == [e[0] for e in ents]  # coverage and order: the table's
    spans = []
    for t, (name, dtype, shape, vb, sb) in zip(tensors, ents):
        assert t["dtype"] == dtype and t["shape"] == list(shape), name
        assert t["offset"] % align == 0, name
        spans.append((t["offset"], t["offset"] + vb))
        if sb:
            assert t["scales_offset"] % align == 0 and t["scales_offset"] >= t["offset"] + vb, name
            spans.append((t["scales_offset"], t["scales_offset"] + sb))
        else:
            assert "scales_offset" not in t, name
    assert size % align == 0
    assert all(0 <= a < b <= size for a, b in spans)  # note: every plane here has bytes
    assert all(b1 <= a2 for (_, b1), (a2, _) in zip(spans, spans[1:]))  # disjoint, in order
    # the padding is the only slack: at most align - 1 bytes before each plane
    assert size - sum(b - a for a, b in spans) < align * len(spans) + align


def test_manifest_is_tight_for_aligned_sizes():
    tensors, size = build_manifest([("a", "bf16", (8,), 16, 0), ("b", "mxfp8", (1, 32), 32, 1),
                                    ("c", "f32", (4,), 16, 0)])
    assert [(t["offset"], t.get("scales_offset")) for t in tensors] == [(0, None), (16, 48), (64, None)]
    assert size == 80
    assert build_manifest([]) == ([], 0)


@pytest.mark.parametrize("bad, msg", [
    ([("a", "bf16", (2,), 4, 0), ("a", "bf16", (2,), 4, 0)], "a: named twice"),
    ([("w", "int8", (2,), 2, 0)], "w: dtype 'int8'"),
    ([("w", "mxfp8", (1, 32), 32, 0)], "w: mxfp8 with a scales plane of 0 bytes"),
    ([("w", "bf16", (2,), 4, 4)], "w: bf16 with a scales plane of 4 bytes"),
    ([("w", "bf16", (2,), -4, 0)], "w: negative plane size"),
])
def test_manifest_refusals_name_the_tensor(bad, msg):
    with pytest.raises(ValueError, match=msg):
        build_manifest(bad)


def test_manifest_refuses_an_alignment_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="alignment 24"):
        build_manifest(entries(), align=24)


@pytest.mark.parametrize("sd, msg", [
    ({"w": np.zeros(4, np.float32)}, "w is a ndarray, expected a torch CUDA tensor"),
    ({"w": [1.0]}, "w is a list"),
    ({}, "state dict is empty"),
])
def test_only_torch_cuda_tensors_are_shared(sd, msg):
    with pytest.raises((TypeError, ValueError), match=msg):
        check_cuda(sd)
    # note: refused before any request: nothing listens on this port
    with pytest.raises((TypeError, ValueError), match=msg):
        Client("http://127.0.0.1:9").update_weights_from_tensor(sd)
