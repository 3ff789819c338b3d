#!/usr/bin/env python3
"""Oracle data for tests/model/qwen3_golden_test.cpp: transformers' Qwen3 / Qwen3-MoE forward in float32.

Writes (run from the repository root: python3 tests/golden/make_model_golden.py; needs torch, transformers):
  tests/golden/model/ckpt/qwen3-dense-f32      Qwen3ForCausalLM, F32 weights, tied embeddings, attention_bias,
                                               saved by transformers save_pretrained
  tests/golden/model/ckpt/qwen3-moe-f32-stacked Qwen3MoeForCausalLM, F32, mlp_only_layers=[1] (layer 1 dense),
                                               norm_topk_prob=false, experts as transformers holds them in
                                               memory (mlp.experts.gate_up_proj [E, 2I, H], down_proj [E, H, I]),
                                               written with safetensors from model.state_dict()
  tests/golden/model/cases.json                per case and prompt: greedy continuation (teacher-forced: each
                                               step feeds the oracle's token), the top-2 logit margin per step,
                                               the logits after the prompt and after the whole continuation

Every case runs transformers' own modelling code on float32 weights: plain checkpoints are upcast; quantized
checkpoints (tests/golden/ckpt/*, written by make_checkpoints.py with ModelOpt / compressed-tensors / DeepSeek
conventions) are dequantized here with torch as formats.md says (x = element * scale); the "online" cases
quantize the bf16 checkpoint's projections here with the formats.md default rules, then dequantize.
"""
import json
import math
import os

import torch
from safetensors.torch import load_file, save_file

HERE = os.path.dirname(os.path.abspath(__file__))
CKPT = os.path.join(HERE, "ckpt")
OUT = os.path.join(HERE, "model")

PROMPTS = [[1, 17, 42, 99, 200, 5, 63, 128], [1], [7, 7, 7, 250, 3, 19, 88, 101, 4, 12, 33, 66]]
NEW_TOKENS = 16

SMALL = dict(vocab_size=256, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=2,
             num_key_value_heads=1, head_dim=16, max_position_embeddings=64, rms_norm_eps=1e-6,
             bos_token_id=1, eos_token_id=2)

E4M3_VALUES = None


def randomize(model, gen, scale):
    # Norm weights near 1 with noise, biases nonzero, projections scaled up so logits have margins.
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.1 * torch.randn(p.shape, generator=gen))
            elif name.endswith(".bias"):
                p.copy_(0.1 * torch.randn(p.shape, generator=gen))
            else:
                p.copy_(scale * torch.randn(p.shape, generator=gen))


def write_small_checkpoints():
    from transformers import Qwen3Config, Qwen3ForCausalLM, Qwen3MoeConfig, Qwen3MoeForCausalLM
    dense_dir = os.path.join(OUT, "ckpt", "qwen3-dense-f32")
    cfg = Qwen3Config(**SMALL, tie_word_embeddings=True, attention_bias=True, rope_theta=1000.0)
    model = Qwen3ForCausalLM(cfg)
    randomize(model, torch.Generator().manual_seed(11), 0.15)
    model.save_pretrained(dense_dir, safe_serialization=True)

    moe_dir = os.path.join(OUT, "ckpt", "qwen3-moe-f32-stacked")
    cfg = Qwen3MoeConfig(**SMALL, tie_word_embeddings=False, num_experts=4, num_experts_per_tok=2,
                         moe_intermediate_size=32, norm_topk_prob=False, mlp_only_layers=[1])
    model = Qwen3MoeForCausalLM(cfg)
    randomize(model, torch.Generator().manual_seed(12), 0.15)
    os.makedirs(moe_dir, exist_ok=True)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    cfg.save_pretrained(moe_dir)
    save_file({k: v.contiguous() for k, v in model.state_dict().items()},
              os.path.join(moe_dir, "model.safetensors"), metadata={"format": "pt"})


# ---- dequantization of stored checkpoints (formats.md: x = element * scale) ----

def e8m0(scale_u8):
    return torch.exp2(scale_u8.to(torch.float32) - 127.0)


def e2m1_unpack(packed):
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0], dtype=torch.float32)
    codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(*packed.shape[:-1], -1).to(torch.int64)
    vals = table[codes & 7]
    return torch.where(codes >= 8, -vals, vals)


def dequant_mx(values, scale):
    v = values.to(torch.float32)
    return (v.reshape(*v.shape[:-1], -1, 32) * e8m0(scale).unsqueeze(-1)).reshape(v.shape)


def dequant_b128(values, scale_inv):
    v = values.to(torch.float32)
    n, k = v.shape
    s = scale_inv.to(torch.float32).repeat_interleave(128, 0)[:n].repeat_interleave(128, 1)[:, :k]
    return v * s


