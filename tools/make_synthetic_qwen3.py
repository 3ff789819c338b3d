#!/usr/bin/env python3
"""Writes a Qwen3 checkpoint of real shapes with random bf16 weights (for `mxq-bench decode`), on the GPU
machine: nothing is downloaded, mxq quantizes it online at load (--quantization mxfp8 / mxfp4).

Shapes default to Qwen3-8B (hidden 4096, 36 layers, 32 q / 8 kv heads of 128, intermediate 12288, vocab
151936, untied lm_head); --shape 30b-a3b gives Qwen3-30B-A3B (hidden 2048, 48 layers, 32 q / 4 kv heads of
128, 128 experts of intermediate 768, top 8, per-expert tensors as the HF checkpoints store them);
--layers cuts the depth (per-layer cost is what decode speed measures).
Weights ~ N(0, 1/sqrt(fan_in)), norms ~ 1: finite activations, no meaning.

  python3 tools/make_synthetic_qwen3.py OUT_DIR [--shape 8b|30b-a3b] [--layers N]
"""
import argparse
import json
import os

import torch
from safetensors.torch import save_file

QWEN3_8B = dict(hidden_size=4096, intermediate_size=12288, num_attention_heads=32, num_key_value_heads=8,
                head_dim=128, num_hidden_layers=36, vocab_size=151936, max_position_embeddings=40960)
QWEN3_30B_A3B = dict(hidden_size=2048, intermediate_size=6144, moe_intermediate_size=768, num_experts=128,
                     num_experts_per_tok=8, norm_topk_prob=True, decoder_sparse_step=1, mlp_only_layers=[],
                     num_attention_heads=32, num_key_value_heads=4, head_dim=128, num_hidden_layers=48,
                     vocab_size=151936, max_position_embeddings=40960)
SHAPES = {"8b": ("Qwen3-8B", QWEN3_8B, "Qwen3ForCausalLM", "qwen3"),
          "30b-a3b": ("Qwen3-30B-A3B", QWEN3_30B_A3B, "Qwen3MoeForCausalLM", "qwen3_moe")}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out")
    ap.add_argument("--shape", choices=sorted(SHAPES), default="8b")
    ap.add_argument("--layers", type=int, default=0, help="decoder layers (0: the real model's)")
    ap.add_argument("--seed", type=int, default=0)
    a = ap.parse_args()
    label, base, arch, model_type = SHAPES[a.shape]
    c = dict(base, num_hidden_layers=a.layers or base["num_hidden_layers"])
    moe = "num_experts" in c
    H, I, D = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    Hq, Hkv, V = c["num_attention_heads"], c["num_key_value_heads"], c["vocab_size"]
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    g = torch.Generator(device=dev).manual_seed(a.seed)

    def rnd(*shape, std=None, mean=0.0):
        std = std if std is not None else shape[-1] ** -0.5
        return (torch.randn(*shape, generator=g, device=dev) * std + mean).to(torch.bfloat16).cpu()

    t = {"model.embed_tokens.weight": rnd(V, H, std=1.0), "model.norm.weight": rnd(H, std=0.05, mean=1.0),
         "lm_head.weight": rnd(V, H)}
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = rnd(H, std=0.05, mean=1.0)
        t[p + "post_attention_layernorm.weight"] = rnd(H, std=0.05, mean=1.0)
        t[p + "self_attn.q_proj.weight"] = rnd(Hq * D, H)
        t[p + "self_attn.k_proj.weight"] = rnd(Hkv * D, H)
        t[p + "self_attn.v_proj.weight"] = rnd(Hkv * D, H)
        t[p + "self_attn.o_proj.weight"] = rnd(H, Hq * D)
        t[p + "self_attn.q_norm.weight"] = rnd(D, std=0.05, mean=1.0)
        t[p + "self_attn.k_norm.weight"] = rnd(D, std=0.05, mean=1.0)
        if moe:
            E, Im = c["num_experts"], c["moe_intermediate_size"]
            t[p + "mlp.gate.weight"] = rnd(E, H)
            for e in range(E):
                q = f"{p}mlp.experts.{e}."
                t[q + "gate_proj.weight"] = rnd(Im, H)
                t[q + "up_proj.weight"] = rnd(Im, H)
                t[q + "down_proj.weight"] = rnd(H, Im)
        else:
            t[p + "mlp.gate_proj.weight"] = rnd(I, H)
            t[p + "mlp.up_proj.weight"] = rnd(I, H)
            t[p + "mlp.down_proj.weight"] = rnd(H, I)
    os.makedirs(a.out, exist_ok=True)
    save_file(t, os.path.join(a.out, "model.safetensors"), metadata={"format": "pt"})
    cfg = {"architectures": [arch], "model_type": model_type, "attention_bias": False,
           "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151645, "hidden_act": "silu",
           "rms_norm_eps": 1e-6, "rope_parameters": {"rope_theta": 1000000.0, "rope_type": "default"},
           "tie_word_embeddings": False, "dtype": "bfloat16", "use_cache": True, "sliding_window": None,
           "use_sliding_window": False, **c}
    with open(os.path.join(a.out, "config.json"), "w") as f:
        json.dump(cfg, f, indent=2)
    n = sum(v.numel() for v in t.values())
    print(f"{a.out}: {label} shapes, {c['num_hidden_layers']} layers, {n / 1e9:.2f} B params, bf16")


if __name__ == "__main__":
    main()
