#!/usr/bin/env python3
"""Weight-update latency of `mxq serve`, end to end through the server, beside the in-process refit applier
(`mxq-bench refit`) and the trainer-side quantize + diff, in one run. Rows:

  (a) sparse deltas over HTTP (POST /update_weights_from_delta, localhost): the live planes are the client's own
      quantization of the served checkpoint (checked against the server's checksums first), a copy B has a
      fraction of the entries of every quantized plane changed to other valid bytes, and the deltas A -> B and
      B -> A alternate, each on the live version (median of --reps of each);
  (b) full updates over CUDA IPC from this process on the same GPU (POST /update_weights_from_tensor): the bf16
      source quantized by the engine, and the canonical planes quantized here (`quantize_on_trainer`); the
      buffer is packed once, each post is timed (plus one whole client call);
  (c) from disk (POST /update_weights_from_disk of the bf16 checkpoint directory);
  (d) the trainer side on its GPU: the whole --trainer-layers Qwen3-8B-shaped bf16 state dict quantized to MXFP8
      into one packed buffer (the client's fused torch quantizers) and diffed against the previous one (changed
      entries back on the host), against a device copy measured in the same run.

Goals printed beside the numbers: HTTP sparse 1% <= 1.5x the in-process sparse refit (wire path); IPC full
<= 1.2x the in-process full refit from device; trainer quantize + diff <= 20 ms for 8B.

  python3 tools/bench_update.py --mxq build/mxq --layers 8 --reps 5          # an H200: every row
  python3 tools/bench_update.py --device cpu --reps 3                       # no GPU: rows (a) and (c)
"""
import argparse
import datetime
import json
import os
import pathlib
import re
import shlex
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np

ROOT = pathlib.Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "python"))  # note: this tree's client, installed or not: the one being measured
import mxq_client as mc  # noqa: E402
from mxq_client import ipc  # noqa: E402

LISTEN_RE = re.compile(r"mxq serve: listening on http://([^\s:/]+):(\d+)")
# note: Qwen3-8B (tools/make_synthetic_qwen3.py): hidden 4096, 32 q / 8 kv heads of 128, intermediate 12288
LINEARS_8B = {"self_attn.q_proj": (4096, 4096), "self_attn.k_proj": (1024, 4096),
              "self_attn.v_proj": (1024, 4096), "self_attn.o_proj": (4096, 4096), "mlp.gate_proj": (12288, 4096),
              "mlp.up_proj": (12288, 4096), "mlp.down_proj": (4096, 12288)}
E4M3_VALID = np.array([c for c in range(256) if c & 0x7F != 0x7F], np.uint8)  # every code but the two NaNs


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--mxq", default=os.environ.get("MXQ_BIN", str(ROOT / "build" / "mxq")), help="the mxq binary")
    p.add_argument("--device", choices=["cuda", "cpu"], default="cuda")
    p.add_argument("--url", default=None, help="a running server to use (with --model, its checkpoint directory)")
    p.add_argument("--model", default=None, help="checkpoint directory (default: a synthetic Qwen3-8B-shaped one "
                                                 "of --layers layers on cuda, models/default on cpu)")
    p.add_argument("--layers", type=int, default=8, help="decoder layers of the served synthetic checkpoint")
    p.add_argument("--trainer-layers", type=int, default=36, help="layers of the row (d) state dict (8B: 36)")
    p.add_argument("--quantization", default="mxfp8", choices=["mxfp8", "mxfp4", "fp8-b128"])
    p.add_argument("--sparse", default="0.001,0.01", help="changed fractions of the entries, comma-separated")
    p.add_argument("--reps", type=int, default=5, help="timed repetitions per row (median)")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.3,
                   help="the server's share of the GPU (this process holds state dicts and buffers beside it)")
    p.add_argument("--no-refit", action="store_true", help="skip `mxq-bench refit`")
    p.add_argument("--no-trainer", action="store_true", help="skip row (d)")
    p.add_argument("--json", dest="json_out", default=None, help="write the rows as JSON to this file")
    return p.parse_args(argv)


