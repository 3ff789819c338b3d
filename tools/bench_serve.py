#!/usr/bin/env python3
"""Serving benchmark for `mxq serve` (or any OpenAI-compatible server), modelled on `vllm bench serve`
(vllm/benchmarks/serve.py): random token-id prompts, streaming /v1/completions over asyncio + httpx, a request
rate (Poisson, optionally gamma-bursty) or a concurrency cap, `--n` samples per prompt (GRPO style). Prints
vLLM's result table (throughputs; TTFT, TPOT, ITL mean/median/percentiles) plus the prefix-cache hit rate from
/metrics (`mxq:prefix_cache_hits_total` / `mxq:prefix_cache_queries_total` deltas over the run, when the server
exposes them), and writes the same numbers as JSON with --json.

Definitions (as vLLM's): TTFT = request sent -> first generated token; ITL = the gaps between a sample's
successive token-carrying chunks; TPOT = (latency - TTFT) / (output tokens - 1) per sample; E2EL = request sent
-> last chunk. With n > 1 every sample of a request counts as its own stream for TTFT/TPOT/ITL, and a request
succeeds when all its samples finish.

  build/venv/bin/python tools/bench_serve.py --base-url http://127.0.0.1:8000 --random-input-len 256 \\
      --random-output-len 64 --num-prompts 200 --max-concurrency 16 --n 8 --json out.json
"""
import argparse
import asyncio
import json
import math
import random
import re
import statistics
import sys
import time
from datetime import datetime

try:
    import httpx
except ImportError:  # the openai 3.x client ships httpx as `httpx2`
    import httpx2 as httpx


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--base-url", default=None, help="server URL (default http://HOST:PORT)")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--endpoint", default="/v1/completions")
    p.add_argument("--model", default=None, help="model id (default: the first of /v1/models)")
    p.add_argument("--api-key", default=None, help="Bearer token (also $MXQ_API_KEY or $OPENAI_API_KEY)")
    p.add_argument("--dataset", "--dataset-name", dest="dataset", default="random", choices=["random"])
    p.add_argument("--random-input-len", type=int, default=1024)
    p.add_argument("--random-output-len", type=int, default=128)
    p.add_argument("--random-range-ratio", type=float, default=0.0,
                   help="lengths uniform in [len * (1 - r), len * (1 + r)]")
    p.add_argument("--random-prefix-len", type=int, default=0, help="tokens of one prefix shared by every prompt")
    p.add_argument("--vocab-size", type=int, default=None,
                   help="token ids are drawn from [0, vocab); default: --tokenizer, else probed via /detokenize")
    p.add_argument("--tokenizer", default=None, help="tokenizer.json: its base vocabulary (special ids excluded)")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-concurrency", type=int, default=None, help="requests in flight at most")
    p.add_argument("--request-rate", type=float, default=float("inf"),
                   help="requests per second (inf: all at once); Poisson arrivals otherwise")
    p.add_argument("--burstiness", type=float, default=1.0, help="gamma shape of the arrivals (1 = Poisson)")
    p.add_argument("--n", type=int, default=1, help="samples per prompt (GRPO groups)")
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--ignore-eos", action=argparse.BooleanOptionalAction, default=True,
                   help="generate exactly the output length (default on)")
    p.add_argument("--percentile-metrics", default="ttft,tpot,itl",
                   help="comma-separated subset of ttft,tpot,itl,e2el to print")
    p.add_argument("--metric-percentiles", default="99", help="comma-separated percentiles, e.g. 50,90,99")
    p.add_argument("--timeout", type=float, default=6 * 3600, help="seconds per request")
    p.add_argument("--json", dest="json_out", default=None, help="write the results to this JSON file")
    p.add_argument("--client-processes", type=int, default=1,
                   help="client processes sharing the requests and the concurrency cap (one Python process "
                        "streaming with httpx tops out at a few thousand chunks/s)")
    p.add_argument("--quiet", action="store_true", help="no table")
    return p.parse_args(argv)


# --- server queries ---------------------------------------------------------------------------------------------
async def first_model(c):
    r = await c.get("/v1/models")
    r.raise_for_status()
    return r.json()["data"][0]


async def max_model_len(c, model, card):
    if isinstance(card.get("max_model_len"), int):
        return card["max_model_len"]
    r = await c.post("/tokenize", json={"model": model, "prompt": "a"})
    return r.json().get("max_model_len") if r.status_code == 200 else None


