#!/usr/bin/env python3
"""Golden data for the CPU ops from transformers' own Qwen3 modules (code nobody on mxq wrote).

Pins the HF conventions the CPU backend must follow: Qwen3RMSNorm (also as q_norm/k_norm over head_dim),
Qwen3RotaryEmbedding + apply_rotary_pos_emb (rotate_half pairing, f32 inv_freq), eager_attention_forward
(GQA head mapping through repeat_kv, causal offset for T < S) and Qwen3MoeTopKRouter (f32 softmax, torch.topk
tie order, norm_topk_prob). Inputs are tiny and seeded; f32 values are written as JSON numbers, which
round-trip exactly (f32 -> Python float is exact, repr is shortest round-trip).

Run: python3 tests/golden/make_cpu_ops_golden.py  (writes tests/golden/cpu/cpu_ops.json)
"""
import json
import math
import os

import torch
import transformers
from transformers import Qwen3Config, Qwen3MoeConfig
from transformers.models.qwen3 import modeling_qwen3 as q3
from transformers.models.qwen3_moe import modeling_qwen3_moe as q3moe

torch.manual_seed(20261129)
OUT = os.path.join(os.path.dirname(os.path.abspath(__file__)), "cpu", "cpu_ops.json")


def flat(t):
    return [float(v) for v in t.detach().to(torch.float32).reshape(-1).tolist()]


def rms_norm_cases():
    cases = []
    # note: [rows, dim] for input_layernorm-like use and [T, H, D] for q_norm/k_norm (normalised over D)
    for shape, eps in (((3, 64), 1e-6), ((2, 4, 16), 1e-6), ((5, 40), 1e-2)):
        dim = shape[-1]
        norm = q3.Qwen3RMSNorm(dim, eps=eps)
        with torch.no_grad():
            norm.weight.copy_(torch.randn(dim))
        x = torch.randn(*shape) * 2.0
        cases.append({"shape": list(shape), "eps": eps, "x": flat(x), "weight": flat(norm.weight),
                      "out": flat(norm(x))})
    return cases


def rope_cases():
    cases = []
    for heads, head_dim, theta, positions in ((2, 16, 10000.0, [0, 1, 2, 3]),
                                              (3, 64, 1000000.0, [0, 5, 17, 100, 2047]),
                                              (1, 128, 1000000.0, [4095, 3, 1000])):
        config = Qwen3Config(hidden_size=heads * head_dim, num_attention_heads=heads, num_key_value_heads=heads,
                             head_dim=head_dim,
                             rope_parameters={"rope_type": "default", "rope_theta": theta})
        rotary = q3.Qwen3RotaryEmbedding(config)
        t = len(positions)
        x = torch.randn(1, heads, t, head_dim)  # HF layout [batch, heads, T, D]
        pos = torch.tensor([positions], dtype=torch.long)
        cos, sin = rotary(x, pos)
        rotated, _ = q3.apply_rotary_pos_emb(x, x.clone(), cos, sin)
        # stored in mxq's layout [T, heads, D]
        cases.append({"tokens": t, "heads": heads, "head_dim": head_dim, "theta": theta, "positions": positions,
                      "x": flat(x[0].transpose(0, 1)), "out": flat(rotated[0].transpose(0, 1))})
    return cases


def attention_cases():
    cases = []
    for tokens, seq_len, q_heads, kv_heads, head_dim in ((1, 9, 4, 2, 16), (4, 4, 4, 1, 16),
                                                          (3, 8, 2, 2, 8), (2, 6, 8, 2, 32)):
        config = Qwen3Config(hidden_size=q_heads * head_dim, num_attention_heads=q_heads,
                             num_key_value_heads=kv_heads, head_dim=head_dim)
        module = q3.Qwen3Attention(config, layer_idx=0).eval()
        q = torch.randn(1, q_heads, tokens, head_dim)
        k = torch.randn(1, kv_heads, seq_len, head_dim)
        v = torch.randn(1, kv_heads, seq_len, head_dim)
        # The causal contract for queries at positions seq_len - tokens .. seq_len - 1 (additive mask).
        mask = torch.zeros(1, 1, tokens, seq_len)
        for t in range(tokens):
            mask[0, 0, t, seq_len - tokens + t + 1:] = torch.finfo(torch.float32).min
        out, _ = q3.eager_attention_forward(module, q, k, v, mask, scaling=module.scaling)
        assert math.isclose(module.scaling, head_dim ** -0.5)
        cases.append({"tokens": tokens, "seq_len": seq_len, "q_heads": q_heads, "kv_heads": kv_heads,
                      "head_dim": head_dim,
                      "q": flat(q[0].transpose(0, 1)), "k": flat(k[0].transpose(0, 1)),
                      "v": flat(v[0].transpose(0, 1)), "out": flat(out[0])})  # out is [1, T, Hq, D] already
    return cases


def router_cases():
    cases = []
    # note: (128, 2) takes torch's partial_sort branch (k * 64 <= n), the others nth_element + sort.
    for experts, top_k, norm in ((8, 2, True), (8, 2, False), (16, 4, True), (128, 8, True), (128, 2, False)):
        config = Qwen3MoeConfig(hidden_size=16, num_experts=experts, num_experts_per_tok=top_k,
                                norm_topk_prob=norm)
        router = q3moe.Qwen3MoeTopKRouter(config)
        with torch.no_grad():
            router.weight.copy_(torch.randn(experts, 16))
            # note: experts 1, 3 and 6 share one gate row, so their logits tie exactly on every token;
            # a zero hidden state ties every expert. torch.topk must then prefer the lower index.
            router.weight[3] = router.weight[1]
            router.weight[6] = router.weight[1]
        hidden = torch.randn(6, 16)
        hidden[2] = 0.0
        hidden[4] = router.weight[1] * 3.0  # expert 1 (and its twins 3, 6) on top
        logits, scores, indices = router(hidden)
        cases.append({"tokens": hidden.shape[0], "experts": experts, "top_k": top_k, "norm_topk_prob": norm,
                      "logits": flat(logits), "weights": flat(scores),
                      "ids": [int(i) for i in indices.reshape(-1).tolist()]})
    return cases


def main():
    data = {"generator": "tests/golden/make_cpu_ops_golden.py",
            "torch": torch.__version__, "transformers": transformers.__version__,
            "rms_norm": rms_norm_cases(), "rope": rope_cases(), "attention": attention_cases(),
            "moe_router": router_cases()}
    os.makedirs(os.path.dirname(OUT), exist_ok=True)
    with open(OUT, "w") as f:
        json.dump(data, f, separators=(",", ":"))
        f.write("\n")
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    with torch.no_grad():
        main()
