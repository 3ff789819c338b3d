"""Plots a run's JSON log: reward (mean and pass rate) and update size per step.

    python3 examples/rl/plot.py OUT/rl/log.json [OUT/rl/run.png]
"""

from __future__ import annotations

import json
import sys


def plot(log: dict, path: str) -> bool:
    """Writes the PNG; False (with a message) when matplotlib is missing."""
    try:
        import matplotlib  # noqa: PLC0415

        matplotlib.use("Agg")  # note: no display on the GPU machine or in CI
        import matplotlib.pyplot as plt  # noqa: PLC0415
    except ImportError:
        print("plot: matplotlib is not installed; skipping the PNG (the JSON log has every number)")
        return False
    steps = log["steps"]
    x = [s["step"] for s in steps]
    fig, (ax1, ax2) = plt.subplots(2, 1, figsize=(8, 6.5), sharex=True)
    ax1.plot(x, [s["reward_mean"] for s in steps], label="reward (LCS ratio, mean)")
    ax1.plot(x, [s["pass_rate"] for s in steps], label="pass rate (exact)")
    ax1.set_ylim(0, 1.02)
    ax1.set_ylabel("reward")
    ax1.legend(loc="lower right")
    cfg = log["config"]
    ax1.set_title(f"GRPO reverse-text: {cfg['trainer']} trainer, mxq serve {cfg['quantization']} on "
                  f"{cfg['device']}, {cfg['prompts']} prompts x n={cfg['n']}")
    kib = [s["update"]["delta_bytes"] / 1024 for s in steps]
    anchor = [s["update"]["anchor"] for s in steps]
    ax2.bar(x, kib, color=["tab:red" if a else "tab:blue" for a in anchor])
    ax2.set_yscale("log")
    ax2.set_ylabel("delta sent (KiB, log)")
    ax2.set_xlabel("step (red: anchor, blue: sparse delta)")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return True


if __name__ == "__main__":
    if len(sys.argv) not in (2, 3):
        raise SystemExit(__doc__)
    src = sys.argv[1]
    with open(src) as f:
        data = json.load(f)
    dst = sys.argv[2] if len(sys.argv) == 3 else src.rsplit(".", 1)[0] + ".png"
    if plot(data, dst):
        print(f"wrote {dst}")
