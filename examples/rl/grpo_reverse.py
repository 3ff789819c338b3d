#!/usr/bin/env python3
"""GRPO on reverse-text with mxq serve as the rollout engine (examples/rl/README.md).

    python3 examples/rl/grpo_reverse.py --mxq build/mxq --model models/default --device cuda --out OUT/rl

1. SFT warm-up of the model on the task (the trainer's f32 master weights), written as a bf16 HF dir.
2. `mxq serve` on that dir (MXFP8 by default); the client's first update is an anchor of the same weights.
3. Per step: sample n completions per prompt through /v1/completions (logprobs, token ids), score them, take
   one GRPO step, push the new bf16 weights with mxq_client (sparse delta, an anchor every K updates; the
   server's checksums verified), and log reward, timings, delta size, changed fractions, the checksum verdict
   and the trainer-vs-engine logprob gap on the sampled tokens.
Writes OUT/log.json (config + one record per step + summary), OUT/run.png, OUT/serve.log, OUT/sft_checkpoint/.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import time

# note: the numpy trainer's matmuls are small ([~20, 384] x [384, 1152]); BLAS threads cost more than they
# give there (15x slower on a busy 2-core machine), and the CPU engine wants the cores. Set before numpy loads.
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")

import numpy as np  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
sys.path.insert(0, HERE)
sys.path.append(os.path.join(ROOT, "python"))  # note: the repo's client, where none is installed

import engine  # noqa: E402
import plot  # noqa: E402
import reverse_text as task  # noqa: E402
from trainers import make_trainer  # noqa: E402


def parse_args(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mxq", default=os.path.join(ROOT, "build", "mxq"), help="the mxq binary")
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "default"), help="HF dir to start from")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu", help="engine and torch trainer device")
    ap.add_argument("--server", help="use this running mxq serve instead of starting one (URL)")
    ap.add_argument("--api-key")
    ap.add_argument("--quantization", default="mxfp8", help="the engine's --quantization (mxfp8, none, ...)")
    ap.add_argument("--trainer", choices=("auto", "torch", "numpy"), default="auto",
                    help="torch (every parameter, AdamW) or numpy (top of the network); auto: torch if installed")
    ap.add_argument("--out", required=True, help="output dir")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--sft-steps", type=int, default=40,
                    help="supervised warm-up steps; 40 leaves the task half learnt (greedy pass ~10%%)")
    ap.add_argument("--sft-batch", type=int, default=64)
    ap.add_argument("--sft-lr", type=float, default=1e-3)
    ap.add_argument("--steps", type=int, default=100, help="GRPO steps")
    ap.add_argument("--prompts", type=int, default=32, help="prompts per step")
    ap.add_argument("--n", type=int, default=8, help="samples per prompt (the GRPO group)")
    ap.add_argument("--lr", type=float, default=1e-4, help="GRPO learning rate")
    ap.add_argument("--max-tokens", type=int, default=12)
    ap.add_argument("--temperature", type=float, default=1.0)
    ap.add_argument("--min-len", type=int, default=3)
    ap.add_argument("--max-len", type=int, default=8)
    ap.add_argument("--anchor-every", type=int, default=5,
                    help="the client's anchor_every: an all-anchor update every K")
    ap.add_argument("--eval-prompts", type=int, default=64, help="greedy pass rate before / after (0: skip)")
    ap.add_argument("--gpu-memory-utilization", type=float, default=0.3, help="the engine's, with --device cuda")
    ap.add_argument("--time-budget", type=float, default=330.0,
                    help="seconds for the whole run; GRPO stops early (logged) rather than overrun. 0: none")
    ap.add_argument("--require-rise", action="store_true", help="exit 1 unless the reward rose over the run")
    return ap.parse_args(argv)


def load_tokenizer(model_dir: str):
    try:
        from tokenizers import Tokenizer  # noqa: PLC0415
    except ImportError:
        raise SystemExit("needs the `tokenizers` package (pip install tokenizers) for the SFT data") from None
    return Tokenizer.from_file(os.path.join(model_dir, "tokenizer.json"))


def eos_id(model_dir: str) -> int:
    for name in ("generation_config.json", "config.json"):
        path = os.path.join(model_dir, name)
        if os.path.exists(path):
            with open(path) as f:
                e = json.load(f).get("eos_token_id")
            if e is not None:
                return e[0] if isinstance(e, list) else int(e)
    raise SystemExit(f"{model_dir}: no eos_token_id in generation_config.json or config.json")


def group_advantages(rewards: np.ndarray, n: int) -> np.ndarray:
    """GRPO: each sample's reward minus its group's mean, over the group's std (0 where the group agrees)."""
    r = rewards.reshape(-1, n)
    std = r.std(axis=1, keepdims=True)
    return np.where(std > 1e-6, (r - r.mean(axis=1, keepdims=True)) / np.maximum(std, 1e-6), 0.0).reshape(-1)