def need_torch_cuda():
    try:
        import torch
    except ImportError:
        torch = None
    if torch is None or not torch.cuda.is_available():
        raise SystemExit("bench_update: --device cuda needs a CUDA GPU visible to this process and torch with "
                         "CUDA (the IPC rows share its memory with the server, row (d) runs on it); without one, "
                         "--device cpu measures the HTTP delta and disk rows on a small model")
    return torch


def median_ms(times):
    return 1e3 * statistics.median(times)


# ---- the server ------------------------------------------------------------------------------------------------
class Serve:
    """`mxq serve` started by the tool (stderr in a log file), or a --url given."""

    def __init__(self, a, model, log_dir):
        self.proc = None
        if a.url:
            self.url = a.url.rstrip("/")
            return
        cmd = [a.mxq, "serve", str(model), "--device", a.device, "--quantization", a.quantization, "--port", "0"]
        if a.device == "cuda":
            cmd += ["--gpu-memory-utilization", str(a.gpu_memory_utilization)]
        self.log = pathlib.Path(log_dir) / "serve.log"
        self.cmd = cmd
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=open(self.log, "wb"),
                                     stdin=subprocess.DEVNULL)
        deadline = time.monotonic() + 900  # note: an 8B-shaped checkpoint loads and quantizes in ~a minute
        while time.monotonic() < deadline:
            m = LISTEN_RE.search(self.log.read_text(errors="replace"))
            if m:
                self.url = f"http://{m.group(1)}:{m.group(2)}"
                return
            if self.proc.poll() is not None:
                raise SystemExit(f"bench_update: {shlex.join(cmd)} exited {self.proc.returncode}:\n"
                                 f"{self.log.read_text(errors='replace')[-2000:]}")
            time.sleep(0.1)
        self.stop()
        raise SystemExit(f"bench_update: {shlex.join(cmd)} did not listen within 900 s")

    def stop(self):
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def timed_post(c, path, body, content_type="application/json"):
    t0 = time.perf_counter()
    reply = c._request("POST", path, body, content_type)
    return time.perf_counter() - t0, reply


# ---- checkpoints -----------------------------------------------------------------------------------------------
def make_model(a, tmp):
    if a.model:
        return pathlib.Path(a.model)
    if a.device == "cpu":
        return ROOT / "models" / "default"
    out = pathlib.Path(tmp) / "q8b"
    subprocess.run([sys.executable, str(ROOT / "tools" / "make_synthetic_qwen3.py"), str(out), "--layers",
                    str(a.layers)], check=True)
    return out


def load_checkpoint(model, device):
    """{name: tensor} of the checkpoint: torch tensors on the GPU (cuda), numpy (bf16 as ml_dtypes) on cpu."""
    files = sorted(pathlib.Path(model).glob("*.safetensors"))
    sd = {}
    if device == "cuda":
        from safetensors.torch import load_file
        for f in files:
            sd.update(load_file(f, device="cuda"))
    else:
        import ml_dtypes
        np.bfloat16 = ml_dtypes.bfloat16  # note: safetensors' numpy backend looks bf16 up on numpy itself
        from safetensors.numpy import load_file
        for f in files:
            sd.update(load_file(f))
    return sd, sum(f.stat().st_size for f in files)


# ---- (a) sparse deltas -----------------------------------------------------------------------------------------
def perturb(planes, table, frac, rng):
    """B: `frac` of the entries of every quantized plane changed to other valid bytes (E4M3 never to a NaN code,
    E8M0 scales within 2^-9 .. 2^6, FP8-B128 scales doubled); plain tensors as they are."""
    out = {}
    for name, (fmt, _) in table.items():
        v, s = planes[name]
        if fmt not in mc.delta.FORMATS or mc.delta.FORMATS[fmt][3] == 0:
            out[name] = (v, s)
            continue
        v, s = v.copy(), s.copy()
        idx = np.unique(rng.integers(0, v.size, int(round(frac * v.size)) or 1))
        if fmt == "mxfp4":  # note: every byte is two valid E2M1 codes
            v[idx] = (v[idx].astype(np.int64) + rng.integers(1, 256, idx.size)) % 256
        else:
            pos = np.searchsorted(E4M3_VALID, v[idx])
            v[idx] = E4M3_VALID[(pos + rng.integers(1, E4M3_VALID.size, idx.size)) % E4M3_VALID.size]
        if fmt == "fp8-b128":
            f = s.view("<f4")
            k = np.unique(rng.integers(0, f.size, int(round(frac * f.size)) or 1))
            f[k] *= 2
        else:
            k = np.unique(rng.integers(0, s.size, int(round(frac * s.size)) or 1))
            s[k] = 118 + (s[k].astype(np.int64) - 118 + rng.integers(1, 16, k.size)) % 16
        out[name] = (v, s)
    return out