async def probe_vocab(c, model):
    """The smallest id /detokenize refuses: the model's vocabulary size."""
    async def ok(i):
        r = await c.post("/detokenize", json={"model": model, "tokens": [i]})
        return r.status_code == 200
    if not await ok(0):
        raise SystemExit("bench_serve: /detokenize refuses token 0; give --vocab-size")
    lo, hi = 0, 1
    while await ok(hi):
        lo, hi = hi, hi * 2
        if hi > 1 << 24:
            raise SystemExit("bench_serve: /detokenize accepts every id; give --vocab-size")
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if await ok(mid) else (lo, mid)
    return hi


def tokenizer_vocab(path):
    """Base vocabulary of a tokenizer.json (added/special tokens sit above it in Qwen-style tokenizers)."""
    from tokenizers import Tokenizer
    t = Tokenizer.from_file(path)
    return t.get_vocab_size(with_added_tokens=False), {a for a in t.get_added_tokens_decoder()}


async def scrape(c):
    try:
        r = await c.get("/metrics")
    except httpx.HTTPError:
        return {}
    if r.status_code != 200:
        return {}
    out = {}
    for line in r.text.splitlines():
        m = re.match(r"^(mxq:prefix_cache_(?:hits|queries)_total)(\{[^}]*\})?\s+(\S+)", line)
        if m:
            out[m.group(1)] = out.get(m.group(1), 0.0) + float(m.group(3))
    return out


# --- the dataset ------------------------------------------------------------------------------------------------
def random_requests(a, vocab, exclude):
    rng = random.Random(a.seed)
    ids = [i for i in range(vocab) if i not in exclude]

    def length(mean):
        lo, hi = int(mean * (1 - a.random_range_ratio)), int(mean * (1 + a.random_range_ratio))
        return max(1, rng.randint(max(lo, 1), max(hi, 1)))

    prefix = [rng.choice(ids) for _ in range(a.random_prefix_len)]
    return [(prefix + [rng.choice(ids) for _ in range(length(a.random_input_len))], length(a.random_output_len))
            for _ in range(a.num_prompts)]


# --- one request ------------------------------------------------------------------------------------------------
async def one_request(c, a, model, prompt, out_len, idx):
    body = {"model": model, "prompt": prompt, "max_tokens": out_len, "temperature": a.temperature, "n": a.n,
            "stream": True, "stream_options": {"include_usage": True}, "ignore_eos": a.ignore_eos,
            "return_token_ids": True}
    if a.temperature > 0:
        body["seed"] = a.seed * 1_000_003 + idx
    res = {"prompt_len": len(prompt), "success": False, "error": "", "samples": {}, "usage": None}
    t0 = time.perf_counter()
    try:
        async with c.stream("POST", a.endpoint, json=body, timeout=a.timeout) as r:
            if r.status_code != 200:
                res["error"] = f"HTTP {r.status_code}: {(await r.aread())[:300]!r}"
                return res
            done = False
            async for line in r.aiter_lines():
                if not line:
                    continue
                if not line.startswith("data: "):
                    continue
                data = line[6:]
                if data == "[DONE]":
                    done = True
                    continue
                ch = json.loads(data)
                now = time.perf_counter()
                if "error" in ch:
                    res["error"] = str(ch["error"])
                if ch.get("usage"):
                    res["usage"] = ch["usage"]
                for choice in ch.get("choices", []):
                    s = res["samples"].setdefault(choice["index"], {"times": [], "tokens": 0, "finish": None})
                    ntok = len(choice.get("token_ids") or [])
                    if ntok == 0 and choice.get("text"):
                        ntok = 1  # a server without return_token_ids: one token per text chunk
                    if ntok:
                        s["times"].append(now)
                        s["tokens"] += ntok
                    if choice.get("finish_reason"):
                        s["finish"] = choice["finish_reason"]
                        s["end"] = now
            res["latency"] = time.perf_counter() - t0
            res["t0"] = t0
            res["success"] = (done and not res["error"] and len(res["samples"]) == a.n
                              and all(s["finish"] not in (None, "abort") for s in res["samples"].values()))
            if not res["success"] and not res["error"]:
                res["error"] = "stream ended without every sample finishing"
    except (httpx.HTTPError, OSError, json.JSONDecodeError) as e:
        res["error"] = f"{type(e).__name__}: {e}"
    return res


def percentile(xs, q):
    if not xs:
        return 0.0
    xs = sorted(xs)
    k = (len(xs) - 1) * q / 100.0
    f, c = math.floor(k), math.ceil(k)
    return xs[f] + (xs[c] - xs[f]) * (k - f)