def logprob_gap(trainer_lps: list[np.ndarray], engine_lps: list[list[float]]) -> dict:
    """Trainer (f32 master) vs engine (quantized) logprobs of the engine's sampled tokens. The engine is the
    sampler mu, so with d = log pi - log mu: k1 = E[-d] and k3 = E[e^d - 1 - d] (Schulman's estimators of
    KL(mu || pi); k3 is never negative)."""
    t = np.concatenate(trainer_lps)
    e = np.concatenate([np.asarray(x, np.float64) for x in engine_lps])
    d = t - e
    return {"tokens": int(d.size), "mean_abs": float(np.abs(d).mean()), "max_abs": float(np.abs(d).max()),
            "kl_k1": float(-d.mean()), "kl_k3": float(np.mean(np.expm1(d) - d))}


def _np(a) -> np.ndarray:
    """A plane as a numpy array (the client may keep torch tensors)."""
    return a.cpu().numpy() if hasattr(a, "cpu") else np.asarray(a)


def plane_changes(client, old: dict | None, new: dict) -> dict:
    """Changed-entry fraction per plane between the planes sent before and now: values and scales of the
    quantized tensors, and the plain (bf16) tensors; None before the first update."""
    from mxq_client import changed_entries, entry_bytes  # noqa: PLC0415
    if not old:
        return {"values": None, "scales": None, "plain": None}
    counts = {"values": [0, 0], "scales": [0, 0], "plain": [0, 0]}
    for name, (fmt, _) in client.tensor_table().items():
        (ov, os_), (nv, ns) = map(_np, old[name]), map(_np, new[name])
        planes = [("plain", "values", ov, nv)] if ns.size == 0 else [("values", "values", ov, nv),
                                                                     ("scales", "scales", os_, ns)]
        for key, plane, a, b in planes:
            width = entry_bytes(fmt, plane)
            counts[key][0] += changed_entries(a, b, width).size
            counts[key][1] += a.size // width
    return {k: (c / t if t else 0.0) for k, (c, t) in counts.items()}


def push(client, trainer) -> dict:
    """One weight update; returns its log record. The client verifies every checksum itself (MxqError on a
    mismatch); the server then compares the kept planes' checksums on its side too."""
    from mxq_client import MxqError, canonical_checksum  # noqa: PLC0415
    old = getattr(client, "_planes", None)  # note: the client's kept planes; saves quantizing twice
    old = dict(old) if old else None
    sd = trainer.export()
    t0 = time.perf_counter()
    try:
        client.update_weights(sd)
    except MxqError as e:
        return {"ok": False, "error": str(e), "wall_s": time.perf_counter() - t0}
    wall = time.perf_counter() - t0
    new = getattr(client, "_planes", None) or client.planes(sd)
    verdict = client.compare_checksums({k: canonical_checksum(_np(v), _np(s)) for k, (v, s) in new.items()})
    lu = client.last_update
    return {"ok": True, "version": lu["version"], "delta_bytes": lu["delta_bytes"],
            "applied_bytes": lu.get("applied_bytes"), "server_s": lu.get("seconds"),
            "client_s": lu.get("client_seconds"), "wall_s": wall, "anchors": lu["anchors"],
            "sparse": lu["sparse"], "anchor": lu["sparse"] == 0, "changed": plane_changes(client, old, new),
            "checksum": {"client_verified": True, "server_match": bool(verdict.get("match")),
                         "mismatches": len(verdict.get("mismatches") or []), "tensors": len(new)}}


