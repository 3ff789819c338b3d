#!/usr/bin/env python3
"""Trains mxq's embedded default model: a small Qwen3-architecture causal LM (~15M parameters) on Python source
and documentation available offline on the GPU machine, with the byte-level BPE tokenizer in models/default/.

Run on the GPU machine (torch + transformers + tokenizers there):
    python3 tools/train_default_model.py --out $OUT/default --minutes 5
Writes an HF checkpoint (config.json, generation_config.json, sharded bf16 safetensors of <= 15 MB each so the
device tool can hand them back, tokenizer files) and prints samples. Reproducible up to GPU nondeterminism:
the corpus order and the initialisation are seeded.
"""
import argparse
import glob
import json
import math
import os
import random
import shutil
import sys
import sysconfig
import time

import numpy as np
import torch
from tokenizers import Tokenizer
from transformers import GenerationConfig, Qwen3Config, Qwen3ForCausalLM

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TOK_DIR = os.path.join(ROOT, "models", "default")


def corpus_files(max_bytes):
    """Python source and docs of the local Python installation: stdlib first, then site-packages."""
    paths = sysconfig.get_paths()
    roots = [paths["stdlib"], paths["purelib"]]
    files = []
    for r in roots:
        for ext in ("py", "rst", "md", "txt"):
            files += glob.glob(os.path.join(r, "**", f"*.{ext}"), recursive=True)
    files = sorted(set(f for f in files if "test" not in os.path.basename(f).lower()))
    random.Random(0).shuffle(files)
    out, total = [], 0
    for f in files:
        try:
            size = os.path.getsize(f)
        except OSError:
            continue
        if size < 200 or size > 400_000:
            continue
        out.append(f)
        total += size
        if total >= max_bytes:
            break
    return out, total


def load_tokens(tok, files, eos_id):
    texts = []
    for f in files:
        try:
            with open(f, encoding="utf-8") as fh:
                texts.append(fh.read())
        except (UnicodeDecodeError, OSError):
            continue
    ids = []
    for i in range(0, len(texts), 2048):
        for enc in tok.encode_batch(texts[i:i + 2048], add_special_tokens=False):
            ids.extend(enc.ids)
            ids.append(eos_id)
    return np.asarray(ids, dtype=np.int32)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", required=True)
    ap.add_argument("--minutes", type=float, default=5.0)
    ap.add_argument("--corpus-mb", type=float, default=300)
    ap.add_argument("--seq", type=int, default=512)
    ap.add_argument("--batch", type=int, default=128)
    ap.add_argument("--lr", type=float, default=2e-3)
    args = ap.parse_args()
    torch.manual_seed(0)
    dev = "cuda"

    tok = Tokenizer.from_file(os.path.join(TOK_DIR, "tokenizer.json"))
    vocab = tok.get_vocab_size()
    eos_id = tok.token_to_id("<|endoftext|>")
    t0 = time.time()
    files, nbytes = corpus_files(int(args.corpus_mb * 1e6))
    data = load_tokens(tok, files, eos_id)
    print(f"corpus: {len(files)} files, {nbytes / 1e6:.1f} MB, {len(data) / 1e6:.1f} M tokens "
          f"({time.time() - t0:.0f} s)", flush=True)
    split = int(len(data) * 0.995)
    train, val = torch.from_numpy(data[:split]).long(), torch.from_numpy(data[split:]).long()

    # note: every dim is a multiple of 128 so MXFP8/MXFP4 (32) and FP8-B128 (128) blocks tile it exactly.
    cfg = Qwen3Config(
        vocab_size=vocab, hidden_size=384, intermediate_size=1152, num_hidden_layers=8,
        num_attention_heads=6, num_key_value_heads=2, head_dim=64, max_position_embeddings=2048,
        rope_theta=10000.0, rms_norm_eps=1e-6, tie_word_embeddings=True,
        bos_token_id=eos_id, eos_token_id=eos_id, pad_token_id=eos_id)
    cfg._attn_implementation = "sdpa"
    model = Qwen3ForCausalLM(cfg).to(dev)
    nparams = sum(p.numel() for p in model.parameters())
    print(f"model: {nparams / 1e6:.1f} M parameters", flush=True)

    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95), fused=True)
    budget = args.minutes * 60
    warmup = 100
    gen = torch.Generator().manual_seed(0)

    def batch(src):
        idx = torch.randint(0, len(src) - args.seq - 1, (args.batch,), generator=gen)
        x = torch.stack([src[i:i + args.seq + 1] for i in idx]).to(dev, non_blocking=True)
        return x[:, :-1], x[:, 1:]

    step, start = 0, time.time()
    model.train()
    while True:
        frac = (time.time() - start) / budget
        if frac >= 1:
            break
        # note: the schedule runs on wall-clock time, so the budget, not a step count, fixes the run's length.
        lr = args.lr * min(1.0, (step + 1) / warmup) * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * frac)))
        for g in opt.param_groups:
            g["lr"] = lr
        x, y = batch(train)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            logits = model(input_ids=x).logits
        loss = torch.nn.functional.cross_entropy(logits.float().view(-1, vocab), y.reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if step % 200 == 0:
            print(f"step {step} loss {loss.item():.3f} lr {lr:.2e} {time.time() - start:.0f}s", flush=True)
        step += 1

    model.eval()
    with torch.no_grad(), torch.autocast("cuda", dtype=torch.bfloat16):
        vl = []
        for _ in range(20):
            x, y = batch(val)
            vl.append(torch.nn.functional.cross_entropy(model(input_ids=x).logits.float().view(-1, vocab),
                                                        y.reshape(-1)).item())
    tokens_seen = step * args.batch * args.seq
    print(f"trained {step} steps, {tokens_seen / 1e6:.0f} M tokens; val loss {sum(vl) / len(vl):.3f}", flush=True)

    os.makedirs(args.out, exist_ok=True)
    model = model.to(torch.bfloat16)
    model.save_pretrained(args.out, safe_serialization=True, max_shard_size="14MB")
    GenerationConfig(bos_token_id=cfg.bos_token_id, eos_token_id=cfg.eos_token_id, pad_token_id=eos_id,
                     do_sample=False).save_pretrained(args.out)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        if os.path.exists(os.path.join(TOK_DIR, f)):
            shutil.copy(os.path.join(TOK_DIR, f), args.out)
    with open(os.path.join(args.out, "TRAINING.json"), "w") as fh:
        json.dump({"steps": step, "tokens": tokens_seen, "val_loss": sum(vl) / len(vl), "params": nparams,
                   "corpus_files": len(files), "corpus_tokens": int(len(data)), "minutes": args.minutes,
                   "torch": torch.__version__, "device": torch.cuda.get_device_name()}, fh, indent=1)

    for prompt in ("def fibonacci(n):", "import os\n", "class Stack:\n"):
        ids = torch.tensor([tok.encode(prompt, add_special_tokens=False).ids], device=dev)
        out = model.generate(ids, max_new_tokens=60, do_sample=False)
        print("=== " + repr(prompt) + "\n" + tok.decode(out[0].tolist()), flush=True)


if __name__ == "__main__":
    sys.exit(main())
