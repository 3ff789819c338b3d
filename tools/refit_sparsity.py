#!/usr/bin/env python3
"""Per-step refit delta sparsity under RL-style updates (issue #6): how many bytes of the MXFP8 / MXFP4 /
FP8-B128 planes (values and scales separately) change from one policy-gradient step to the next, against the
bf16 element sparsity, measured with mxq itself.

Run on the GPU machine (torch, transformers, tokenizers, safetensors; the mxq binary):
    python3 tools/refit_sparsity.py --mxq build-gpu/mxq --model models/default --out $OUT [--large]
tools/refit_sparsity.sh wraps it for the device tool. Without a GPU: `--selftest` checks the measurement path
(mxq delta make/inspect -> per-plane counts -> table) against the numpy quantizers of refit_sparsity_ref.py on
tiny random Qwen3 checkpoints; no torch needed.

What one run does, per model (the default 15M model; with --large also a ~0.45B Qwen3 at Qwen3-0.6B's body
proportions, first pretrained on the device for --large-train-s seconds):
- the policy holds f32 master weights (as RL trainers do) and exports bf16 (round to nearest even) after each
  optimizer step as an HF checkpoint (model.safetensors + config.json);
- one step = sample G completions for each of P prompts from the current policy (temperature 1, full softmax),
  score them with a verifiable reward, GRPO loss with group-normalised advantages, one AdamW step;
- for every lr, steps 1..S from the same start (the start's f32 masters and a fresh optimizer);
- each consecutive pair of exports (step k-1 -> k) goes through `mxq delta make --quantization Q` for the three
  formats; `mxq delta inspect --json` gives per-tensor changed entries. The linear projections are the tensors
  mxq quantizes; embeddings and norms travel as bf16 in the delta and are counted apart.
Reward (verifiable, no model): prompts are the 32 tokens ending with a one-line `def ...:` header taken from the
same Python corpus the default model was trained on; r = 1 when the header plus the completion's complete lines,
up to where the function body's indentation ends, parses with ast.parse (after textwrap.dedent) and holds at least
one body line, else 0.
"""
import argparse
import ast
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import threading
import time
import warnings
from concurrent.futures import ThreadPoolExecutor

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FORMATS = ("mxfp8", "mxfp4", "fp8-b128")
LRS = (1e-7, 3e-7, 1e-6, 3e-6, 1e-5)
T0 = time.time()


def log(msg):
    print(f"[{time.time() - T0:6.1f}s] {msg}", flush=True)


# ---- measurement with mxq ----------------------------------------------------------------------------------
def _run(cmd):
    p = subprocess.run(cmd, capture_output=True, text=True)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)}: rc {p.returncode}: {p.stderr.strip()[-2000:]}")
    return p.stdout


def measure_pair(mxq, base, target, fmt, scratch, threads, anchor=False):
    """One `mxq delta make` + `inspect --json`: changed entries per plane kind, summed over the quantized
    (linear) tensors and, apart, over the tensors the delta carries as bf16 (embeddings, norms)."""
    path = os.path.join(scratch, f"d_{threading.get_ident()}_{fmt}.bin")
    t0 = time.time()
    made = _run([mxq, "delta", "make", "--base", base, "--target", target, "--quantization", fmt, "-o", path,
                 "--threads", str(threads)] + (["--anchor"] if anchor else []))
    make_s = time.time() - t0
    info = json.loads(_run([mxq, "delta", "inspect", "--json", path]))
    size = os.path.getsize(path)
    os.remove(path)
    r = {"file_bytes": size, "make_s": round(make_s, 3), "q_values": [0, 0], "q_scales": [0, 0],
         "other": [0, 0], "anchors": [], "tensors": {},
         "by_kind": {}}
    for t in info["tensors"]:
        v, s = t["values"], t.get("scales")
        if t["kind"] == "anchor":
            r["anchors"].append(t["name"])
        if t["format"] == fmt:
            r["q_values"][0] += v["changed"]
            r["q_values"][1] += v["entries"]
            r["q_scales"][0] += s["changed"]
            r["q_scales"][1] += s["entries"]
        else:
            r["other"][0] += v["changed"]
            r["other"][1] += v["entries"]
        r["tensors"][t["name"]] = [v["changed"], v["entries"]] + ([s["changed"], s["entries"]] if s else [])
        kind = re.sub(r"^model\.layers\.\d+\.", "", t["name"])
        k = r["by_kind"].setdefault(kind, [0, 0, 0, 0])
        k[0] += v["changed"]
        k[1] += v["entries"]
        if s:
            k[2] += s["changed"]
            k[3] += s["entries"]
    # cross-check against make's own summary line (all tensors, both plane kinds)
    m = re.search(r"changed: values ([\d.]+)% of (\d+) entries, scales ([\d.]+)% of (\d+) entries", made)
    if not m or int(m.group(2)) != r["q_values"][1] + r["other"][1] or int(m.group(4)) != r["q_scales"][1]:
        raise RuntimeError(f"mxq delta make summary disagrees with inspect: {made!r}")
    return r