def delta_body(table, old, new):
    recs = [mc.diff_tensor(n, fmt, shape, old[n], new[n]) for n, (fmt, shape) in table.items()]
    entries = sum(r.values.indices.size + r.scales.indices.size for r in recs if not r.anchor)
    return mc.encode_body(mc.Delta(0, 1, recs)), entries, sum(r.anchor for r in recs)


def wire(body, base, new, level=3):
    """The delta file of `body` with its versions set: they are the body's first 16 bytes (refit-format.md §2),
    so the records are encoded once and only the header, hash and zstd frame (level 0: none) are redone."""
    import struct
    return mc.delta.wrap_body(struct.pack("<QQ", base, new) + body[16:], level)


def stage_medians(replies):
    """Median milliseconds per stage over the server's answers (`stages_ms`, [[stage, ms], ...] in order)."""
    per = {}
    for r in replies:
        for name, ms in r.get("stages_ms", []):
            per.setdefault(name, []).append(float(ms))
    return {name: statistics.median(v) for name, v in per.items()}


# The ways a delta reaches the server: the HTTP body zstd-3 or raw (flags bit 0), or a raw file in a directory
# the server reads (/dev/shm) posted as {"path"}: the file's write is timed with the post.
TRANSPORTS = [("zstd-3 body", 3, False), ("raw body", 0, False), ("raw file in /dev/shm, posted as path", 0, True)]


def bench_sparse(a, c, table, planes_a, rows):
    plane_bytes = sum(v.size + s.size for v, s in planes_a.values())
    rng = np.random.default_rng(1)
    shm = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()
    for frac in [float(x) for x in a.sparse.split(",") if x]:
        planes_b = perturb(planes_a, table, frac, rng)
        fwd, entries, anchors = delta_body(table, planes_a, planes_b)
        back, _, _ = delta_body(table, planes_b, planes_a)
        label = f"{100 * frac:g}%"
        for how, level, as_path in TRANSPORTS:
            times, server_s, sizes, replies = [], [], [], []
            for _ in range(a.reps):
                for body in (fwd, back):
                    live = c.weight_version()
                    blob = wire(body, live, live + 1, level)
                    sizes.append(len(blob))
                    if as_path:
                        path = os.path.join(shm, f"mxq-bench-{os.getpid()}.mxqd")
                        t0 = time.perf_counter()
                        with open(path, "wb") as f:
                            f.write(blob)
                        dt, reply = timed_post(c, "/update_weights_from_delta", json.dumps({"path": path}).encode())
                        dt = time.perf_counter() - t0
                        os.unlink(path)
                    else:
                        dt, reply = timed_post(c, "/update_weights_from_delta", blob, "application/octet-stream")
                    if not reply.get("success", False):
                        raise SystemExit(f"bench_update: sparse {label} ({how}) refused: {reply.get('message')}")
                    times.append(dt)
                    server_s.append(float(reply.get("seconds", "nan")))
                    replies.append(reply)
            rows.append({"what": f"HTTP sparse delta {label}, {how} ({entries:,} entries, "
                                 f"{statistics.median(sizes) / 1e6:.2f} MB file{f', {anchors} anchors' if anchors else ''})",
                         "ms": median_ms(times), "gbs": plane_bytes / statistics.median(times) / 1e9,
                         "server_ms": 1e3 * statistics.median(server_s), "stages": stage_medians(replies),
                         "key": f"http_sparse_{label}" + ("" if level else "_raw") + ("_path" if as_path else ""),
                         "peer": f"uniform {label} [wire, pageable body, incr]"})


