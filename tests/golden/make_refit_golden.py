"""Golden data for tests/refit: canonical planes before/after a fake optimizer step, the delta the Python client
(python/mxq_client) writes for them, and XXH3-64 checksums from the xxhash package (PyPI, not ours) of random
planes. The C++ encoder must write the same body bytes; the C++ checksum must agree with xxhash.

Run: python3 tests/golden/make_refit_golden.py   (needs numpy, xxhash, zstandard)"""

import os
import sys

import numpy as np
import xxhash

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "..", "python"))
import mxq_client as mc  # noqa: E402

OUT = os.path.join(HERE, "refit")
rng = np.random.default_rng(20261129)

# (name, format, shape, how the step changes values, how it changes scales); kept in step with CASES in
# tests/refit/golden_delta_test.cpp.
CASES = [
    ("layers.0.mlp.up_proj.weight", "mxfp8", (64, 128), "scatter", "few"),      # gaps
    ("layers.0.mlp.down_proj.weight", "mxfp4", (32, 64), "dense", "few"),       # bitmap
    ("layers.0.self_attn.q_proj.weight", "fp8-b128", (130, 260), "rows", "one"),  # runs, f32 scale entry
    ("layers.0.input_layernorm.weight", "bf16", (300,), "scatter", None),
    ("lm_head.weight", "f32", (8, 8), "all", None),                              # anchor
    ("layers.0.mlp.experts.gate_up_proj", "mxfp8", (2, 16, 64), "none", "none"),  # empty planes
]


def random_planes(rng, fmt, shape, scale_bytes=(100, 140)):
    """Canonical planes of random legal codes (no E4M3 NaN; E8M0 scales drawn from `scale_bytes`)."""
    vb, sb = mc.plane_geometry(fmt, shape)
    if fmt in ("mxfp8", "fp8-b128"):
        v = rng.integers(0, 0x7F, vb, dtype=np.uint8) | (rng.integers(0, 2, vb, dtype=np.uint8) << 7)
    elif fmt == "mxfp4":
        v = rng.integers(0, 256, vb, dtype=np.uint8)
    else:
        v = rng.standard_normal(vb // (2 if fmt == "bf16" else 4)).astype(np.float32)
        v = ((v.view(np.uint32) >> 16).astype(np.uint16) if fmt == "bf16" else v).view(np.uint8)
    if fmt == "fp8-b128":
        s = (rng.random(sb // 4).astype(np.float32) + 0.01).view(np.uint8)
    else:
        s = rng.integers(*scale_bytes, sb, dtype=np.uint8)
    return v.copy(), s.copy()


def step(plane, how, width, fresh):
    out = plane.copy()
    n = plane.size // width
    if how == "none":
        return out
    pick = {"scatter": lambda: rng.choice(n, max(1, n // 200), replace=False),
            "dense": lambda: rng.choice(n, n // 5, replace=False),
            "rows": lambda: np.concatenate([np.arange(s, s + 40) for s in (10, 300, 5000)]),
            "all": lambda: np.arange(n), "few": lambda: rng.choice(n, 3, replace=False),
            "one": lambda: np.array([4])}[how]()
    rows = out.reshape(n, width)
    rows[pick] = fresh.reshape(n, width)[pick]
    return out


def main():
    os.makedirs(OUT, exist_ok=True)
    tensors = []
    for i, (name, fmt, shape, vhow, show) in enumerate(CASES):
        ov, os_ = random_planes(rng, fmt, shape)
        fv, fs = random_planes(rng, fmt, shape)
        nv = step(ov, vhow, mc.entry_bytes(fmt, "values"), fv)
        ns = step(os_, show, mc.entry_bytes(fmt, "scales"), fs) if show else os_
        for tag, arr in (("old_values", ov), ("old_scales", os_), ("new_values", nv), ("new_scales", ns)):
            np.save(os.path.join(OUT, f"t{i}_{tag}.npy"), arr)
        tensors.append(mc.diff_tensor(name, fmt, shape, (ov, os_), (nv, ns)))
    delta = mc.Delta(7, 8, tensors)
    with open(os.path.join(OUT, "delta_body.bin"), "wb") as f:
        f.write(mc.encode_body(delta))
    with open(os.path.join(OUT, "delta.mxqd"), "wb") as f:
        f.write(mc.write_delta(delta))
    # Checksums of random values+scales planes of assorted sizes (0 and the XXH3 size classes 16/128/240).
    sizes = [(0, 0), (1, 0), (16, 3), (100, 28), (129, 111), (240, 1), (1000, 0), (4096, 128), (65536, 2048)]
    blob = rng.integers(0, 256, sum(a + b for a, b in sizes), dtype=np.uint8)
    sums, at = [], 0
    for a, b in sizes:
        h = xxhash.xxh3_64(seed=0)
        h.update(blob[at:at + a].tobytes())
        h.update(blob[at + a:at + a + b].tobytes())
        sums.append(h.intdigest())
        at += a + b
    np.save(os.path.join(OUT, "checksum_blob.npy"), blob)
    np.save(os.path.join(OUT, "checksum_sizes.npy"), np.array(sizes, np.int64))
    np.save(os.path.join(OUT, "checksum_xxh3.npy"), np.array(sums, np.uint64))
    for t in tensors:
        print(t.name, t.format, "anchor" if t.anchor else "sparse", len(t.values.indices), len(t.scales.indices),
              [mc.delta.choose_encoding(p.indices, mc.delta._entries(t, pl)) for pl, p in mc.delta._planes(t)])


if __name__ == "__main__":
    main()
