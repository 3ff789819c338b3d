#!/usr/bin/env python3
"""The peer of `mxq-bench decode --device cuda`: transformers bf16 `generate` with a static KV cache (the
fastest stock decode path: torch.compile-free, CUDA-graph-free) on the same checkpoint, batch 1 and 32,
greedy, EOS ignored. Prints the same columns (tok/s of the tg test, pp as one forward over the prompts).

  python3 tools/bench_transformers_decode.py MODEL_DIR [--pp 512] [--tg 128] [--batch 1,32]
"""
import argparse
import time

import torch
from transformers import AutoModelForCausalLM


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--pp", type=int, default=512)
    ap.add_argument("--tg", type=int, default=128)
    ap.add_argument("--batch", default="1,32")
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args()
    m = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.bfloat16, device_map="cuda").eval()
    V = m.config.vocab_size
    print("| peer             | batch | test   |      tok/s |")
    print("|------------------|-------|--------|------------|")
    for b in [int(x) for x in a.batch.split(",")]:
        ids = torch.randint(0, V, (b, a.pp), device="cuda")
        with torch.no_grad():
            best = 1e30
            for _ in range(a.reps + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m(ids)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            print(f"| transformers bf16 | {b:5} | pp{a.pp:<4} | {a.pp * b / best:10.1f} |")
            one = torch.randint(0, V, (b, 1), device="cuda")
            best = 1e30
            for _ in range(a.reps + 1):
                torch.cuda.synchronize()
                t0 = time.perf_counter()
                m.generate(one, max_new_tokens=a.tg + 1, min_new_tokens=a.tg + 1, do_sample=False,
                           cache_implementation="static", pad_token_id=0)
                torch.cuda.synchronize()
                best = min(best, time.perf_counter() - t0)
            print(f"| transformers bf16 | {b:5} | tg{a.tg:<4} | {a.tg * b / best:10.1f} |")


if __name__ == "__main__":
    main()