def evaluate(roll, words: list[str], max_tokens: int) -> dict:
    if not words:
        return {}
    resp = roll.complete([task.prompt(w) for w in words], n=1, max_tokens=max_tokens, temperature=0.0, seed=0)
    scores = [task.reward(w, s["text"]) for w, s in zip(words, engine.samples_of(resp, 1))]
    return {"prompts": len(words), "greedy_reward": float(np.mean([r for r, _ in scores])),
            "greedy_pass": float(np.mean([p for _, p in scores]))}


def run(args) -> int:
    t_start = time.monotonic()
    os.makedirs(args.out, exist_ok=True)
    from mxq_client import Client  # noqa: PLC0415
    rng = random.Random(args.seed)
    tok, eos = load_tokenizer(args.model), eos_id(args.model)
    trainer = make_trainer(args.trainer, args.model, args.device, args.seed)
    log = {"config": {**vars(args), "trainer": trainer.name, "python": sys.version.split()[0]}, "steps": []}
    log_path = os.path.join(args.out, "log.json")

    def save_log():
        with open(log_path + ".tmp", "w") as f:
            json.dump(log, f, indent=1)
        os.replace(log_path + ".tmp", log_path)

    # 1. SFT warm-up, then the checkpoint the engine starts from
    t0 = time.monotonic()
    trainer.start(args.sft_lr)
    losses = []
    for i in range(args.sft_steps):
        losses.append(trainer.sft_step(task.sft_pairs(tok, eos, rng, args.sft_batch, args.min_len, args.max_len)))
        if (i + 1) % 25 == 0 or i + 1 == args.sft_steps:
            print(f"sft {i + 1}/{args.sft_steps}: loss {np.mean(losses[-25:]):.3f}", flush=True)
    ckpt = os.path.join(args.out, "sft_checkpoint")
    trainer.save(ckpt, args.model)
    log["sft"] = {"steps": args.sft_steps, "seconds": time.monotonic() - t0, "loss_first": losses[:1],
                  "loss_last": float(np.mean(losses[-10:])) if losses else None, "checkpoint": ckpt}

    # 2. the engine, on the same weights
    server = None
    if args.server:
        url = args.server
    else:
        extra = ["--gpu-memory-utilization", str(args.gpu_memory_utilization)] if args.device == "cuda" else []
        server = engine.Server(args.mxq, ckpt, device=args.device, quantization=args.quantization,
                               log_path=os.path.join(args.out, "serve.log"), extra=extra)
        url = server.url
        log["serve"] = {"args": server.args, "startup_s": server.startup_s}
    try:
        client = Client(url, api_key=args.api_key, anchor_every=args.anchor_every)
        roll = engine.Rollouts(url, api_key=args.api_key)
        log["config"]["transport"] = roll.transport
        loaded = client.checksums()
        first = push(client, trainer)  # an anchor; of identical weights when we started the server on ckpt
        first["identical_to_loaded"] = client.checksums() == loaded
        log["initial_update"] = first
        if not first["ok"]:
            raise SystemExit(f"initial update failed: {first['error']}")
        eval_words = [task.random_word(random.Random(10_000 + i), args.min_len, args.max_len)
                      for i in range(args.eval_prompts)]
        log["eval_before"] = evaluate(roll, eval_words, args.max_tokens)
        save_log()
        print(f"engine at {url}; initial anchor {first['delta_bytes']} bytes, identical to the loaded weights: "
              f"{first['identical_to_loaded']}; greedy before: {log['eval_before']}", flush=True)
        trainer.start(args.lr)  # a fresh optimizer for GRPO: SFT's moments and learning rate do not carry over
        step_s = 0.0
        for step in range(1, args.steps + 1):
            elapsed = time.monotonic() - t_start
            if args.time_budget and elapsed + 2 * step_s + 10 > args.time_budget:
                log["stopped_early"] = f"time budget {args.time_budget:.0f} s: stopped before step {step}"
                print(log["stopped_early"], flush=True)
                break
            t_step = time.monotonic()
            rec = one_step(args, step, rng, roll, trainer, client)
            step_s = time.monotonic() - t_step
            rec["elapsed_s"] = time.monotonic() - t_start
            log["steps"].append(rec)
            save_log()
            u = rec["update"]
            print(describe(rec), flush=True)
            if not u["ok"]:
                break
        log["eval_after"] = evaluate(roll, eval_words, args.max_tokens)
    finally:
        if server is not None:
            log.setdefault("serve", {})["exit_code"] = server.stop()
    log["summary"] = summarize(log, time.monotonic() - t_start)
    save_log()
    png = os.path.join(args.out, "run.png")
    if log["steps"] and plot.plot(log, png):
        print(f"wrote {png}")
    print(f"wrote {log_path}\nsummary: {json.dumps(log['summary'])}")
    s = log["summary"]
    if not s["all_updates_verified"]:
        print("FAILED: an update failed or a checksum did not match", file=sys.stderr)
        return 1
    if args.require_rise and not s["reward_rose"]:
        print("FAILED: the reward did not rise over the run (--require-rise)", file=sys.stderr)
        return 1
    return 0