# ---- (b) CUDA IPC ----------------------------------------------------------------------------------------------
def bench_ipc(a, c, table, sd, rows):
    torch = need_torch_cuda()
    for on_trainer in (False, True):
        what = "canonical planes quantized here" if on_trainer else "bf16 source quantized by the engine"
        t0 = time.perf_counter()
        buf, tensors, planes = ipc.pack_state_dict(sd, table, quantize_on_trainer=on_trainer, fused=True)
        if on_trainer:
            for t in tensors:
                v, s = planes[t["name"]]
                t["checksum"] = f"{mc.canonical_checksum(v.cpu().numpy(), s.cpu().numpy()):016x}"
        torch.cuda.synchronize()
        pack_s = time.perf_counter() - t0
        handle, offset, counter = ipc.ipc_handle(buf)
        times, server_s, err, replies = [], [], None, []
        try:
            for _ in range(a.reps):
                body = {"ipc_handle": ipc.encode_handle(handle), "ipc_offset": offset, "size": int(buf.numel()),
                        "tensors": tensors, "weight_version": str(c.weight_version() + 1), "flush_cache": True}
                dt, reply = timed_post(c, "/update_weights_from_tensor", body)
                times.append(dt)
                server_s.append(float(reply.get("seconds", "nan")))
                replies.append(reply)
        except mc.MxqError as e:
            err = str(e)
        finally:
            ipc.release_ipc_counter(counter)
        live_gb = sum(sum(mc.plane_geometry(f, tuple(sh))) for f, sh in table.values()) / 1e9
        row = {"what": f"IPC full update, {what} ({buf.numel() / 1e9:.2f} GB buffer; packed in "
                       f"{pack_s * 1e3:.0f} ms, not timed)", "key": f"ipc_full_{'trainer' if on_trainer else 'engine'}",
               "peer": FULL_REFIT, "live_gb": live_gb}
        if err:
            row.update(error=err)
        else:
            row.update(ms=median_ms(times), gbs=buf.numel() / statistics.median(times) / 1e9,
                       server_ms=1e3 * statistics.median(server_s), stages=stage_medians(replies))
        rows.append(row)
        del buf, planes
        if err:
            return
    t0 = time.perf_counter()
    try:
        c.update_weights_from_tensor(sd, quantize_on_trainer=False, fused=True)
        rows.append({"what": "IPC full update, one whole client call (pack + post; engine quantizes)",
                     "ms": 1e3 * (time.perf_counter() - t0), "key": "ipc_client_call"})
    except mc.MxqError as e:
        rows.append({"what": "IPC full update, one whole client call", "error": str(e), "key": "ipc_client_call"})


# ---- (c) from disk ---------------------------------------------------------------------------------------------
def bench_disk(a, c, model, ckpt_bytes, rows):
    times = []
    # note: seconds per update (the host reads and quantizes the checkpoint): two reps are enough for its median
    for _ in range(min(a.reps, 2)):
        dt, _ = timed_post(c, "/update_weights_from_disk", {"model_path": str(pathlib.Path(model).resolve())})
        times.append(dt)
    rows.append({"what": f"from disk, bf16 checkpoint quantized by the engine ({ckpt_bytes / 1e9:.2f} GB files, "
                         f"{len(times)} reps)",
                 "ms": median_ms(times), "gbs": ckpt_bytes / statistics.median(times) / 1e9, "key": "disk"})


