#!/usr/bin/env python3
"""Writes the tiny test checkpoints under tests/golden/ckpt/ (needs torch, transformers, compressed-tensors).

Every checkpoint here is written by a tool other than mxq, so mxq's readers are checked against them:
  qwen3-dense-bf16   transformers save_pretrained (Qwen3ForCausalLM, random weights, seed 0)
  qwen3-moe-bf16     transformers save_pretrained (Qwen3MoeForCausalLM, 4 experts, top-2, seed 1)
  modelopt-mxfp8     the dense model in ModelOpt's MXFP8 export format, written with torch following
                     NVIDIA/Model-Optimizer: modelopt/torch/quantization/qtensor/mxfp8_tensor.py
                     (_compute_e8m0_exponent, quantize_with_scale), export/quant_utils.py (get_quant_config,
                     process_layer_quant_config -> hf_quant_config.json) and export/convert_hf_config.py
                     (convert_hf_quant_config_format -> config.json quantization_config)
  modelopt-mxfp8-moe the MoE model, same format, per-expert tensors, router gates excluded
  ct-mxfp8, ct-mxfp4 the dense model through compressed-tensors' own apply_quantization_config +
                     calculate_qparams + ModelCompressor (presets MXFP8A16 / MXFP4A16)
  fp8-b128           the dense model as DeepSeek-V3 block FP8 (README_WEIGHTS.md: 128x128 blocks,
                     weight_scale_inv = amax/448 multiplier), cast with torch; Qwen3-FP8 style
                     modules_to_not_convert

Also writes ckpt/config_cases.json: config.json variants (transformers 4.x and 5.x spellings) with the
values transformers itself resolves from them (head_dim, RoPE, experts, which layers are sparse), the oracle
for tests/io/config_test.cpp.

Run from the repository root: python3 tests/golden/make_checkpoints.py
"""
import json
import os
import shutil

import torch
from safetensors.torch import load_file, save_file

OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "ckpt")

DIMS = dict(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=512,
            rms_norm_eps=1e-6, tie_word_embeddings=False)


def randomize_norms(model, gen):
    # RMSNorm weights start at 1; perturb them so a forward that skips a norm weight is caught.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.add_(0.1 * torch.randn(p.shape, generator=gen))


def dense_model():
    from transformers import Qwen3Config, Qwen3ForCausalLM
    torch.manual_seed(0)
    cfg = Qwen3Config(**DIMS, bos_token_id=1, eos_token_id=2)
    model = Qwen3ForCausalLM(cfg)
    randomize_norms(model, torch.Generator().manual_seed(100))
    return model.to(torch.bfloat16).eval()


def moe_model():
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM
    torch.manual_seed(1)
    cfg = Qwen3MoeConfig(**DIMS, num_experts=4, num_experts_per_tok=2, moe_intermediate_size=64,
                         norm_topk_prob=True, bos_token_id=1, eos_token_id=[2, 3])
    model = Qwen3MoeForCausalLM(cfg)
    randomize_norms(model, torch.Generator().manual_seed(101))
    return model.to(torch.bfloat16).eval()


def fresh(name):
    path = os.path.join(OUT, name)
    shutil.rmtree(path, ignore_errors=True)
    os.makedirs(path)
    return path


def copy_side_files(src, dst):
    for f in ("config.json", "generation_config.json"):
        if os.path.exists(os.path.join(src, f)):
            shutil.copy(os.path.join(src, f), os.path.join(dst, f))


