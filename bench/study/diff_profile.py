"""Where the trainer diff's time goes: `mxq_client.ipc.diff_packed` on the row (d) state of tools/bench_update.py
(36 layers x 7 Qwen3-8B linears, MXFP8, 1% of the elements moved by 1e-2), under torch.profiler. Prints the wall
time per call, then the kernels and host calls by device time, so a change to the diff can be aimed at its bound.

Usage (GPU machine, the repo root): PYTHONPATH=python python3 bench/study/diff_profile.py [--layers 36] [--reps 3]
"""
import argparse
import sys
import time

sys.path.insert(0, "tools")
from bench_update import LINEARS_8B  # noqa: E402

from mxq_client import ipc  # noqa: E402


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--layers", type=int, default=36)
    p.add_argument("--reps", type=int, default=3)
    p.add_argument("--quantization", default="mxfp8")
    a = p.parse_args()
    import torch  # noqa: PLC0415
    g = torch.Generator(device="cuda").manual_seed(0)
    table, sd, sd_b = {}, {}, {}
    for layer in range(a.layers):
        for proj, shape in LINEARS_8B.items():
            name = f"model.layers.{layer}.{proj}.weight"
            table[name] = (a.quantization, shape)
            t = (torch.randn(*shape, generator=g, device="cuda") * shape[1] ** -0.5).bfloat16()
            hit = torch.rand(t.shape, generator=g, device="cuda") < 0.01
            sd[name], sd_b[name] = t, torch.where(hit, t * 1.01, t)
    old, tensors, _ = ipc.pack_state_dict(sd, table, quantize_on_trainer=True, fused=True)
    new, _, _ = ipc.pack_state_dict(sd_b, table, quantize_on_trainer=True, fused=True)
    del sd, sd_b
    ipc.diff_packed(old, new, tensors)  # note: warm-up (pinned host blocks, kernels loaded)
    for _ in range(a.reps):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = ipc.diff_packed(old, new, tensors)
        torch.cuda.synchronize()
        ms = (time.perf_counter() - t0) * 1e3
        n = sum(v[0].size for planes in out.values() for v in planes.values())
        print(f"diff_packed: {ms:.2f} ms wall, {n:,} changed entries, {old.numel() / 1e9:.2f} GB per buffer")
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        ipc.diff_packed(old, new, tensors)
        torch.cuda.synchronize()
    print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=25))
    print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=15))


if __name__ == "__main__":
    main()
