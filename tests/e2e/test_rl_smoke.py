"""The RL example (examples/rl, issue 21) on the CPU with its numpy trainer: SFT, `mxq serve` on the SFT'd
checkpoint, GRPO steps whose weights go back to the server as sparse deltas through mxq_client, every update's
checksums verified; and the numpy Qwen3 the trainer runs, against the engine and against finite differences.
The full run (torch trainer, GPU) is examples/rl/README.md's command on the GPU machine."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from serve_fixtures import DEFAULT_MODEL, MXQ, ROOT

RL = ROOT / "examples" / "rl"
sys.path.insert(0, str(RL))
import qwen3_numpy as qn  # noqa: E402

# note: the gap is mean |log pi_trainer - log mu_engine| over the engine's sampled tokens, the trainer holding
# f32 master weights. Against the bf16 engine (--quantization none) only rounding the masters to bf16 and the
# order of f32 sums differ: 0.002-0.003 measured on this model. MXFP8 adds E4M3's rounding of every projection
# weight (3 mantissa bits: up to 2^-4 relative per weight): 0.04-0.06 measured on the base model's own samples
# (high-entropy Python, where logprobs move most; 0.005-0.02 on the GPU run's on-task samples). A wrong forward
# moves it by O(1) (measured against transformers: no RoPE 1.07, q_norm weight ignored 0.74, rope_theta 1e6
# 0.44), so bounds of ~3-7x the measured gaps separate a correct forward from a broken one.
GAP_BF16 = 0.02
GAP_MXFP8 = 0.15


def run_example(out, *args, timeout=120):
    # note: the CPU engine and the numpy trainer share 2 cores in CI; one BLAS thread is faster for [20, 384]
    env = dict(os.environ, OPENBLAS_NUM_THREADS="1", OMP_NUM_THREADS="1")
    cmd = [sys.executable, str(RL / "grpo_reverse.py"), "--mxq", str(MXQ), "--model", str(DEFAULT_MODEL),
           "--device", "cpu", "--trainer", "numpy", "--out", str(out), "--prompts", "2", "--n", "4",
           "--max-tokens", "8", "--time-budget", "0", *map(str, args)]
    p = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=str(ROOT))
    assert p.returncode == 0, f"{' '.join(cmd)} exited {p.returncode}:\n{p.stdout[-3000:]}\n{p.stderr[-3000:]}"
    with open(out / "log.json") as f:
        return json.load(f), p.stdout


def test_grpo_smoke_every_update_verified(tmp_path):
    out = tmp_path / "rl"
    log, stdout = run_example(out, "--sft-steps", 2, "--sft-batch", 4, "--steps", 3, "--anchor-every", 5,
                              "--eval-prompts", 2, "--lr", 1e-3)
    steps, first = log["steps"], log["initial_update"]
    assert len(steps) == 3, stdout
    # the engine was started on the SFT'd checkpoint: the first update is an anchor of the same bytes
    assert first["ok"] and first["anchor"] and first["identical_to_loaded"], first
    assert (out / "sft_checkpoint" / "model.safetensors.index.json").exists()
    for s in steps:
        u = s["update"]
        assert u["ok"], u
        assert u["checksum"] == {"client_verified": True, "server_match": True, "mismatches": 0,
                                 "tensors": u["checksum"]["tensors"]}, u
        # anchor_every 5: no forced anchor in 3 steps; the unchanged tensors and most moved ones go sparse
        assert not u["anchor"] and u["sparse"] > u["anchors"], u
        # the numpy trainer moves the last MLP and the final norm only: a few % of the values change
        assert 0 < u["changed"]["values"] < 0.2 and 0 <= u["changed"]["scales"] <= u["changed"]["values"], u
        assert 0 < u["delta_bytes"] < first["delta_bytes"] / 4, u
        assert int(s["rollout_weight_version"]) == u["version"] - 1, s  # sampled by the weights just sent
        assert s["gap"]["tokens"] == s["completion_tokens"] > 0
        # covers W-24: after each update, the engine's logprobs of its own samples against the trainer's
        # reference forward on the weights just sent stay within the bound (a broken update moves them by O(1))
        assert s["gap"]["mean_abs"] < GAP_MXFP8 and s["gap"]["kl_k3"] >= 0, s["gap"]
        assert 0 <= s["reward_mean"] <= 1 and 0 <= s["pass_rate"] <= 1
    summary = log["summary"]
    assert summary["all_updates_verified"] and summary["checksum_mismatches"] == 0, summary
    assert summary["updates"] == 4 and log["serve"]["exit_code"] == 0
    assert log["config"]["quantization"] == "mxfp8" and log["config"]["trainer"] == "numpy"
    # the PNG where matplotlib is installed, else the message saying it was skipped
    assert (out / "run.png").exists() or "skipping the PNG" in stdout, stdout


def test_numpy_forward_matches_the_bf16_engine(tmp_path):
    log, _ = run_example(tmp_path / "rl", "--quantization", "none", "--sft-steps", 0, "--steps", 1,
                         "--eval-prompts", 0)
    gap = log["steps"][0]["gap"]
    assert gap["mean_abs"] < GAP_BF16 and gap["max_abs"] < 10 * GAP_BF16, gap


def tiny_model(rng):
    cfg = qn.Config(hidden=32, layers=2, heads=4, kv_heads=2, head_dim=8, intermediate=48, eps=1e-6,
                    rope_theta=10000.0, vocab=40, tied=True)
    shapes = {"model.embed_tokens.weight": (cfg.vocab, cfg.hidden), "model.norm.weight": (cfg.hidden,)}
    for i in range(cfg.layers):
        p = f"model.layers.{i}."
        shapes.update({p + "input_layernorm.weight": (cfg.hidden,),
                       p + "post_attention_layernorm.weight": (cfg.hidden,),
                       p + "self_attn.q_proj.weight": (cfg.heads * cfg.head_dim, cfg.hidden),
                       p + "self_attn.k_proj.weight": (cfg.kv_heads * cfg.head_dim, cfg.hidden),
                       p + "self_attn.v_proj.weight": (cfg.kv_heads * cfg.head_dim, cfg.hidden),
                       p + "self_attn.o_proj.weight": (cfg.hidden, cfg.heads * cfg.head_dim),
                       p + "self_attn.q_norm.weight": (cfg.head_dim,),
                       p + "self_attn.k_norm.weight": (cfg.head_dim,),
                       p + "mlp.gate_proj.weight": (cfg.intermediate, cfg.hidden),
                       p + "mlp.up_proj.weight": (cfg.intermediate, cfg.hidden),
                       p + "mlp.down_proj.weight": (cfg.hidden, cfg.intermediate)})
    # f64 weights: the forward keeps their dtype, so central differences resolve the gradient to ~1e-8
    w = {k: (1.0 + 0.1 * rng.standard_normal(s)) if len(s) == 1 else 0.3 * rng.standard_normal(s)
         for k, s in shapes.items()}
    return qn.Qwen3(cfg, w)


@pytest.mark.parametrize("seed", [0, 1])
def test_numpy_backward_matches_finite_differences(seed):
    rng = np.random.default_rng(seed)
    m = tiny_model(rng)
    ids = rng.integers(0, m.cfg.vocab, 11).tolist()
    start, coef = 6, rng.standard_normal(5)  # signed coefficients, as GRPO advantages are

    def loss():
        return -float(np.sum(coef * m.token_logprobs(ids, start)))

    lp, grads = m.backward(ids, start, coef)
    np.testing.assert_allclose(lp, m.token_logprobs(ids, start), rtol=0, atol=1e-12)
    assert sorted(grads) == sorted(m.trainable)
    for name in m.trainable:
        w = m.w[name]
        for flat in rng.choice(w.size, 6, replace=False):
            idx = np.unravel_index(flat, w.shape)
            old, h = w[idx], 1e-5
            w[idx] = old + h
            up = loss()
            w[idx] = old - h
            down = loss()
            w[idx] = old
            fd = (up - down) / (2 * h)
            assert abs(grads[name][idx] - fd) <= 1e-6 + 1e-5 * abs(fd), (name, idx, grads[name][idx], fd)