def summarize(a, results, duration, model, vocab, cache):
    ok = [r for r in results if r["success"]]
    input_lens, output_lens, ttfts, tpots, itls, e2els = [], [], [], [], [], []
    for r in ok:
        input_lens.append(r["prompt_len"])
        out = r["usage"]["completion_tokens"] if r.get("usage") else sum(s["tokens"] for s in r["samples"].values())
        output_lens.append(out)
        e2els.append(r["latency"])
        for s in r["samples"].values():
            if not s["times"]:
                continue
            ttft = s["times"][0] - r["t0"]
            ttfts.append(ttft)
            itls += [b - a_ for a_, b in zip(s["times"], s["times"][1:])]
            if s["tokens"] > 1:
                tpots.append((s["times"][-1] - s["times"][0]) / (s["tokens"] - 1))
    total_in, total_out = sum(input_lens), sum(output_lens)
    pcts = [float(x) for x in a.metric_percentiles.split(",") if x]
    out = {
        "date": datetime.now().strftime("%Y%m%d-%H%M%S"), "backend": "openai", "endpoint": a.endpoint,
        "model_id": model, "num_prompts": a.num_prompts, "n": a.n, "request_rate": a.request_rate,
        "burstiness": a.burstiness, "max_concurrency": a.max_concurrency, "random_input_len": a.random_input_len,
        "random_output_len": a.random_output_len, "random_prefix_len": a.random_prefix_len,
        "ignore_eos": a.ignore_eos, "temperature": a.temperature, "vocab_size": vocab,
        "duration": duration, "completed": len(ok), "failed": len(results) - len(ok),
        "num_samples": sum(len(r["samples"]) for r in ok),
        "total_input_tokens": total_in, "total_output_tokens": total_out,
        "request_throughput": len(ok) / duration if duration else 0.0,
        "output_throughput": total_out / duration if duration else 0.0,
        "total_token_throughput": (total_in + total_out) / duration if duration else 0.0,
        "input_lens": input_lens, "output_lens": output_lens, "ttfts": ttfts, "itls": itls,
        "errors": [r["error"] for r in results if not r["success"]],
    }
    for name, xs in (("ttft", ttfts), ("tpot", tpots), ("itl", itls), ("e2el", e2els)):
        ms = [x * 1000 for x in xs]
        out[f"mean_{name}_ms"] = statistics.fmean(ms) if ms else 0.0
        out[f"median_{name}_ms"] = statistics.median(ms) if ms else 0.0
        out[f"std_{name}_ms"] = statistics.pstdev(ms) if len(ms) > 1 else 0.0
        for q in pcts:
            out[f"p{q:g}_{name}_ms"] = percentile(ms, q)
    hits = cache.get("hits")
    queries = cache.get("queries")
    out["prefix_cache_hits"] = hits
    out["prefix_cache_queries"] = queries
    out["prefix_cache_hit_rate"] = (hits / queries if queries else 0.0) if hits is not None else None
    return out