class Measurer:
    """Runs the mxq measurements on a thread pool while the GPU goes on; deletes a checkpoint directory once
    every delta that reads it is made."""

    def __init__(self, mxq, scratch, threads, workers, formats=FORMATS):
        self.mxq, self.scratch, self.threads, self.formats = mxq, scratch, threads, formats
        self.pool = ThreadPoolExecutor(workers)
        self.refs, self.keep, self.lock = {}, set(), threading.Lock()
        self.jobs = []  # (key, future)

    def hold(self, d, uses):
        with self.lock:
            self.refs[d] = self.refs.get(d, 0) + uses

    def release(self, d):
        with self.lock:
            self.refs[d] -= 1
            gone = self.refs[d] == 0 and d not in self.keep
        if gone:
            shutil.rmtree(d, ignore_errors=True)

    def submit(self, key, base, target, anchor=False):
        def job():
            try:
                return {f: measure_pair(self.mxq, base, target, f, self.scratch, self.threads, anchor)
                        for f in self.formats}
            finally:
                self.release(base)
                self.release(target)
        self.jobs.append((key, self.pool.submit(job)))

    def results(self, timeout=None):
        out, deadline = {}, None if timeout is None else time.time() + timeout
        for key, fut in self.jobs:
            left = None if deadline is None else max(0.1, deadline - time.time())
            try:
                out[key] = fut.result(timeout=left)
            except Exception as e:  # noqa: BLE001 - a failed or late measurement is reported, not fatal
                out[key] = {"error": f"{type(e).__name__}: {e}"}
        return out


# ---- tables ------------------------------------------------------------------------------------------------
def pct(c, n):
    return 100.0 * c / max(1, n)


def fmt_pct(x):
    if x == 0:
        return "0"
    if x >= 10:
        return f"{x:.1f}"
    if x >= 0.1:
        return f"{x:.2f}"
    return f"{x:.2g}" if x >= 1e-3 else f"{x:.1e}"