def load_dequantized(ckpt_dir):
    """HF hub names -> float32 tensors, quantized linears dequantized."""
    raw = load_file(os.path.join(ckpt_dir, "model.safetensors"))
    out = {}
    for name, t in raw.items():
        if name.endswith(".weight_packed"):
            out[name[: -len("_packed")]] = dequant_mx(e2m1_unpack(t), raw[name[: -len("weight_packed")] + "weight_scale"])
        elif name.endswith(".weight_scale") or name.endswith(".weight_scale_inv") or name.endswith("input_scale"):
            continue
        elif t.dtype == torch.float8_e4m3fn:
            if name + "_scale_inv" in raw:
                out[name] = dequant_b128(t, raw[name + "_scale_inv"])
            else:
                out[name] = dequant_mx(t, raw[name + "_scale"])
        else:
            out[name] = t.to(torch.float32)
    return out


# ---- online quantization with the formats.md default rules, then dequantization ----

def ceil_log2_exact(q):
    m, e = torch.frexp(q)  # q = m * 2^e, m in [0.5, 1)
    return torch.where(m == 0.5, e - 1, e)


def floor_log2_exact(a):
    m, e = torch.frexp(a)
    return e - 1


def quant_dequant_mxfp8(w):
    x = w.to(torch.float32).reshape(*w.shape[:-1], -1, 32)
    amax = x.abs().amax(-1, keepdim=True)
    q = torch.clamp(amax, min=torch.finfo(torch.float32).tiny) / 448.0
    b = torch.clamp(ceil_log2_exact(q) + 127, 0, 254).to(torch.float32)
    el = torch.clamp(x * torch.exp2(127.0 - b), -448, 448).to(torch.float8_e4m3fn).to(torch.float32)
    return (el * torch.exp2(b - 127.0)).reshape(w.shape)


def e2m1_round(y):
    # RNE onto {0, .5, 1, 1.5, 2, 3, 4, 6}, saturating at 6 (ties go to the even code).
    table = torch.tensor([0.0, 0.5, 1.0, 1.5, 2.0, 3.0, 4.0, 6.0])
    a = y.abs().clamp(max=6.0)
    d = (a.unsqueeze(-1) - table).abs()
    best = d.min(-1, keepdim=True).values
    cand = (d == best)
    idx = torch.arange(8).expand_as(cand)
    even = cand & (idx % 2 == 0)
    pick = torch.where(even.any(-1), torch.where(even, idx, 99).min(-1).values, torch.where(cand, idx, 99).min(-1).values)
    return torch.sign(y) * table[pick]


def quant_dequant_mxfp4(w):
    x = w.to(torch.float32).reshape(*w.shape[:-1], -1, 32)
    amax = x.abs().amax(-1, keepdim=True)
    m, e = torch.frexp(amax)  # amax = (2m) * 2^(e-1), 2m in [1, 2)
    k = e - 1
    b = torch.where(amax == 0, torch.zeros_like(k), torch.clamp(127 + k - 2 + (2 * m >= 1.75).to(k.dtype), 0, 254))
    s = torch.exp2(b.to(torch.float32) - 127.0)
    return (e2m1_round(x / s) * s).reshape(w.shape)


def quant_dequant_b128(w):
    x = w.to(torch.float32)
    n, k = x.shape
    out = torch.empty_like(x)
    for r in range(0, n, 128):
        for c in range(0, k, 128):
            blk = x[r:r + 128, c:c + 128]
            amax = max(blk.abs().max().item(), 1e-4)
            amax = torch.tensor(amax, dtype=torch.float32)
            scale = torch.tensor(448.0, dtype=torch.float32) / amax
            el = torch.clamp(blk * scale, -448, 448).to(torch.float8_e4m3fn).to(torch.float32)
            out[r:r + 128, c:c + 128] = el * (amax / 448.0)
    return out


QUANT = {"mxfp8": quant_dequant_mxfp8, "mxfp4": quant_dequant_mxfp4, "fp8-b128": quant_dequant_b128}
LINEAR_SUFFIXES = ("q_proj.weight", "k_proj.weight", "v_proj.weight", "o_proj.weight", "gate_proj.weight",
                   "up_proj.weight", "down_proj.weight", "experts.gate_up_proj", "experts.down_proj")


def is_linear(name):
    return name.startswith("model.layers.") and name.endswith(LINEAR_SUFFIXES) and not name.endswith("mlp.gate.weight")