# ---- (d) the trainer side --------------------------------------------------------------------------------------
def bench_trainer(a, rows, dev="cuda", linears=LINEARS_8B, copy_bytes=1 << 32):
    """Row (d). `dev`, `linears`, `copy_bytes`: the smoke test's CPU run of the same code on small shapes."""
    torch = need_torch_cuda() if dev == "cuda" else __import__("torch")
    sync = torch.cuda.synchronize if dev == "cuda" else (lambda: None)
    fmt = a.quantization
    g = torch.Generator(device=dev).manual_seed(0)
    table, sd = {}, {}
    for layer in range(a.trainer_layers):
        for proj, shape in linears.items():
            name = f"model.layers.{layer}.{proj}.weight"
            table[name] = (fmt, shape)
            sd[name] = (torch.randn(*shape, generator=g, device=dev) * shape[1] ** -0.5).bfloat16()
    src_bytes = sum(t.numel() * 2 for t in sd.values())
    # B: one optimizer step's worth: 1% of the elements moved by a relative 1e-2 (a few E4M3 bytes each block)
    sd_b = {}
    for n, t in sd.items():
        hit = torch.rand(t.shape, generator=g, device=dev) < 0.01
        sd_b[n] = torch.where(hit, t * 1.01, t)

    def sync_ms(fn, reps):
        times, out = [], None
        for _ in range(reps):
            # note: the last rep's result is dropped first, as a trainer drops a step's delta once it is sent:
            # held, its pinned host blocks cannot be reused and the next diff allocates new ones (cudaHostAlloc,
            # about 50 ms for 43 MB; bench/study/diff_profile.py measured 10.7 ms with reuse, 62 ms without)
            out = None
            sync()
            t0 = time.perf_counter()
            out = fn()
            sync()
            times.append(time.perf_counter() - t0)
        return median_ms(times), out

    # the device copy ceiling: one 4 GiB D2D copy (bytes read + written)
    x = torch.empty(copy_bytes, dtype=torch.uint8, device=dev)
    y = torch.empty_like(x)
    copy_ms, _ = sync_ms(lambda: y.copy_(x), max(3, a.reps))
    copy_gbs = 2 * x.numel() / copy_ms / 1e6
    del x, y
    fused = dev == "cuda"  # note: torch.compile on the CPU takes minutes (C++ builds); the smoke test runs eager
    pack = lambda s: ipc.pack_state_dict(s, table, quantize_on_trainer=True, fused=fused)  # noqa: E731
    t0 = time.perf_counter()
    old, tensors, _ = pack(sd)  # note: compiles the fused steps once per shape (not timed)
    compile_s = time.perf_counter() - t0
    quant_ms, (new, _, _) = sync_ms(lambda: pack(sd_b), a.reps)
    diff_ms, changed = sync_ms(lambda: ipc.diff_packed(old, new, tensors), a.reps)

    # note: a trainer's parameters keep their storage across steps, so the whole packing can be one CUDA graph
    # (ipc.Packer(graph=True)): one replay instead of a Python loop over ~250 tensors
    graph_ms, graph_err = None, None
    if fused:
        try:
            packer = ipc.Packer(sd_b, table, quantize_on_trainer=True, fused=True, graph=True)
            graph_ms, _ = sync_ms(packer.pack, a.reps)
            if not torch.equal(packer.buffer, new):
                graph_err = "the graph replay's buffer differs from the eager packing's"
        except Exception as e:  # noqa: BLE001  (reported in the table; the other rows stand)
            graph_err = f"{type(e).__name__}: {e}"

    def both():
        buf = packer.pack() if graph_ms is not None and not graph_err else pack(sd_b)[0]
        return ipc.diff_packed(old, buf, tensors)
    total_ms, changed = sync_ms(both, a.reps)
    entries = sum(p[0].size for planes in changed.values() for p in planes.values())
    eager_ms, _ = sync_ms(lambda: ipc.pack_state_dict(sd_b, table, quantize_on_trainer=True, fused=False), 1)
    gb = src_bytes / 1e9
    label = f"{a.trainer_layers} layers x {len(linears)} Qwen3-8B linears, {gb:.1f} GB bf16 -> {fmt}"
    rows.append({"what": f"device copy, {copy_bytes / 2**30:g} GiB (read + written)", "ms": copy_ms, "gbs": copy_gbs,
                 "key": "copy"})
    how = "graph replay" if graph_ms is not None and not graph_err else "fused"
    for key, what, ms in (("trainer_quantize_eager", "trainer quantize, eager torch ops (1 rep)", eager_ms),
                          ("trainer_quantize", "trainer quantize, fused (torch.compile), into one buffer", quant_ms),
                          ("trainer_quantize_graph", "trainer quantize, fused, the whole packing one CUDA graph "
                                                     "replay", graph_ms),
                          ("trainer_diff", "trainer diff of two packed buffers, changed entries to host", diff_ms),
                          ("trainer_total", f"trainer quantize ({how}) + diff ({entries:,} changed entries)",
                           total_ms)):
        row = {"what": f"{what} [{label}]", "key": key}
        if key == "trainer_quantize_graph" and (graph_err or ms is None):
            row["error"] = graph_err or "needs CUDA and the fused quantizers"
        else:
            row.update(ms=ms, gbs=gb / (ms * 1e-3), pct_copy=100 * gb / (ms * 1e-3) / copy_gbs)
        rows.append(row)
    rows[-1]["note"] = f"fused steps compiled in {compile_s:.1f} s (first pack)"