def print_table(a, r):
    print("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row = "{:<40} {:<10}".format
    rowf = "{:<40} {:<10.2f}".format
    print(row("Successful requests:", r["completed"]))
    print(row("Failed requests:", r["failed"]))
    if a.max_concurrency is not None:
        print(row("Maximum request concurrency:", a.max_concurrency))
    print(row("Request rate configured (RPS):", f"{a.request_rate:.2f}" if math.isfinite(a.request_rate) else "inf"))
    if a.n > 1:
        print(row("Samples per prompt (n):", a.n))
    print(rowf("Benchmark duration (s):", r["duration"]))
    print(row("Total input tokens:", r["total_input_tokens"]))
    print(row("Total generated tokens:", r["total_output_tokens"]))
    print(rowf("Request throughput (req/s):", r["request_throughput"]))
    print(rowf("Output token throughput (tok/s):", r["output_throughput"]))
    print(rowf("Total token throughput (tok/s):", r["total_token_throughput"]))
    if r["prefix_cache_hit_rate"] is not None:
        print(rowf("Prefix cache hit rate (%):", 100 * r["prefix_cache_hit_rate"]))
    titles = {"ttft": "Time to First Token", "tpot": "Time per Output Token (excl. 1st token)",
              "itl": "Inter-token Latency", "e2el": "End-to-end Latency"}
    for name in [x for x in a.percentile_metrics.split(",") if x]:
        upper = name.upper()
        print("{s:{c}^{n}}".format(s=titles[name], n=50, c="-"))
        print(rowf(f"Mean {upper} (ms):", r[f"mean_{name}_ms"]))
        print(rowf(f"Median {upper} (ms):", r[f"median_{name}_ms"]))
        for q in [float(x) for x in a.metric_percentiles.split(",") if x]:
            print(rowf(f"P{q:g} {upper} (ms):", r[f"p{q:g}_{name}_ms"]))
    print("=" * 50)


def client(a, conc):
    import os
    key = a.api_key or os.environ.get("MXQ_API_KEY") or os.environ.get("OPENAI_API_KEY")
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    limits = httpx.Limits(max_connections=max(conc, 1) + 2, max_keepalive_connections=max(conc, 1) + 2)
    return httpx.AsyncClient(base_url=a.base_url or f"http://{a.host}:{a.port}", headers=headers, limits=limits,
                             timeout=a.timeout)


async def prepare(a):
    """The model, the dataset and the cache counters before the run."""
    async with client(a, 1) as c:
        card = await first_model(c)
        model = a.model or card["id"]
        exclude = set()
        if a.vocab_size:
            vocab = a.vocab_size
        elif a.tokenizer:
            vocab, exclude = tokenizer_vocab(a.tokenizer)
        else:
            vocab = await probe_vocab(c, model)
        ctx = await max_model_len(c, model, card)
        reqs = random_requests(a, vocab, exclude)
        if ctx:
            worst = max(len(p) + o for p, o in reqs)
            if worst > ctx:
                raise SystemExit(f"bench_serve: input + output up to {worst} tokens exceeds max_model_len {ctx}")
        return model, vocab, reqs, await scrape(c)


async def scrape_once(a):
    async with client(a, 1) as c:
        return await scrape(c)


async def drive(a, model, items, conc, start):
    """Sends `items` (index, prompt, output length, arrival offset) from one event loop, at most `conc` at once,
    each no earlier than start + its offset. Returns the results and when the last one ended."""
    sem = asyncio.Semaphore(conc)

    async def one(i, p, o, at):
        await asyncio.sleep(max(0.0, start + at - time.perf_counter()))
        async with sem:
            return await one_request(c, a, model, p, o, i)

    async with client(a, conc) as c:
        results = await asyncio.gather(*(one(*it) for it in items))
    return list(results), time.perf_counter()


def drive_process(args):
    return asyncio.run(drive(*args))


def bench(a):
    model, vocab, reqs, before = asyncio.run(prepare(a))
    conc = a.max_concurrency or a.num_prompts
    # note: arrivals are drawn up front as offsets from the start (Poisson / gamma, as vLLM's), so several
    # client processes keep one schedule; each process takes every P-th request and its share of the cap.
    rng = random.Random(a.seed + 1)
    offsets, t = [], 0.0
    for _ in reqs:
        offsets.append(t)
        if math.isfinite(a.request_rate):
            t += rng.gammavariate(a.burstiness, 1.0 / (a.request_rate * a.burstiness))
    items = [(i, p, o, offsets[i]) for i, (p, o) in enumerate(reqs)]
    procs = max(1, min(a.client_processes, conc, len(reqs)))
    if procs == 1:
        start = time.perf_counter()
        results, end = asyncio.run(drive(a, model, items, conc, start))
    else:
        import multiprocessing
        # note: perf_counter is CLOCK_MONOTONIC, one clock for every process; the start leaves them time to fork.
        start = time.perf_counter() + 0.5
        jobs = [(a, model, items[k::procs], conc // procs + (k < conc % procs), start) for k in range(procs)]
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            parts = pool.map(drive_process, jobs)
        by_index = {}
        for k, (res, _) in enumerate(parts):
            for it, r in zip(jobs[k][2], res):
                by_index[it[0]] = r
        results = [by_index[i] for i in range(len(reqs))]
        end = max(e for _, e in parts)
    duration = end - start
    after = asyncio.run(scrape_once(a))
    cache = {}
    if "mxq:prefix_cache_queries_total" in after:
        cache = {"hits": after.get("mxq:prefix_cache_hits_total", 0) - before.get("mxq:prefix_cache_hits_total", 0),
                 "queries": after["mxq:prefix_cache_queries_total"] - before.get("mxq:prefix_cache_queries_total", 0)}
    out = summarize(a, results, duration, model, vocab, cache)
    out["client_processes"] = procs
    return out


def main(argv=None):
    a = parse_args(argv)
    if a.n < 1 or a.num_prompts < 1 or a.client_processes < 1:
        raise SystemExit("bench_serve: --n, --num-prompts and --client-processes must be at least 1")
    r = bench(a)
    if not a.quiet:
        print_table(a, r)
        for e in r["errors"][:5]:
            print("error:", e, file=sys.stderr)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump(r, f, indent=1)
    return 0 if r["failed"] == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
