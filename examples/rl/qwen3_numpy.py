"""Qwen3 (dense) in numpy, f32: the forward of HF's Qwen3ForCausalLM, and a hand-derived backward for the top
of the network, so the CPU smoke can run a real GRPO step without torch.

Trainable subset (TRAINABLE): the last decoder layer's MLP (post_attention_layernorm, gate/up/down_proj) and the
final norm. Everything below the last MLP is frozen, so its gradient stops at the last layer's residual input;
the tied embedding gets no gradient either (it is also the lm_head: updating it would move every layer's input).

Checkpoint I/O (read_checkpoint / write_checkpoint) speaks safetensors directly for bf16 / f16 / f32, so this
file needs numpy alone.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass

import numpy as np

# files of an HF model dir that are not weights; copied next to a written checkpoint
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "vocab.json", "merges.txt", "chat_template.jinja")


@dataclass
class Config:
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    eps: float
    rope_theta: float
    vocab: int
    tied: bool

    @staticmethod
    def load(model_dir: str) -> "Config":
        with open(os.path.join(model_dir, "config.json")) as f:
            c = json.load(f)
        if c.get("model_type") != "qwen3":
            raise ValueError(f"{model_dir}/config.json: model_type {c.get('model_type')!r}, expected 'qwen3'")
        # note: transformers 5 moved rope_theta into rope_parameters; older configs have it at the top
        rope = c.get("rope_parameters") or {}
        if rope.get("rope_type", "default") != "default":
            raise ValueError(f"{model_dir}: rope_type {rope['rope_type']!r}, only 'default' is implemented")
        return Config(hidden=c["hidden_size"], layers=c["num_hidden_layers"], heads=c["num_attention_heads"],
                      kv_heads=c["num_key_value_heads"],
                      head_dim=c.get("head_dim") or c["hidden_size"] // c["num_attention_heads"],
                      intermediate=c["intermediate_size"], eps=c["rms_norm_eps"],
                      rope_theta=float(rope.get("rope_theta", c.get("rope_theta", 10000.0))),
                      vocab=c["vocab_size"], tied=bool(c.get("tie_word_embeddings", False)))


# ---- bf16 and safetensors -------------------------------------------------------------------------------------
def bf16_bits(x: np.ndarray) -> np.ndarray:
    """f32 -> bf16 bit patterns, round to nearest even (the inputs are finite: a NaN is refused upstream)."""
    u = np.ascontiguousarray(x, np.float32).view(np.uint32)
    return ((u + 0x7FFF + ((u >> 16) & 1)) >> 16).astype(np.uint16)


def bf16_round(x: np.ndarray) -> np.ndarray:
    """The f32 value of x's bf16 rounding (what an export to bf16 keeps)."""
    return (bf16_bits(x).astype(np.uint32) << 16).view(np.float32)


_DTYPES = {"BF16": None, "F16": np.float16, "F32": np.float32}


def read_checkpoint(model_dir: str) -> dict[str, np.ndarray]:
    """Every tensor of the *.safetensors files in model_dir, as f32."""
    files = sorted(f for f in os.listdir(model_dir) if f.endswith(".safetensors"))
    if not files:
        raise ValueError(f"{model_dir}: no *.safetensors file")
    out = {}
    for name in files:
        with open(os.path.join(model_dir, name), "rb") as f:
            n = int.from_bytes(f.read(8), "little")
            header = json.loads(f.read(n))
            data = f.read()
        for key, t in header.items():
            if key == "__metadata__":
                continue
            if t["dtype"] not in _DTYPES:
                raise ValueError(f"{model_dir}/{name}: {key} is {t['dtype']}, expected BF16, F16 or F32")
            a, b = t["data_offsets"]
            raw = np.frombuffer(data[a:b], np.uint8)
            if t["dtype"] == "BF16":
                x = (raw.view("<u2").astype(np.uint32) << 16).view(np.float32)
            else:
                x = raw.view(np.dtype(_DTYPES[t["dtype"]]).newbyteorder("<")).astype(np.float32)
            out[key] = x.reshape(t["shape"])
    return out