# note: the in-process peer of a full update of every served tensor: the linears plus the bf16 embed_tokens and
# lm_head (whose XXH3 chains bound it), the live planes re-read for their checksums as the IPC route does
FULL_SERVED_REREAD = "full refit + embeddings, checksum re-read from live"
FULL_REFIT = "full refit from device (staged tiles, fused sums)"


# ---- mxq-bench refit -------------------------------------------------------------------------------------------
def run_refit(a):
    bench = os.path.join(os.path.dirname(a.mxq), "mxq-bench")  # the benchmarks' binary, beside mxq
    cmd = [bench, "refit", "--layers", str(a.layers), "--reps", str(a.reps), "--sparse", a.sparse,
           "--embeddings"]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=900)
    if p.returncode:
        return {}, f"{shlex.join(cmd)} exited {p.returncode}: {(p.stderr or p.stdout).strip()[-500:]}"
    found = {}
    m = re.search(r"([\d.]+) GB \(values \+ scales\)", p.stdout)
    if m:
        found["_gb"] = float(m.group(1))  # note: the bytes its full refit writes, to scale the IPC peers
    for line in p.stdout.splitlines():
        for label in ["full refit from device (staged tiles, fused sums)", FULL_SERVED_REREAD,
                      "full refit + embeddings (fused sums)"] + [
                f"uniform {100 * float(f):g}% [{k}]" for f in a.sparse.split(",") if f
                for k in ("incr", "full", "wire, pinned body, incr", "wire, pageable body, incr")]:
            if line.startswith(label):
                found[label] = float(line[len(label):].split()[0])
    return found, p.stdout


# ---- the table -------------------------------------------------------------------------------------------------
GOALS = {"http_sparse_1%": 1.5, "http_sparse_1%_raw": 1.5, "http_sparse_1%_raw_path": 1.5, "ipc_full_engine": 1.2, "ipc_full_trainer": 1.2}


def verdict(row, refit):
    if "error" in row:
        return "failed: " + row["error"][:200]
    if row["key"] == "trainer_total":
        goal = 20.0 * (a_layers_scale(row))
        return f"goal <= {goal:.1f} ms: {'met' if row['ms'] <= goal else 'MISSED'}; {row['pct_copy']:.1f}% of copy"
    if "pct_copy" in row:
        return f"{row['pct_copy']:.1f}% of copy"
    if row.get("peer") == FULL_REFIT and FULL_SERVED_REREAD in refit:
        row["peer"] = FULL_SERVED_REREAD
    peer = refit.get(row.get("peer", ""))
    if peer is None:
        return server_part(row) or "-"
    scaled = ""
    if "live_gb" in row and refit.get("_gb") and row["peer"] == FULL_REFIT:
        # note: the served table adds embeddings and lm_head to the linears the applier benchmark holds: its
        # full refit time scaled to the live planes' bytes is the peer
        peer, scaled = peer * row["live_gb"] / refit["_gb"], f", scaled to {row['live_gb']:.2f} GB of live planes"
    ratio = row["ms"] / peer
    out = f"{ratio:.2f}x in-process `{row['peer']}` ({peer:.2f} ms{scaled})"
    if row["key"] in GOALS:
        out += f"; goal <= {GOALS[row['key']]}x: {'met' if ratio <= GOALS[row['key']] else 'MISSED'}"
    return out + "; " + server_part(row) if server_part(row) else out


