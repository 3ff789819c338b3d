"""Trainer state-dict names -> the engine's tensors (HF names, as GET /get_model_info lists them).

The engine names its tensors as the checkpoint it loaded did (src/model/qwen3_weights.cpp): Qwen3 dense, Qwen3-MoE
with per-expert projections (`mlp.experts.<e>.{gate,up,down}_proj.weight`) or with transformers' stacked
experts (`mlp.experts.gate_up_proj` [E, 2I, H], rows [0, I) gate and [I, 2I) up; `mlp.experts.down_proj`
[E, H, I]). A trainer may hold the other expert layout, or wrapper prefixes (DDP `module.`, torch.compile
`_orig_mod.`, FSDP `_fsdp_wrapped_module.`); `map_state_dict` resolves both and refuses anything else by name.
"""

from __future__ import annotations

import re

import numpy as np

WRAPPER_PREFIXES = ("module.", "_orig_mod.", "_fsdp_wrapped_module.")

# The projections quantized schemes quantize (WeightSpec.linear): attention q/k/v/o, dense MLP gate/up/down,
# every MoE expert (per-expert or stacked). Not: embeddings, norms, biases, the router (mlp.gate), lm_head.
_LINEAR = re.compile(r"^model\.layers\.\d+\.(self_attn\.[qkvo]_proj\.weight|mlp\.(gate|up|down)_proj\.weight|"
                     r"mlp\.experts\.\d+\.(gate|up|down)_proj\.weight|mlp\.experts\.(gate_up|down)_proj)$")
_PER_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate|up|down)_proj\.weight$")
_STACKED = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(gate_up|down)_proj$")


def is_linear(name: str) -> bool:
    """True for the tensors mxq quantizes at load with --quantization and `mxq quantize` converts."""
    return _LINEAR.match(name) is not None


def _strip(name: str) -> str:
    changed = True
    while changed:
        changed = False
        for p in WRAPPER_PREFIXES:
            if name.startswith(p):
                name, changed = name[len(p):], True
    return name.replace("._orig_mod.", ".").replace("._fsdp_wrapped_module.", ".")


def _stack(parts):
    if type(parts[0]).__module__.startswith("torch"):
        import torch  # noqa: PLC0415
        return torch.stack(parts)
    return np.stack([np.asarray(p) for p in parts])


def _cat0(a, b):
    if type(a).__module__.startswith("torch"):
        import torch  # noqa: PLC0415
        return torch.cat([a, b], 0)
    return np.concatenate([np.asarray(a), np.asarray(b)], 0)


def _shape(t) -> tuple[int, ...]:
    return tuple(int(d) for d in t.shape)


def _names(names, limit=5) -> str:
    names = sorted(names)
    return "[" + ", ".join(names[:limit]) + (f", ... {len(names) - limit} more" if len(names) > limit else "") + "]"


def map_state_dict(state_dict, table: dict[str, tuple[str, tuple[int, ...]]]) -> dict:
    """{engine name: tensor} for every tensor of `table` ({name: (format, shape)}), taken from `state_dict`
    (name -> numpy array or torch tensor): same name, wrapper prefixes stripped, or the other expert layout
    (split or stacked, views where possible). Refuses unknown, missing, duplicated or mis-shaped tensors."""
    src: dict[str, object] = {}
    for k, v in state_dict.items():
        n = _strip(k)
        if n in src:
            raise ValueError(f"state dict: {k!r} and another key both name {n!r}")
        src[n] = v
    out: dict[str, object] = {}
    used: set[str] = set()
    for name in table:
        if name in src:
            out[name], _ = src[name], used.add(name)
            continue
        m = _PER_EXPERT.match(name)
        if m:  # engine per-expert, trainer stacked
            base, e, proj = m.group(1), int(m.group(2)), m.group(3)
            key = f"{base}.{'down' if proj == 'down' else 'gate_up'}_proj"
            if key in src:
                t = src[key]
                used.add(key)
                n, k = table[name][1]
                want = (n, k) if proj == "down" else (2 * n, k)
                if len(_shape(t)) != 3 or _shape(t)[1:] != want or _shape(t)[0] <= e:
                    raise ValueError(f"{key}: shape {list(_shape(t))} in the state dict, expected [E > {e}, "
                                     f"{want[0]}, {want[1]}] to give the engine's {name} {[n, k]}")
                if proj == "down":
                    out[name] = t[e]
                else:
                    rows = _shape(t)[1] // 2  # note: rows [0, I) are gate, [I, 2I) up (qwen3.cpp)
                    out[name] = t[e, :rows] if proj == "gate" else t[e, rows:]
            continue
        m = _STACKED.match(name)
        if m:  # engine stacked, trainer per-expert
            base, proj = m.group(1), m.group(2)
            experts = table[name][1][0]
            if proj == "down":
                keys = [f"{base}.{e}.down_proj.weight" for e in range(experts)]
                if all(k in src for k in keys):
                    out[name] = _stack([src[k] for k in keys])
                    used.update(keys)
            else:
                keys = [(f"{base}.{e}.gate_proj.weight", f"{base}.{e}.up_proj.weight") for e in range(experts)]
                if all(g in src and u in src for g, u in keys):
                    out[name] = _stack([_cat0(src[g], src[u]) for g, u in keys])
                    used.update(k for pair in keys for k in pair)
    unknown = set(src) - used
    # note: tied models: transformers' state_dict() holds lm_head.weight (the embedding) but the engine has
    # none; it ignores a shipped lm_head as transformers does (qwen3_weights.cpp), so the client does too.
    if "lm_head.weight" in unknown and "lm_head.weight" not in table and "model.embed_tokens.weight" in table:
        unknown.discard("lm_head.weight")
    missing = set(table) - set(out)
    if unknown or missing:
        raise ValueError(f"state dict does not match the engine's tensors: {len(unknown)} unknown "
                         f"{_names(unknown)}, {len(missing)} missing {_names(missing)}")
    for name, t in out.items():
        want = tuple(table[name][1])
        if _shape(t) != want:
            raise ValueError(f"{name}: shape {list(_shape(t))} in the state dict, the engine expects {list(want)}")
    return out
