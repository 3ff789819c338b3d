#!/usr/bin/env python3
"""Writes tests/golden/ckpt/ct-fp8-block/: the dense bf16 golden model as llm-compressor's FP8_BLOCK preset
saves it (compressed-tensors format "float-quantized", weights strategy "block", block_structure [128, 128],
input activations dynamic FP8 per 1x128 group; ignore ["lm_head"]). Needs numpy and ml_dtypes only (no torch):
the math follows compressed_tensors 0.20 step by step, in the dtypes torch uses:

  calculate_qparams (quantization/utils/helpers.py), symmetric float8: scale = max|w| over the block / 448,
    computed in the weight's dtype (bf16: the f32 quotient rounded to bf16), stored as <m>.weight_scale,
    shape [cdiv(N, 128), cdiv(K, 128)], a *multiplier* (w ~ e4m3 * scale)
  _quantize (quantization/lifecycle/forward.py): q = e4m3(clamp(bf16(w / scale), -448, 448)), RNE
  config: quant_scheme.py FP8_BLOCK, QuantizationArgs' serializer (None-valued actorder / block_structure /
    scale_dtype / observer / zp_dtype dropped), ModelCompressor's quantization_config keys as in ct-mxfp8

Run from the repository root: python3 tests/golden/make_ct_fp8_block_golden.py
"""
import json
import os
import shutil
import struct

import ml_dtypes
import numpy as np

ROOT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt")
SRC = os.path.join(ROOT, "qwen3-dense-bf16")
DST = os.path.join(ROOT, "ct-fp8-block")
BLOCK = 128


def read_safetensors(path):
    with open(path, "rb") as f:
        data = f.read()
    n = struct.unpack("<Q", data[:8])[0]
    header = json.loads(data[8:8 + n])
    out = {}
    for name, m in header.items():
        if name == "__metadata__":
            continue
        b, e = m["data_offsets"]
        raw = data[8 + n + b:8 + n + e]
        dt = {"BF16": ml_dtypes.bfloat16, "F32": np.float32, "F16": np.float16}[m["dtype"]]
        out[name] = np.frombuffer(raw, dtype=dt).reshape(m["shape"])
    return out


def write_safetensors(path, tensors):
    names = {ml_dtypes.bfloat16: "BF16", ml_dtypes.float8_e4m3fn: "F8_E4M3", np.float32: "F32",
             np.float16: "F16"}
    header, blobs, off = {"__metadata__": {"format": "pt"}}, [], 0
    for name in sorted(tensors):
        t = np.ascontiguousarray(tensors[name])
        raw = t.tobytes()
        header[name] = {"dtype": names[t.dtype.type], "shape": list(t.shape), "data_offsets": [off, off + len(raw)]}
        blobs.append(raw)
        off += len(raw)
    text = json.dumps(header, separators=(",", ":")).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(text)) + text + b"".join(blobs))


def fp8_block_quantize(w):
    n, k = w.shape
    rb, cb = -(-n // BLOCK), -(-k // BLOCK)
    scale = np.zeros((rb, cb), dtype=ml_dtypes.bfloat16)
    q = np.zeros((n, k), dtype=ml_dtypes.float8_e4m3fn)
    for i in range(rb):
        for j in range(cb):
            blk = w[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK].astype(np.float32)
            amax = np.float32(np.abs(blk).max())  # exact: a bf16 value
            s = (amax / np.float32(448.0)).astype(ml_dtypes.bfloat16)
            assert float(s) > 0, "a zero block: compressed-tensors would substitute eps"
            scaled = (blk / np.float32(s)).astype(ml_dtypes.bfloat16).astype(np.float32)
            q[i * BLOCK:(i + 1) * BLOCK, j * BLOCK:(j + 1) * BLOCK] = np.clip(scaled, -448, 448).astype(
                ml_dtypes.float8_e4m3fn)
            scale[i, j] = s
    return q, scale


def main():
    shutil.rmtree(DST, ignore_errors=True)
    os.makedirs(DST)
    shutil.copy(os.path.join(SRC, "generation_config.json"), DST)
    tensors = {}
    for name, t in read_safetensors(os.path.join(SRC, "model.safetensors")).items():
        if t.ndim == 2 and name.endswith("_proj.weight"):
            tensors[name], tensors[name[:-len("weight")] + "weight_scale"] = fp8_block_quantize(t)
        else:
            tensors[name] = t
    write_safetensors(os.path.join(DST, "model.safetensors"), tensors)
    with open(os.path.join(SRC, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = {
        "config_groups": {"group_0": {
            "format": "float-quantized",
            "input_activations": {"dynamic": True, "group_size": 128, "num_bits": 8, "strategy": "group",
                                  "symmetric": True, "type": "float"},
            "output_activations": None,
            "targets": ["Linear"],
            "weights": {"block_structure": [128, 128], "dynamic": False, "group_size": None, "num_bits": 8,
                        "strategy": "block", "symmetric": True, "type": "float"},
        }},
        "format": "float-quantized",
        "global_compression_ratio": None,
        "ignore": ["lm_head"],
        "kv_cache_scheme": None,
        "quant_method": "compressed-tensors",
        "quantization_status": "compressed",
        "sparsity_config": {},
        "transform_config": {},
        "version": "0.20.0",
    }
    with open(os.path.join(DST, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


if __name__ == "__main__":
    main()