def server_part(row):
    """The server's own seconds and its stages (stages_ms medians), or ""."""
    out = f"server's own seconds {row['server_ms']:.2f} ms" if "server_ms" in row else ""
    if row.get("stages"):
        out += " (" + ", ".join(f"{k} {v:.2f}" for k, v in row["stages"].items()) + " ms)"
    return out


def a_layers_scale(row):
    # note: the 20 ms goal is for the whole 8B (36 layers); a run with fewer layers is held to its share
    m = re.search(r"\[(\d+) layers", row["what"])
    return int(m.group(1)) / 36 if m else 1.0


def print_table(a, rows, refit, device, argv):
    print(f"bench_update: `python3 tools/bench_update.py {shlex.join(argv)}`, "
          f"{datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC, {device}, commit {commit()}")
    print()
    print("| what | ms | GB/s | vs peer / goal |")
    print("|---|---|---|---|")
    for label, ms in refit.items():
        if label.startswith("_"):
            continue
        print(f"| in-process `mxq-bench refit --layers {a.layers}`: {label} | {ms:.2f} | - | - |")
    for r in rows:
        ms = f"{r['ms']:.2f}" if "ms" in r else "-"
        gbs = f"{r['gbs']:.1f}" if "gbs" in r else "-"
        print(f"| {r['what']} | {ms} | {gbs} | {verdict(r, refit)} |")
    notes = [r["note"] for r in rows if "note" in r]
    for n in notes:
        print(f"\nnote: {n}")
    print("\nGB/s: HTTP rows plane bytes of the model / time; IPC rows buffer bytes / time; disk rows checkpoint "
          "bytes / time; trainer rows bf16 bytes read / time. The in-process refit holds the linears alone "
          "(7 per layer); the server's table adds embeddings, norms and lm_head (unchanged in the sparse rows).")


def commit():
    try:
        return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                              text=True, timeout=10).stdout.strip() or "?"
    except OSError:
        return "?"


def main(argv=None):
    argv = list(sys.argv[1:] if argv is None else argv)
    a = parse_args(argv)
    if a.reps < 1:
        raise SystemExit("bench_update: --reps must be at least 1")
    device = "cpu (HTTP delta and disk rows only; IPC, refit and trainer rows need a CUDA GPU)"
    if a.device == "cuda":
        torch = need_torch_cuda()
        device = torch.cuda.get_device_name()
    rows, refit, refit_log = [], {}, ""
    with tempfile.TemporaryDirectory(prefix="bench_update_") as tmp:
        model = make_model(a, tmp)
        if a.device == "cuda" and not a.no_refit:
            # note: before the server starts: the applier benchmark gets the GPU to itself
            refit, refit_log = run_refit(a)
            if not refit:
                rows.append({"what": "in-process `mxq-bench refit`", "error": refit_log, "key": "refit"})
        serve = Serve(a, model, tmp)
        try:
            c = mc.Client(serve.url)
            table = c.tensor_table()
            sd, ckpt_bytes = load_checkpoint(model, a.device)
            planes_a = c.planes(sd)
            want = {n: mc.canonical_checksum(*p) for n, p in planes_a.items()}
            have = c.checksums()
            bad = sorted(n for n in want if have.get(n) != want[n])
            if bad:
                raise SystemExit(f"bench_update: the client's quantization of {model} differs from the live "
                                 f"weights in {len(bad)} tensors ({bad[:3]}); the sparse rows need the live planes")
            bench_sparse(a, c, table, planes_a, rows)
            del planes_a
            if a.device == "cuda":
                bench_ipc(a, c, table, sd, rows)
            bench_disk(a, c, model, ckpt_bytes, rows)
            del sd
        finally:
            serve.stop()
    if a.device == "cuda" and not a.no_trainer:
        bench_trainer(a, rows)  # note: after the server stopped: the whole GPU for the 8B-shaped state dicts
    print_table(a, rows, refit, device, argv)
    if a.json_out:
        with open(a.json_out, "w") as f:
            json.dump({"argv": argv, "device": device, "commit": commit(), "refit": refit, "rows": rows,
                       "refit_log": refit_log}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
