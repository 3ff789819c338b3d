#!/usr/bin/env python3
"""Writes tests/golden/safetensors/differential.bin: random near-valid safetensors images, each with the
verdict of the reference reader (the python `safetensors` library's Rust deserializer).

The C++ test (tests/io/safetensors_test.cpp, SafetensorsDifferential) checks that mxq never accepts what the
reference refuses, and refuses what the reference accepts only for its documented stricter rules.
Format: per case, u32 little-endian length, u8 verdict (1 = reference accepts), then the image bytes.
Deterministic (fixed seed). Run with the machine's python3 (safetensors installed).
"""
import json
import pathlib
import random
import struct

from safetensors._safetensors_rust import deserialize

OUT = pathlib.Path(__file__).resolve().parent / "safetensors" / "differential.bin"
CASES = 600
# dtype -> bits; includes names the reference knows and mxq refuses (C64, F6_E2M3, FNUZ) and one nobody knows.
DTYPES = {"BOOL": 8, "F4": 4, "U8": 8, "I8": 8, "F8_E5M2": 8, "F8_E4M3": 8, "F8_E8M0": 8, "I16": 16, "U16": 16,
          "F16": 16, "BF16": 16, "I32": 32, "U32": 32, "F32": 32, "F64": 64, "I64": 64, "U64": 64, "C64": 64,
          "F6_E2M3": 6, "F8_E4M3FNUZ": 8, "f32": 32}
NAMES = ["a", "b", "c", "w.0", "__metadata__", "a\u0000", "\u00e9", "a/b", "../x"]


def image(rng):
    entries, offset = [], 0
    for i in range(rng.randint(0, 4)):
        dtype = rng.choice(list(DTYPES))
        shape = [rng.choice([0, 1, 2, 3, 4, 8]) for _ in range(rng.choice([0, 1, 1, 2, 2, 3]))]
        numel = 1
        for d in shape:
            numel *= d
        nbytes = numel * DTYPES[dtype] // 8
        name = rng.choice(NAMES) if rng.random() < 0.3 else f"t{i}"
        entries.append((name, dtype, shape, [offset, offset + nbytes]))
        offset += nbytes
    data = bytes(rng.randrange(256) for _ in range(offset))
    parts = []
    if rng.random() < 0.3:
        meta = {"format": "pt"} if rng.random() < 0.7 else {"x": rng.choice([1, None, "s", [1], {"a": "b"}])}
        parts.append('"__metadata__":' + json.dumps(meta))
    for name, dtype, shape, offsets in entries:
        q = rng.random()  # one perturbation of shape or offsets, sometimes
        if q < 0.05 and offsets[1] > 0:
            offsets[1] -= 1
        elif q < 0.10:
            offsets[0] += 1
        elif q < 0.13:
            shape = shape + [1]
        elif q < 0.15:
            offsets = offsets[::-1]
        fields = [f'"dtype":{json.dumps(dtype)}', f'"shape":{json.dumps(shape)}',
                  f'"data_offsets":{json.dumps(offsets)}']
        if rng.random() < 0.05:
            fields.append('"extra":1')
        if rng.random() < 0.05:
            fields.pop(rng.randrange(3))
        if rng.random() < 0.1:
            rng.shuffle(fields)
        parts.append(json.dumps(name) + ":{" + ",".join(fields) + "}")
    header = "{" + ",".join(parts) + "}"
    if rng.random() < 0.1:
        header = " " * rng.randint(1, 3) + header
    if rng.random() < 0.3:
        header += " " * rng.randint(0, 9)
    if rng.random() < 0.03:
        header += "\n"
    if rng.random() < 0.05:
        data += b"x"
    if rng.random() < 0.05 and data:
        data = data[:-1]
    hb = header.encode()
    return struct.pack("<Q", len(hb)) + hb + data


def main():
    rng = random.Random(20261129)
    out = bytearray()
    accepted = 0
    for _ in range(CASES):
        img = image(rng)
        try:
            deserialize(img)
            verdict = 1
        except Exception:  # the library raises SafetensorError (or a JSON error) for every refusal
            verdict = 0
        accepted += verdict
        out += struct.pack("<IB", len(img), verdict) + img
    OUT.write_bytes(bytes(out))
    print(f"wrote {CASES} cases ({accepted} accepted by the reference), {len(out)} bytes to {OUT}")


if __name__ == "__main__":
    main()