def write_checkpoint(out_dir: str, tensors: dict[str, np.ndarray], src_dir: str,
                     shard_bytes: int = 12 << 20) -> None:
    """An HF model dir: the tensors as bf16 safetensors (shards of <= shard_bytes, with an index; small files
    come back from the GPU machine), plus src_dir's config and tokenizer files."""
    os.makedirs(out_dir, exist_ok=True)
    shards, cur, size = [], {}, 0
    for k in sorted(tensors):
        nbytes = tensors[k].size * 2
        if cur and size + nbytes > shard_bytes:
            shards.append(cur)
            cur, size = {}, 0
        cur[k] = tensors[k]
        size += nbytes
    shards.append(cur)
    weight_map = {}
    for i, shard in enumerate(shards):
        fname = f"model-{i + 1:05d}-of-{len(shards):05d}.safetensors"
        header, blobs, off = {}, [], 0
        for k, x in shard.items():
            b = bf16_bits(x).tobytes()
            header[k] = {"dtype": "BF16", "shape": list(x.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
            weight_map[k] = fname
        h = json.dumps(header, separators=(",", ":")).encode()
        h += b" " * (-len(h) % 8)  # note: the spec pads the header to 8 bytes so the data stays aligned
        with open(os.path.join(out_dir, fname), "wb") as f:
            f.write(len(h).to_bytes(8, "little") + h + b"".join(blobs))
    with open(os.path.join(out_dir, "model.safetensors.index.json"), "w") as f:
        json.dump({"metadata": {"total_size": sum(x.size * 2 for x in tensors.values())},
                   "weight_map": weight_map}, f, indent=1)
    for name in SIDE_FILES:
        if os.path.exists(os.path.join(src_dir, name)):
            shutil.copy(os.path.join(src_dir, name), os.path.join(out_dir, name))


# ---- the model ------------------------------------------------------------------------------------------------
def rms_norm(x: np.ndarray, w: np.ndarray, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """(x * rsqrt(mean(x^2) + eps) * w, the normalized x before w): Qwen3RMSNorm in f32."""
    r = x * (1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps))
    return r * w, r


def rms_norm_backward(dy: np.ndarray, r: np.ndarray, x: np.ndarray, w: np.ndarray, eps: float):
    """(dx, dw) of y = r * w, r = x * s, s = (mean(x^2) + eps)^-1/2."""
    dw = np.sum(dy * r, axis=tuple(range(dy.ndim - 1)))
    dr = dy * w
    s = 1.0 / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps)
    return s * (dr - r * np.mean(dr * r, axis=-1, keepdims=True)), dw


def silu(x: np.ndarray) -> np.ndarray:
    return x / (1.0 + np.exp(-x))


def log_softmax(z: np.ndarray) -> np.ndarray:
    z = z - z.max(axis=-1, keepdims=True)
    return z - np.log(np.sum(np.exp(z), axis=-1, keepdims=True))


class Qwen3:
    """Qwen3ForCausalLM's forward over one sequence at a time (positions 0..T-1, causal)."""

    def __init__(self, cfg: Config, weights: dict[str, np.ndarray]):
        self.cfg, self.w = cfg, weights
        last = f"model.layers.{cfg.layers - 1}."
        self.trainable = [last + "post_attention_layernorm.weight", last + "mlp.gate_proj.weight",
                          last + "mlp.up_proj.weight", last + "mlp.down_proj.weight", "model.norm.weight"]
        inv = 1.0 / cfg.rope_theta ** (np.arange(0, cfg.head_dim, 2, dtype=np.float64) / cfg.head_dim)
        self._inv_freq = inv  # HF computes inv_freq in f32 from int64 arange; f64 here, rounded when used

    def _rope(self, x: np.ndarray) -> np.ndarray:
        """Rotary embedding, HF's rotate_half convention: x [T, H, D]."""
        t = x.shape[0]
        freqs = np.outer(np.arange(t), self._inv_freq.astype(np.float32)).astype(np.float32)
        emb = np.concatenate([freqs, freqs], axis=-1)[:, None]  # [T, 1, D]: broadcast over heads
        cos, sin = np.cos(emb), np.sin(emb)
        half = x.shape[-1] // 2
        rot = np.concatenate([-x[..., half:], x[..., :half]], axis=-1)
        return x * cos + rot * sin

    def _attention(self, p: str, x: np.ndarray) -> np.ndarray:
        c, w = self.cfg, self.w
        t = x.shape[0]
        q = (x @ w[p + "q_proj.weight"].T).reshape(t, c.heads, c.head_dim)
        k = (x @ w[p + "k_proj.weight"].T).reshape(t, c.kv_heads, c.head_dim)
        v = (x @ w[p + "v_proj.weight"].T).reshape(t, c.kv_heads, c.head_dim)
        q = self._rope(rms_norm(q, w[p + "q_norm.weight"], c.eps)[0])  # self_attn.q_norm: per head, before RoPE
        k = self._rope(rms_norm(k, w[p + "k_norm.weight"], c.eps)[0])
        group = c.heads // c.kv_heads  # GQA: query head h reads kv head h // group
        k, v = np.repeat(k, group, axis=1), np.repeat(v, group, axis=1)
        scores = np.einsum("thd,shd->hts", q, k) / np.float32(np.sqrt(c.head_dim))
        scores = scores + np.triu(np.full((t, t), -np.inf, np.float32), 1)
        probs = np.exp(log_softmax(scores))
        out = np.einsum("hts,shd->thd", probs, v).reshape(t, c.heads * c.head_dim)
        return out @ w[p + "o_proj.weight"].T

    def forward(self, ids) -> tuple[np.ndarray, dict]:
        """(logits [T, V], the activations the backward needs)."""
        c, w = self.cfg, self.w
        h = w["model.embed_tokens.weight"][np.asarray(ids)]
        acts = {}
        for i in range(c.layers):
            p = f"model.layers.{i}."
            h = h + self._attention(p + "self_attn.", rms_norm(h, w[p + "input_layernorm.weight"], c.eps)[0])
            x, xr = rms_norm(h, w[p + "post_attention_layernorm.weight"], c.eps)
            g, u = x @ w[p + "mlp.gate_proj.weight"].T, x @ w[p + "mlp.up_proj.weight"].T
            a = silu(g) * u
            if i == c.layers - 1:
                acts.update(h_mid=h, x=x, xr=xr, g=g, u=u, a=a)
            h = h + a @ w[p + "mlp.down_proj.weight"].T
        n, nr = rms_norm(h, w["model.norm.weight"], c.eps)
        head = w["model.embed_tokens.weight"] if c.tied else w["lm_head.weight"]
        acts.update(h=h, n=n, nr=nr, head=head)
        return n @ head.T, acts

    def token_logprobs(self, ids, start: int) -> np.ndarray:
        """log p(ids[t] | ids[:t]) for t in [start, len(ids))."""
        logits, _ = self.forward(ids)
        lp = log_softmax(logits[start - 1:-1])
        return lp[np.arange(lp.shape[0]), np.asarray(ids[start:])]

    def backward(self, ids, start: int, coef: np.ndarray) -> tuple[np.ndarray, dict[str, np.ndarray]]:
        """Gradient of L = -sum_t coef[t] * log p(ids[start + t]) over the trainable tensors; returns (the token
        logprobs, {name: dL/dW}). coef carries the GRPO advantage (or 1 / tokens for SFT)."""
        c, w = self.cfg, self.w
        logits, a = self.forward(ids)
        lp_all = log_softmax(logits[start - 1:-1])
        tgt = np.asarray(ids[start:])
        rows = np.arange(tgt.size)
        dlogits = np.zeros_like(logits)
        d = np.exp(lp_all)  # d(-log p_y)/dz = softmax - onehot(y)
        d[rows, tgt] -= 1.0
        dlogits[start - 1:-1] = d * coef[:, None].astype(np.float32)
        dn = dlogits @ a["head"]
        dh, dnorm = rms_norm_backward(dn, a["nr"], a["h"], w["model.norm.weight"], c.eps)
        p = f"model.layers.{c.layers - 1}."
        # mlp.down_proj: h = h_mid + act @ Wd^T, so dWd = dh^T act and d act = dh Wd
        dwd = dh.T @ a["a"]
        da = dh @ w[p + "mlp.down_proj.weight"]
        sg = 1.0 / (1.0 + np.exp(-a["g"]))
        dg = da * a["u"] * sg * (1.0 + a["g"] * (1.0 - sg))  # silu'(g) = s(g) (1 + g (1 - s(g)))
        du = da * silu(a["g"])
        dx = dg @ w[p + "mlp.gate_proj.weight"] + du @ w[p + "mlp.up_proj.weight"]
        _, dpost = rms_norm_backward(dx, a["xr"], a["h_mid"], w[p + "post_attention_layernorm.weight"], c.eps)
        grads = {p + "post_attention_layernorm.weight": dpost, p + "mlp.gate_proj.weight": dg.T @ a["x"],
                 p + "mlp.up_proj.weight": du.T @ a["x"], p + "mlp.down_proj.weight": dwd,
                 "model.norm.weight": dnorm}
        return lp_all[rows, tgt], grads
