#!/usr/bin/env python3
"""Writes tests/golden/safetensors/all_dtypes.{safetensors,json} with the python `safetensors` library.

The .safetensors file is the library's own output (safetensors.torch.save, Rust core): the C++ reader must
read it and the C++ writer must reproduce it byte for byte. The .json sidecar records, per tensor, the dtype
and shape the library's reader reports and the raw bytes as torch holds them in memory (hex), so the C++ test
compares against sources independent of our code. Run with the machine's python3 (torch, safetensors).
"""
import json
import pathlib

import safetensors
import torch
from safetensors._safetensors_rust import deserialize
from safetensors.torch import save

OUT = pathlib.Path(__file__).resolve().parent / "safetensors"


def tensors():
    g = torch.Generator().manual_seed(20261129)

    def raw(*shape):
        return torch.randint(0, 256, shape, generator=g, dtype=torch.int32).to(torch.uint8)

    t = {
        "bool.mask": raw(5) % 2 == 1,
        "u8.codes": raw(3, 3),
        "i8.delta": raw(7).view(torch.int8),
        "f8_e5m2.w": raw(2, 3).view(torch.float8_e5m2),
        "f8_e4m3.weight": raw(4, 8).view(torch.float8_e4m3fn),
        "f8_e8m0.weight_scale": raw(4, 1).view(torch.float8_e8m0fnu),
        "i16.x": raw(3, 2).view(torch.int16),
        "u16.x": raw(2, 2).view(torch.uint16),
        "f16.bias": torch.randn(3, generator=g).to(torch.float16),
        "bf16.norm": torch.randn(2, 3, generator=g).to(torch.bfloat16),
        "i32.ids": raw(4, 4).view(torch.int32),
        "u32.x": raw(8).view(torch.uint32),
        "f32.weight_scale_inv": torch.randn(1, 3, generator=g),
        "f64.x": torch.randn(2, generator=g, dtype=torch.float64),
        "i64.positions": raw(16).view(torch.int64),
        "u64.x": raw(8).view(torch.uint64),
        "f4.weight_packed": raw(2, 3).view(torch.float4_e2m1fn_x2),  # header shape doubles the last dim
        "rank0.bf16": torch.tensor(1.5, dtype=torch.bfloat16),
        "empty.f32": torch.zeros(0, 3),
        "empty.i64": torch.zeros(2, 0, dtype=torch.int64),
        "model.layers.0.mlp.gate_proj.weight": torch.randn(2, 2, generator=g).to(torch.bfloat16),
        "name/with/slashes/../and \"quotes\" \\ back": raw(1),
        "ñame.ünicode.ß": raw(2),
    }
    return t


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    t = tensors()
    metadata = {"format": "pt"}  # one key: the library writes __metadata__ from a HashMap (unordered)
    blob = save(t, metadata=metadata)
    (OUT / "all_dtypes.safetensors").write_bytes(blob)
    seen = {name: info for name, info in deserialize(blob)}
    side = {"library": f"safetensors {safetensors.__version__}, torch {torch.__version__}",
            "metadata": metadata, "tensors": {}}
    for name in sorted(t):
        mem = t[name].contiguous().reshape(-1).view(torch.uint8)
        side["tensors"][name] = {"dtype": seen[name]["dtype"], "shape": list(seen[name]["shape"]),
                                 "hex": bytes(mem.numpy().tobytes()).hex()}
    (OUT / "all_dtypes.json").write_text(json.dumps(side, indent=1, ensure_ascii=False) + "\n")
    print(f"wrote {len(blob)} bytes, {len(t)} tensors to {OUT}")


if __name__ == "__main__":
    main()