def table(title, rows, anchors):
    """rows: dicts with lr, step, bf16 [changed, n], bf16_other, reward, m: {fmt: measure_pair result}."""
    lines = [f"### {title}", "",
             "| lr | step | reward | bf16 changed % | MXFP8 values % | MXFP8 scales % | MXFP4 values % "
             "| MXFP4 scales % | FP8-B128 values % | FP8-B128 scales % | delta / anchor (MXFP8, MXFP4, B128) "
             "| bf16-carried % |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        m = r.get("m") or {}
        cells = [f"{r['lr']:.0e}".replace("e-0", "e-"), str(r["step"]), "" if r.get("reward") is None else f"{r['reward']:.2f}",
                 fmt_pct(pct(*r["bf16"])) if r.get("bf16") else ""]
        if "error" in m or not m:
            cells += [m.get("error", "not measured")[:60]] + [""] * 7
        else:
            for f in FORMATS:
                cells += [fmt_pct(pct(*m[f]["q_values"])), fmt_pct(pct(*m[f]["q_scales"]))]
            cells.append(" / ".join(f"{pct(m[f]['file_bytes'], anchors[f]):.2f}%" for f in FORMATS))
            cells.append(fmt_pct(pct(*m["mxfp8"]["other"])))
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


# ---- policy-gradient steps (torch; device only) --------------------------------------------------------------
def harvest_prompts(tok, files, ctx_tokens, max_sites):
    """(token ids [ctx_tokens], def header line) for one-line `def ...:` headers in the corpus."""
    pat = re.compile(r"^[ \t]*def [A-Za-z_]\w*\(.*\).*:[ \t]*$", re.M)
    texts, heads = [], []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                text = fh.read()
        except (UnicodeDecodeError, OSError):
            continue
        for m in pat.finditer(text):
            head = m.group(0)
            try:
                ast.parse(textwrap.dedent(head) + "\n    pass\n")
            except Exception:  # noqa: BLE001 - a header that is not a whole one-line def is skipped
                continue
            texts.append(text[max(0, m.start() - 1500):m.end() + 1])
            heads.append(head)
            if len(texts) >= max_sites:
                break
        if len(texts) >= max_sites:
            break
    out = []
    for enc, head in zip(tok.encode_batch(texts, add_special_tokens=False), heads):
        if len(enc.ids) >= ctx_tokens:
            out.append((enc.ids[-ctx_tokens:], head))
    return out


def reward(head, completion, ended):
    """1 if the def header plus the completion's complete lines, up to the end of the function body, parse."""
    indent = len(head) - len(head.lstrip())
    lines = completion.split("\n")
    if not ended:
        lines = lines[:-1]  # the last line may be cut off mid-token
    body = []
    for ln in lines:
        if ln.strip() and len(ln) - len(ln.lstrip()) <= indent:
            break
        body.append(ln)
    if not any(b.strip() for b in body):
        return 0.0
    try:
        with warnings.catch_warnings():  # note: sampled code holds bad escapes ("\s"): SyntaxWarning noise
            warnings.simplefilter("ignore")
            ast.parse(textwrap.dedent(head + "\n" + "\n".join(body)) + "\n")
        return 1.0
    except Exception:  # noqa: BLE001 - SyntaxError, IndentationError, ValueError (NUL), RecursionError
        return 0.0


def sample(torch, model, prompts, max_new, eos_id, gen):
    """Ancestral sampling, temperature 1, with the KV cache; returns (completion ids [B, T], mask [B, T])."""
    ids = prompts
    done = torch.zeros(ids.shape[0], dtype=torch.bool, device=ids.device)
    out, mask, past = [], [], None
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        step_in = ids
        for _ in range(max_new):
            o = model(input_ids=step_in, past_key_values=past, use_cache=True)
            past = o.past_key_values
            probs = torch.softmax(o.logits[:, -1].float(), dim=-1)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1)
            mask.append(~done)
            nxt = torch.where(done, torch.full_like(nxt, eos_id), nxt)
            out.append(nxt)
            done = done | (nxt == eos_id)
            step_in = nxt[:, None]
    return torch.stack(out, 1), torch.stack(mask, 1)