def edit_config(path, quantization_config):
    with open(os.path.join(path, "config.json")) as f:
        cfg = json.load(f)
    cfg["quantization_config"] = quantization_config
    with open(os.path.join(path, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2, sort_keys=True)
        f.write("\n")


def is_quantizable(name, t):
    # The linears ModelOpt / DeepSeek quantize: every 2-D *_proj weight; embeddings, norms, lm_head and
    # MoE router gates stay in bf16.
    return t.dim() == 2 and name.endswith("_proj.weight")


# ---- ModelOpt MXFP8 -----------------------------------------------------------------------------------
def modelopt_mxfp8_quantize(w):
    """MXFP8QTensor.get_weights_scaling_factor + quantize_with_scale, step by step."""
    blocks = w.view(*w.shape[:-1], w.shape[-1] // 32, 32)
    amax = blocks.abs().amax(dim=-1)                      # reduce_block_amax, in the weight dtype
    descale = amax.float() / torch.finfo(torch.float8_e4m3fn).max
    log2 = torch.where(descale > 0, torch.log2(descale), torch.tensor(-127.0))
    exponent = torch.clamp(torch.ceil(log2), min=-127, max=127)
    scale = (exponent + 127).to(torch.uint8)
    factor = torch.exp2(127 - scale.float())
    scaled = torch.clamp(blocks * factor.unsqueeze(-1), min=-448.0, max=448.0)
    return scaled.to(torch.float8_e4m3fn).view(w.shape), scale


def write_modelopt(src, name, exclude):
    dst = fresh(name)
    copy_side_files(src, dst)
    tensors = {}
    for k, t in load_file(os.path.join(src, "model.safetensors")).items():
        if is_quantizable(k, t):
            q, s = modelopt_mxfp8_quantize(t)
            tensors[k] = q
            tensors[k[: -len("weight")] + "weight_scale"] = s
        else:
            tensors[k] = t
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    producer = {"name": "modelopt", "version": "0.37.0"}
    hf_quant = {"producer": producer,
                "quantization": {"quant_algo": "MXFP8", "kv_cache_quant_algo": None, "group_size": 32,
                                 "exclude_modules": exclude}}
    with open(os.path.join(dst, "hf_quant_config.json"), "w") as f:
        json.dump(hf_quant, f, indent=4)
    edit_config(dst, {"ignore": exclude, "quant_algo": "MXFP8", "producer": producer,
                      "quant_method": "modelopt"})


# ---- compressed-tensors MXFP8 / MXFP4 -----------------------------------------------------------------
def write_compressed_tensors(name, preset, fmt):
    from compressed_tensors.compressors import ModelCompressor
    from compressed_tensors.quantization import (QuantizationConfig, QuantizationScheme,
                                                 apply_quantization_config, preset_name_to_scheme)
    from compressed_tensors.quantization.utils import calculate_qparams
    model = dense_model()
    scheme = preset_name_to_scheme(preset, ["Linear"])
    config = QuantizationConfig(config_groups={"group_0": scheme}, ignore=["lm_head"])
    apply_quantization_config(model, config)
    # Static weight scales, as llm-compressor's min-max observer computes them for a group strategy.
    with torch.no_grad():
        for mod_name, mod in model.named_modules():
            if not hasattr(mod, "weight_scale"):
                continue
            args = mod.quantization_scheme.weights
            w = mod.weight.unflatten(-1, (mod.weight.shape[-1] // args.group_size, args.group_size))
            scale, zp = calculate_qparams(w.amin(dim=-1), w.amax(dim=-1), args)
            mod.weight_scale.data = scale.to(mod.weight_scale.dtype)
            if hasattr(mod, "weight_zero_point"):
                mod.weight_zero_point.data = zp.to(mod.weight_zero_point.dtype)
    compressor = ModelCompressor.from_pretrained_model(model, quantization_format=fmt)
    compressor.compress_model(model)
    dst = fresh(name)
    model.save_pretrained(dst)
    compressor.update_config(dst)
    assert isinstance(QuantizationScheme, type)


# ---- FP8 block-128 (DeepSeek style) -------------------------------------------------------------------
def fp8_block_quantize(w, block=128):
    n, k = w.shape
    x = w.float()
    pad = torch.zeros((n + block - 1) // block * block, (k + block - 1) // block * block)
    pad[:n, :k] = x  # a short final block is zero-padded before its amax (README_WEIGHTS.md)
    tiles = pad.view(pad.shape[0] // block, block, pad.shape[1] // block, block)
    amax = tiles.abs().amax(dim=(1, 3)).clamp(min=1e-4)
    scale_inv = amax / 448.0
    factor = (448.0 / amax).repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]
    return (x * factor).to(torch.float8_e4m3fn), scale_inv


def write_fp8_block(src, name):
    dst = fresh(name)
    copy_side_files(src, dst)
    tensors, not_converted = {}, ["lm_head"]
    for k, t in load_file(os.path.join(src, "model.safetensors")).items():
        if is_quantizable(k, t):
            q, s = fp8_block_quantize(t)
            tensors[k] = q
            tensors[k + "_scale_inv"] = s
        else:
            tensors[k] = t
    save_file(tensors, os.path.join(dst, "model.safetensors"), metadata={"format": "pt"})
    edit_config(dst, {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                      "weight_block_size": [128, 128], "modules_to_not_convert": not_converted})


# ---- config.json variants and what transformers makes of them ---------------------------------------------
def config_cases(dense_dir, moe_dir):
    from transformers import AutoConfig, AutoModelForCausalLM
    dense = json.load(open(os.path.join(dense_dir, "config.json")))
    moe = json.load(open(os.path.join(moe_dir, "config.json")))
    legacy = {k: v for k, v in dense.items() if k not in ("rope_parameters", "head_dim", "dtype")}
    legacy.update(rope_theta=1000000.0, torch_dtype="bfloat16", transformers_version="4.51.0")
    yarn = dict(legacy, rope_scaling={"type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128})
    moe4 = {k: v for k, v in moe.items() if k not in ("num_local_experts", "head_dim")}
    moe4.update(num_experts=4, num_hidden_layers=4, decoder_sparse_step=2, mlp_only_layers=[1],
                layer_types=["full_attention"] * 4)
    cases = {"dense-5x": dense, "moe-5x": moe, "dense-4x-legacy-rope": legacy, "dense-4x-yarn": yarn,
             "moe-4x-sparse-step": moe4}
    out = []
    for name, cfg in cases.items():
        hf = AutoConfig.for_model(**cfg)
        model = AutoModelForCausalLM.from_config(hf)
        layers = model.model.layers
        attn = layers[0].self_attn
        eos = hf.eos_token_id
        out.append({
            "name": name, "config": cfg,
            "expect": {
                "head_dim": attn.head_dim,
                "rope_theta": hf.rope_parameters["rope_theta"],
                "rope_type": hf.rope_parameters["rope_type"],
                "num_experts": getattr(hf, "num_experts", 0) or 0,
                "sparse_layers": [i for i, l in enumerate(layers) if type(l.mlp).__name__.endswith("SparseMoeBlock")],
                "eos_token_ids": eos if isinstance(eos, list) else ([] if eos is None else [eos]),
            }})
    with open(os.path.join(OUT, "config_cases.json"), "w") as f:
        json.dump(out, f, indent=1)
        f.write("\n")


def main():
    os.makedirs(OUT, exist_ok=True)
    dense = fresh("qwen3-dense-bf16")
    dense_model().save_pretrained(dense)
    moe = fresh("qwen3-moe-bf16")
    moe_model().save_pretrained(moe)
    write_modelopt(dense, "modelopt-mxfp8", ["lm_head"])
    write_modelopt(moe, "modelopt-mxfp8-moe", ["lm_head", "model.layers.*.mlp.gate"])
    write_compressed_tensors("ct-mxfp8", "MXFP8A16", "mxfp8-quantized")
    write_compressed_tensors("ct-mxfp4", "MXFP4A16", "mxfp4-pack-quantized")
    write_fp8_block(dense, "fp8-b128")
    config_cases(dense, moe)
    total = sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(OUT) for f in fs)
    print(f"wrote {OUT}: {total} bytes")


if __name__ == "__main__":
    main()