def quantize_online(sd, fmt):
    out = {}
    for name, t in sd.items():
        if is_linear(name):
            out[name] = torch.stack([QUANT[fmt](e) for e in t]) if t.dim() == 3 else QUANT[fmt](t)
        else:
            out[name] = t
    return out


# ---- the oracle ----

def build_model(ckpt_dir, sd):
    from transformers import AutoConfig, AutoModelForCausalLM
    cfg = AutoConfig.from_pretrained(ckpt_dir)
    if hasattr(cfg, "quantization_config"):
        del cfg.quantization_config
    cfg.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager").eval()
    target = model.state_dict()
    mem = {}
    for name, t in sd.items():
        if ".mlp.experts." in name and name.endswith("_proj.weight"):
            continue  # per-expert hub tensors, stacked below
        mem[name] = t
    for name in target:
        if name.endswith("mlp.experts.gate_up_proj") and name not in mem:
            p = name[: -len("gate_up_proj")]
            e = target[name].shape[0]
            mem[name] = torch.stack([torch.cat([sd[f"{p}{i}.gate_proj.weight"], sd[f"{p}{i}.up_proj.weight"]]) for i in range(e)])
            mem[p + "down_proj"] = torch.stack([sd[f"{p}{i}.down_proj.weight"] for i in range(e)])
    if cfg.tie_word_embeddings:
        mem.pop("lm_head.weight", None)
        missing = set(target) - set(mem) - {"lm_head.weight"}
    else:
        missing = set(target) - set(mem)
    assert not missing and not (set(mem) - set(target)), (missing, set(mem) - set(target))
    model.load_state_dict(mem, strict=False)
    if cfg.tie_word_embeddings:
        model.tie_weights()
    return model


@torch.no_grad()
def run_case(model, prompt):
    ids = list(prompt)
    logits = model(torch.tensor([ids])).logits[0, -1]
    prompt_logits = logits.tolist()
    greedy, margins = [], []
    for _ in range(NEW_TOKENS):
        top = torch.topk(logits, 2)
        greedy.append(int(torch.argmax(logits)))
        margins.append(float(top.values[0] - top.values[1]))
        ids.append(greedy[-1])
        logits = model(torch.tensor([ids])).logits[0, -1]
    def short(xs):  # 7 significant digits: far below the tolerance, a third of the JSON
        return [float(f"{x:.7g}") for x in xs]
    return dict(prompt=prompt, greedy=greedy, margins=short(margins), prompt_logits=short(prompt_logits),
                final_logits=short(logits.tolist()))


def main():
    torch.set_grad_enabled(False)
    write_small_checkpoints()
    cases = [  # (case name, checkpoint dir relative to tests/golden, online quantization)
        ("qwen3-dense-bf16", "ckpt/qwen3-dense-bf16", None),
        ("qwen3-moe-bf16", "ckpt/qwen3-moe-bf16", None),
        ("qwen3-dense-f32", "model/ckpt/qwen3-dense-f32", None),
        ("qwen3-moe-f32-stacked", "model/ckpt/qwen3-moe-f32-stacked", None),
        ("modelopt-mxfp8", "ckpt/modelopt-mxfp8", None),
        ("modelopt-mxfp8-moe", "ckpt/modelopt-mxfp8-moe", None),
        ("ct-mxfp8", "ckpt/ct-mxfp8", None),
        ("ct-mxfp4", "ckpt/ct-mxfp4", None),
        ("fp8-b128", "ckpt/fp8-b128", None),
        ("online-mxfp8-dense", "ckpt/qwen3-dense-bf16", "mxfp8"),
        ("online-mxfp4-dense", "ckpt/qwen3-dense-bf16", "mxfp4"),
        ("online-fp8-b128-dense", "ckpt/qwen3-dense-bf16", "fp8-b128"),
        ("online-mxfp8-moe", "ckpt/qwen3-moe-bf16", "mxfp8"),
        ("online-mxfp4-moe-stacked", "model/ckpt/qwen3-moe-f32-stacked", "mxfp4"),
    ]
    out = []
    for name, rel, quant in cases:
        d = os.path.join(HERE, rel)
        sd = load_dequantized(d)
        if quant:
            sd = quantize_online(sd, quant)
        model = build_model(d, sd)
        runs = [run_case(model, p) for p in PROMPTS]
        out.append(dict(name=name, checkpoint=rel, quantization=quant or "", runs=runs))
        print(name, [r["greedy"][:6] for r in runs], "min margin", min(min(r["margins"]) for r in runs))
    with open(os.path.join(OUT, "cases.json"), "w") as f:
        json.dump(dict(generator="tests/golden/make_model_golden.py", new_tokens=NEW_TOKENS, cases=out), f,
                  separators=(",", ":"))


if __name__ == "__main__":
    main()