class Policy:
    def __init__(self, torch, model, tok, eos_id, sites, args):
        self.torch, self.model, self.tok, self.eos, self.sites, self.a = torch, model, tok, eos_id, sites, args

    def step(self, opt, step_seed):
        torch, a = self.torch, self.a
        g = torch.Generator(device="cuda").manual_seed(step_seed)
        pick = torch.randint(0, len(self.sites), (a.prompts,), generator=torch.Generator().manual_seed(step_seed))
        prompts = torch.tensor([self.sites[i][0] for i in pick.tolist()], device="cuda")
        heads = [self.sites[i][1] for i in pick.tolist()]
        prompts = prompts.repeat_interleave(a.group, 0)
        self.model.eval()
        comp, mask = sample(torch, self.model, prompts, a.max_new, self.eos, g)
        rewards = []
        for i, (row, m) in enumerate(zip(comp.tolist(), mask.tolist())):
            n = sum(m)
            ended = self.eos in row[:n]
            text = self.tok.decode([t for t in row[:n] if t != self.eos])
            rewards.append(reward(heads[i // a.group], text, ended))
        r = torch.tensor(rewards, device="cuda").view(a.prompts, a.group)
        # note: GRPO advantages: (r - group mean) / (group std + 1e-4), unbiased std as in TRL; a group of equal
        # rewards contributes nothing.
        adv = ((r - r.mean(1, keepdim=True)) / (r.std(1, keepdim=True) + 1e-4)).view(-1)
        self.model.train()
        full = torch.cat([prompts, comp], 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = self.model(input_ids=full, use_cache=False).logits[:, prompts.shape[1] - 1:-1]
        logp = torch.log_softmax(logits.float(), -1).gather(-1, comp[..., None]).squeeze(-1)
        mf = mask.float()
        # note: on-policy single update, so the PPO ratio is 1 and clipping is inactive; no KL term. Sequence
        # mean of token log-probs, batch mean over sequences (the GRPO paper's normalisation).
        loss = -((logp * mf).sum(1) / mf.sum(1).clamp(min=1) * adv).mean()
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        opt.step()
        return {"reward": r.mean().item(), "loss": loss.item(), "grad_norm": gnorm.item(),
                "groups_with_signal": int((r.std(1) > 0).sum().item())}


def linear_names(model):
    return {n for n, p in model.named_parameters() if p.dim() == 2 and "embed_tokens" not in n
            and "lm_head" not in n}


def qwen3_config_json(c):
    """config.json for a bf16 Qwen3 export, written field by field from a transformers config (or any object
    with the same attributes) so the file holds exactly the keys mxq's reader needs."""
    rp = getattr(c, "rope_parameters", None) or {}
    theta = rp.get("rope_theta", getattr(c, "rope_theta", 10000.0))
    return {"architectures": ["Qwen3ForCausalLM"], "model_type": "qwen3", "attention_bias": False,
            "hidden_act": "silu", "hidden_size": c.hidden_size, "intermediate_size": c.intermediate_size,
            "num_hidden_layers": c.num_hidden_layers, "num_attention_heads": c.num_attention_heads,
            "num_key_value_heads": c.num_key_value_heads, "head_dim": c.head_dim, "vocab_size": c.vocab_size,
            "max_position_embeddings": c.max_position_embeddings, "rms_norm_eps": c.rms_norm_eps,
            "rope_parameters": {"rope_theta": float(theta), "rope_type": "default"},
            "tie_word_embeddings": bool(c.tie_word_embeddings), "dtype": "bfloat16",
            **{k: getattr(c, k) for k in ("bos_token_id", "eos_token_id", "pad_token_id")
               if getattr(c, k, None) is not None}}


def export(torch, model, out_dir, prev_bf16, lin):
    """bf16 export (RNE of the f32 masters) as an HF checkpoint; bf16 changed elements vs the previous export."""
    from safetensors.torch import save_file
    os.makedirs(out_dir, exist_ok=True)
    tied = model.config.tie_word_embeddings
    cur = {n: p.detach().to(torch.bfloat16) for n, p in model.named_parameters()
           if not (tied and n == "lm_head.weight")}
    save_file({n: t.contiguous().cpu() for n, t in cur.items()}, os.path.join(out_dir, "model.safetensors"),
              metadata={"format": "pt"})
    with open(os.path.join(out_dir, "config.json"), "w") as fh:
        json.dump(qwen3_config_json(model.config), fh, indent=1)
    stats = None
    if prev_bf16 is not None:
        c = {n: int((cur[n].view(torch.int16) != prev_bf16[n].view(torch.int16)).sum().item()) for n in cur}
        stats = {"linear": [sum(c[n] for n in cur if n in lin), sum(cur[n].numel() for n in cur if n in lin)],
                 "other": [sum(c[n] for n in cur if n not in lin), sum(cur[n].numel() for n in cur if n not in lin)]}
    return cur, stats


def rl_sweep(torch, name, model, tok, eos_id, sites, args, meas, scratch, lrs, steps, deadline, rows):
    """Steps 1..steps per lr from the same start; appends table rows (measurements filled in later); returns
    whether every step ran."""
    start = {n: p.detach().clone() for n, p in model.named_parameters()}
    lin = linear_names(model)
    d0 = os.path.join(scratch, f"{name}_start")
    start_bf16, _ = export(torch, model, d0, None, lin)
    meas.keep.add(d0)
    meas.hold(d0, 10 ** 9)
    policy = Policy(torch, model, tok, eos_id, sites, args)
    for lr in lrs:
        with torch.no_grad():
            for n, p in model.named_parameters():
                p.copy_(start[n])
        opt = torch.optim.AdamW(model.parameters(), lr=lr, betas=(0.9, 0.999), eps=1e-8,
                                weight_decay=args.wd, fused=True)
        prev_dir, prev_bf16 = d0, start_bf16
        for s in range(1, steps + 1):
            if time.time() > deadline:
                log(f"{name}: deadline reached before lr {lr:g} step {s}; stopping this model")
                return False
            t0 = time.time()
            st = policy.step(opt, step_seed=1000 * s + 7)
            d = os.path.join(scratch, f"{name}_lr{lr:g}_s{s}")
            prev_bf16_next, bst = export(torch, model, d, prev_bf16, lin)
            meas.hold(d, 2 if s < steps else 1)
            meas.submit((name, lr, s), prev_dir, d)
            rows.append({"model": name, "lr": lr, "step": s, "reward": st["reward"], "bf16": bst["linear"],
                         "bf16_other": bst["other"], "train": st})
            log(f"{name} lr {lr:g} step {s}: reward {st['reward']:.3f} groups {st['groups_with_signal']}/"
                f"{args.prompts} loss {st['loss']:.4f} |g| {st['grad_norm']:.3f} bf16 linear changed "
                f"{pct(*bst['linear']):.4f}% ({time.time() - t0:.2f} s)")
            prev_dir, prev_bf16 = d, prev_bf16_next
    return True


def pretrain_large(torch, args, tok, eos_id, files):
    """A Qwen3 with Qwen3-0.6B's body (hidden 1024, 28 layers, 16 q / 8 kv heads of 128, MLP 3072, tied
    embeddings) and the default model's 4096-token vocabulary, trained from scratch for args.large_train_s."""
    import math

    import numpy as np
    from transformers import Qwen3Config, Qwen3ForCausalLM
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import train_default_model as tdm
    t0 = time.time()
    data = tdm.load_tokens(tok, files, eos_id)
    data = torch.from_numpy(data.astype(np.int64))
    log(f"large: corpus {len(files)} files, {len(data) / 1e6:.1f} M tokens ({time.time() - t0:.1f} s)")
    cfg = Qwen3Config(vocab_size=tok.get_vocab_size(), hidden_size=1024, intermediate_size=3072,
                      num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
                      max_position_embeddings=2048, rope_theta=1000000.0, rms_norm_eps=1e-6,
                      tie_word_embeddings=True, bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    cfg._attn_implementation = "sdpa"
    torch.manual_seed(0)
    with torch.device("cuda"):  # note: initialise on the GPU; 0.45B normal_ draws on the CPU take seconds
        model = Qwen3ForCausalLM(cfg)
    nparams = sum(p.numel() for p in model.parameters())
    decay = [p for p in model.parameters() if p.dim() >= 2]
    no_decay = [p for p in model.parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.large_lr, betas=(0.9, 0.95), fused=True)
    gen = torch.Generator().manual_seed(0)
    seq, bs, warmup = 512, args.large_batch, 50
    step, start, losses = 0, time.time(), []
    model.train()
    while True:
        frac = (time.time() - start) / args.large_train_s
        if frac >= 1:
            break
        lr = args.large_lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for gr in opt.param_groups:
            gr["lr"] = lr
        idx = torch.randint(0, len(data) - seq - 1, (bs,), generator=gen)
        x = torch.stack([data[i:i + seq + 1] for i in idx]).to("cuda", non_blocking=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, cfg.vocab_size), x[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 50 == 0:
            losses.append((step, round(loss.item(), 3)))
            log(f"large pretrain step {step} loss {loss.item():.3f} lr {lr:.2e}")
        step += 1
    info = {"params": nparams, "steps": step, "tokens": step * bs * seq, "seconds": round(time.time() - start, 1),
            "final_loss": round(loss.item(), 3), "loss_curve": losses, "peak_lr": args.large_lr,
            "batch": bs, "seq": seq}
    log(f"large: {nparams / 1e6:.1f} M params, {step} steps, {info['tokens'] / 1e6:.1f} M tokens, loss "
        f"{info['final_loss']}")
    del opt
    torch.cuda.empty_cache()
    return model, info


def device_main(args):
    import torch
    from tokenizers import Tokenizer
    from transformers import Qwen3ForCausalLM
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import train_default_model as tdm
    deadline = T0 + args.deadline_s
    os.makedirs(args.out, exist_ok=True)
    scratch = args.scratch
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)
    tok = Tokenizer.from_file(os.path.join(args.model, "tokenizer.json"))
    eos_id = tok.token_to_id("<|endoftext|>")
    # note: one file list; its prefix up to 4000 def headers gives the prompts, the whole list the large
    # model's pretraining text (corpus_files orders files the same way for any byte budget).
    files, nbytes = tdm.corpus_files(int((args.large_corpus_mb if args.large else args.corpus_mb) * 1e6))
    sites = harvest_prompts(tok, files, args.ctx, 4000)
    log(f"corpus {len(files)} files {nbytes / 1e6:.0f} MB; {len(sites)} def-header prompts; device "
        f"{torch.cuda.get_device_name()}, torch {torch.__version__}")
    meas = Measurer(args.mxq, scratch, args.mxq_threads, args.mxq_workers)
    lrs = [float(x) for x in args.lrs.split(",")]
    report = {"args": vars(args), "models": {}}

    def run_model(name, model, steps, extra):
        t0 = time.time()
        mrep = report["models"][name] = {"rows": [], "complete": False, **extra}
        try:
            mrep["complete"] = rl_sweep(torch, name, model, tok, eos_id, sites, args, meas, scratch, lrs, steps,
                                        deadline, mrep["rows"])
        finally:
            mrep["rl_seconds"] = round(time.time() - t0, 1)
            d0 = os.path.join(scratch, f"{name}_start")
            if os.path.isdir(d0):
                anchor_meas = Measurer(args.mxq, scratch, args.mxq_threads, 1)
                anchor_meas.keep.add(d0)
                anchor_meas.hold(d0, 2)
                anchor_meas.submit("anchor", d0, d0, anchor=True)
                mrep["anchor_job"] = anchor_meas

    try:
        model = Qwen3ForCausalLM.from_pretrained(args.model, dtype=torch.float32).to("cuda")
        n = sum(p.numel() for p in model.parameters())
        run_model("default", model, args.steps, {"params": n, "source": args.model})
        del model
        torch.cuda.empty_cache()
    except Exception as e:  # noqa: BLE001 - keep going to the large model and the report
        import traceback
        traceback.print_exc()
        report["models"].setdefault("default", {})["error"] = f"{type(e).__name__}: {e}"
    if args.large:
        try:
            model, info = pretrain_large(torch, args, tok, eos_id, files)
            run_model("large", model, args.large_steps, {"params": info["params"], "pretrain": info})
            del model
            torch.cuda.empty_cache()
        except Exception as e:  # noqa: BLE001
            import traceback
            traceback.print_exc()
            report["models"].setdefault("large", {})["error"] = f"{type(e).__name__}: {e}"
    log("GPU work done; waiting for the mxq measurements")
    results = meas.results(timeout=max(5.0, T0 + args.deadline_s + args.measure_grace_s - time.time()))
    md = [f"## refit delta sparsity, {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"{torch.cuda.get_device_name()}", ""]
    for name, mrep in report["models"].items():
        if mrep.get("error"):
            md.append(f"{name}: FAILED: {mrep['error']}\n")
        if "anchor_job" not in mrep:
            continue
        anchor = mrep.pop("anchor_job").results(timeout=60)["anchor"]
        mrep["anchor"] = anchor
        anchors = {f: anchor[f]["file_bytes"] for f in FORMATS} if "error" not in anchor else None
        for r in mrep["rows"]:
            r["m"] = results.get((name, r["lr"], r["step"]), {"error": "not measured"})
        if anchors is None:
            md.append(f"### {name}: anchor measurement failed: {anchor['error']}\n")
            continue
        title = (f"{name} ({mrep['params'] / 1e6:.1f} M params), per-step deltas, anchors "
                 + ", ".join(f"{f} {anchors[f] / 1e6:.2f} MB" for f in FORMATS))
        md.append(table(title, mrep["rows"], anchors))
        notes = [f"RL: {len(mrep['rows'])} steps in {mrep.get('rl_seconds')} s"
                 + ("" if mrep.get("complete") else " (stopped early: deadline or error)")]
        if "pretrain" in mrep:
            pt = mrep["pretrain"]
            notes.append(f"pretrained from scratch on the device: {pt['steps']} AdamW steps, {pt['tokens'] / 1e6:.1f} M "
                         f"tokens, {pt['seconds']} s, final train loss {pt['final_loss']}")
        slow = [r["m"][f]["make_s"] for r in mrep["rows"] if "error" not in r["m"] for f in FORMATS]
        if slow:
            notes.append(f"mxq delta make: {sum(slow) / len(slow):.2f} s mean per delta ({args.mxq_threads} threads)")
        anchored = sorted({t for r in mrep["rows"] if "error" not in r["m"] for f in FORMATS
                           for t in r["m"][f]["anchors"]})
        if anchored:
            notes.append(f"tensors sent as anchors in some delta (counted as all changed): {', '.join(anchored[:8])}")
        md.append("; ".join(notes) + "\n")
    text = "\n".join(md)
    with open(os.path.join(args.out, "sparsity.md"), "w") as fh:
        fh.write(text)
    for mrep in report["models"].values():
        for r in mrep.get("rows", []):
            for f in FORMATS:
                if isinstance(r.get("m"), dict) and f in r["m"]:
                    r["m"][f].pop("tensors", None)  # per-tensor numbers only in the full dump
    with open(os.path.join(args.out, "sparsity.json"), "w") as fh:
        json.dump(report, fh, indent=1, default=str)
    shutil.rmtree(scratch, ignore_errors=True)
    print(text, flush=True)
    return 0


# ---- self-test without torch ---------------------------------------------------------------------------------
def selftest(args):
    """Tiny random Qwen3 checkpoints (numpy): f32 masters moved by +-lr per step, exported bf16; compares mxq's
    per-tensor changed entries with the numpy reference quantizers, then prints the table."""
    import numpy as np
    sys.path.insert(0, os.path.join(ROOT, "tools"))
    import refit_sparsity_ref as ref
    for name, ok in ref.check_golden():
        if not ok:
            print(f"selftest: reference quantizer {name} differs from its golden file")
            return 1
    from types import SimpleNamespace
    cfg = qwen3_config_json(SimpleNamespace(
        hidden_size=128, intermediate_size=384, num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1,
        head_dim=64, vocab_size=256, max_position_embeddings=512, rms_norm_eps=1e-6,
        rope_parameters={"rope_theta": 1e6, "rope_type": "default"}, tie_word_embeddings=True, bos_token_id=255,
        eos_token_id=255, pad_token_id=255))
    h, inter, hd = 128, 384, 64
    shapes = {"model.embed_tokens.weight": (256, h), "model.norm.weight": (h,)}
    for i in range(2):
        p = f"model.layers.{i}."
        shapes.update({p + "self_attn.q_proj.weight": (2 * hd, h), p + "self_attn.k_proj.weight": (hd, h),
                       p + "self_attn.v_proj.weight": (hd, h), p + "self_attn.o_proj.weight": (h, 2 * hd),
                       p + "self_attn.q_norm.weight": (hd,), p + "self_attn.k_norm.weight": (hd,),
                       p + "mlp.gate_proj.weight": (inter, h), p + "mlp.up_proj.weight": (inter, h),
                       p + "mlp.down_proj.weight": (h, inter), p + "input_layernorm.weight": (h,),
                       p + "post_attention_layernorm.weight": (h,)})
    rng = np.random.default_rng(6)
    master = {n: (rng.standard_normal(s) * (0.02 if len(s) == 2 else 0.1) + (0 if len(s) == 2 else 1))
              .astype(np.float32) for n, s in shapes.items()}
    scratch = args.scratch
    shutil.rmtree(scratch, ignore_errors=True)
    os.makedirs(scratch)

    def write(d, m):
        # note: a plain safetensors writer (header JSON + bf16 bytes): safetensors.numpy has no bfloat16
        os.makedirs(d)
        header, blobs, off = {}, [], 0
        for n, v in m.items():
            b = ref.f32_to_bf16_bits(v).astype("<u2").tobytes()
            header[n] = {"dtype": "BF16", "shape": list(v.shape), "data_offsets": [off, off + len(b)]}
            blobs.append(b)
            off += len(b)
        hb = json.dumps(header, separators=(",", ":")).encode()
        hb += b" " * (-len(hb) % 8)
        with open(os.path.join(d, "model.safetensors"), "wb") as fh:
            fh.write(len(hb).to_bytes(8, "little") + hb + b"".join(blobs))
        with open(os.path.join(d, "config.json"), "w") as fh:
            json.dump(cfg, fh)
        return {n: ref.bf16_to_f32(ref.f32_to_bf16_bits(v)) for n, v in m.items()}

    meas = Measurer(args.mxq, scratch, 2, 2)
    d0 = os.path.join(scratch, "start")
    b0 = write(d0, master)
    meas.keep.add(d0)
    meas.hold(d0, 10 ** 9)
    rows, expect = [], {}
    for lr in (1e-5, 1e-3):
        m = {n: v.copy() for n, v in master.items()}
        prev_d, prev_b = d0, b0
        for s in (1, 2):
            for n in m:  # Adam's first step moves every element by ~lr
                m[n] += np.float32(lr) * np.sign(rng.standard_normal(m[n].shape)).astype(np.float32)
            d = os.path.join(scratch, f"lr{lr:g}_s{s}")
            b = write(d, m)
            meas.hold(d, 2 if s < 2 else 1)
            meas.submit(("tiny", lr, s), prev_d, d)
            lin = [n for n in m if m[n].ndim == 2 and "embed" not in n]
            changed = sum(int((b[n] != prev_b[n]).sum()) for n in lin)
            rows.append({"lr": lr, "step": s, "reward": None, "bf16": [changed, sum(b[n].size for n in lin)]})
            exp = {}
            for f, q in ref.QUANTIZERS.items():
                for n in lin:
                    (ov, os_), (nv, ns) = q(prev_b[n]), q(b[n])
                    width = 4 if f == "fp8-b128" else 1
                    exp[(f, n)] = [int((ov != nv).sum()), int((os_.view(np.uint8).reshape(-1, width)
                                                               != ns.view(np.uint8).reshape(-1, width)).any(1).sum())]
            expect[("tiny", lr, s)] = exp
            prev_d, prev_b = d, b
    res = meas.results(timeout=300)
    am = Measurer(args.mxq, scratch, 2, 1)
    am.keep.add(d0)
    am.hold(d0, 2)
    am.submit("anchor", d0, d0, anchor=True)
    anchor = am.results(timeout=120)["anchor"]
    bad = 0
    for key, exp in expect.items():
        if "error" in res[key]:
            print(f"selftest: {key}: {res[key]['error']}")
            return 1
        for (f, n), (cv, cs) in exp.items():
            got = res[key][f]["tensors"][n]
            if got[0] != cv or got[2] != cs:
                bad += 1
                print(f"selftest MISMATCH {key} {f} {n}: mxq values {got[0]} scales {got[2]}, numpy {cv} {cs}")
    for r in rows:
        r["m"] = res[("tiny", r["lr"], r["step"])]
    print(table("selftest: tiny random Qwen3, f32 masters moved by +-lr per step",
                rows, {f: anchor[f]["file_bytes"] for f in FORMATS}))
    print(f"selftest: {len(expect)} deltas x {len(FORMATS)} formats, per-tensor counts vs numpy reference: "
          f"{'all equal' if not bad else f'{bad} mismatches'}")
    shutil.rmtree(scratch, ignore_errors=True)
    return 1 if bad else 0


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--mxq", default=os.path.join(ROOT, "build-gpu", "mxq"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"))
    ap.add_argument("--out", default="/tmp/refit_sparsity_out")
    ap.add_argument("--scratch", default=None, help="checkpoint scratch (default /dev/shm/refit_sparsity or /tmp)")
    ap.add_argument("--lrs", default=",".join(f"{x:g}" for x in LRS))
    ap.add_argument("--steps", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--group", type=int, default=8)
    ap.add_argument("--ctx", type=int, default=32, help="prompt tokens")
    ap.add_argument("--max-new", type=int, default=48)
    ap.add_argument("--wd", type=float, default=0.01)
    ap.add_argument("--corpus-mb", type=float, default=20, help="corpus read for prompts")
    ap.add_argument("--large", action="store_true", help="also pretrain and step the ~0.45B model")
    ap.add_argument("--large-steps", type=int, default=8)
    ap.add_argument("--large-train-s", type=float, default=120)
    ap.add_argument("--large-lr", type=float, default=6e-4)
    ap.add_argument("--large-batch", type=int, default=64)
    ap.add_argument("--large-corpus-mb", type=float, default=40)
    ap.add_argument("--deadline-s", type=float, default=420, help="no new RL step after this many seconds")
    ap.add_argument("--measure-grace-s", type=float, default=60)
    ap.add_argument("--mxq-threads", type=int, default=6)
    ap.add_argument("--mxq-workers", type=int, default=2)
    ap.add_argument("--selftest", action="store_true")
    args = ap.parse_args()
    if args.scratch is None:
        shm = "/dev/shm"
        big = os.path.isdir(shm) and shutil.disk_usage(shm).free > (40 << 30 if args.large else 2 << 30)
        args.scratch = os.path.join(shm if big else "/tmp", "refit_sparsity")
    if not os.access(args.mxq, os.X_OK):
        print(f"refit_sparsity: {args.mxq}: no mxq binary (build the mxq_cli target)")
        return 2
    return selftest(args) if args.selftest else device_main(args)


if __name__ == "__main__":
    sys.exit(main())