def one_step(args, step: int, rng: random.Random, roll, trainer, client) -> dict:
    words = [task.random_word(rng, args.min_len, args.max_len) for _ in range(args.prompts)]
    t0 = time.perf_counter()
    resp = roll.complete([task.prompt(w) for w in words], n=args.n, max_tokens=args.max_tokens,
                         temperature=args.temperature, seed=args.seed * 1_000_003 + step * 1_000)
    rollout_s = time.perf_counter() - t0
    samples = engine.samples_of(resp, args.n)
    scores = [task.reward(words[s["prompt"]], s["text"]) for s in samples]
    rewards = np.array([r for r, _ in scores])
    adv = group_advantages(rewards, args.n)
    t0 = time.perf_counter()
    trainer_lps = trainer.grpo_step([(s["prompt_ids"], s["ids"]) for s in samples], adv.tolist())
    train_s = time.perf_counter() - t0
    update = push(client, trainer)
    return {"step": step, "rollout_weight_version": resp.get("weight_version"),
            "reward_mean": float(rewards.mean()), "pass_rate": float(np.mean([p for _, p in scores])),
            "completion_tokens": int(sum(len(s["ids"]) for s in samples)),
            "stopped_frac": float(np.mean([s["finish"] == "stop" for s in samples])),
            "groups_with_signal": float(np.mean(rewards.reshape(-1, args.n).std(axis=1) > 1e-6)),
            "rollout_s": rollout_s, "train_s": train_s,
            "gap": logprob_gap(trainer_lps, [s["engine_lp"] for s in samples]),
            "update": update, "example": {"word": words[0], "completion": samples[0]["text"]}}


def describe(rec: dict) -> str:
    """One console line per step."""
    u, g = rec["update"], rec["gap"]
    head = (f"step {rec['step']}: reward {rec['reward_mean']:.3f} pass {rec['pass_rate']:.2f} | rollout "
            f"{rec['rollout_s']:.2f} s | gap |d| {g['mean_abs']:.4f} k3 {g['kl_k3']:.2e} | ")
    if not u["ok"]:
        return head + f"update FAILED: {u['error']}"
    c = u["changed"]
    return head + (f"update {u['delta_bytes']} B {'anchor' if u['anchor'] else 'sparse'} in {u['wall_s']:.2f} s, "
                   f"values {c['values'] or 0:.4f} scales {c['scales'] or 0:.4f} changed, "
                   f"checksums {'ok' if u['checksum']['server_match'] else 'MISMATCH'}")


def summarize(log: dict, wall_s: float) -> dict:
    steps = log["steps"]
    updates = [log["initial_update"]] + [s["update"] for s in steps] if "initial_update" in log else []
    ok = bool(updates) and all(u["ok"] and u["checksum"]["server_match"] for u in updates)
    k = max(1, len(steps) // 4)
    first = float(np.mean([s["reward_mean"] for s in steps[:k]])) if steps else None
    last = float(np.mean([s["reward_mean"] for s in steps[-k:]])) if steps else None
    return {"wall_s": wall_s, "steps": len(steps), "updates": len(updates), "all_updates_verified": ok,
            "checksum_mismatches": sum(u.get("checksum", {}).get("mismatches", 0) for u in updates),
            "reward_first_quarter": first, "reward_last_quarter": last,
            "reward_rose": bool(steps) and last > first,
            "max_gap_mean_abs": max((s["gap"]["mean_abs"] for s in steps), default=None),
            "delta_bytes_total": sum(u.get("delta_bytes", 0) for u in updates),
            "eval_before": log.get("eval_before"), "eval_after": log.get("eval_after")}


if __name__ == "__main__":
    sys.exit(run(parse_args()))
