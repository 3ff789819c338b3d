"""tools/bench_serve.py against the session `mxq serve`: ~10 requests, and the JSON it writes is sane (counts,
non-negative latencies, exactly the requested tokens with --ignore-eos, n samples per prompt)."""
import json
import subprocess
import sys

from serve_fixtures import DEFAULT_MODEL, ROOT

TOOL = ROOT / "tools" / "bench_serve.py"


def bench(server, tmp_path, *args):
    out = tmp_path / "bench.json"
    p = subprocess.run([sys.executable, str(TOOL), "--base-url", server.base_url, "--json", str(out), *map(str, args)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    return json.loads(out.read_text()), p.stdout


def test_bench_serve_random_prompts_at_a_concurrency(server, tmp_path):
    r, table = bench(server, tmp_path, "--num-prompts", 10, "--random-input-len", 32, "--random-output-len", 8,
                     "--max-concurrency", 4, "--seed", 3)
    assert r["completed"] == 10 and r["failed"] == 0 and r["errors"] == []
    assert r["model_id"] == server.model_id and r["vocab_size"] == 4096  # probed through /detokenize
    assert r["total_input_tokens"] == 320 and r["input_lens"] == [32] * 10
    assert r["total_output_tokens"] == 80 and r["output_lens"] == [8] * 10
    assert len(r["ttfts"]) == 10 and all(t >= 0 for t in r["ttfts"])
    assert all(x >= 0 for x in r["itls"]) and len(r["itls"]) <= 70
    for k in ("request_throughput", "output_throughput", "total_token_throughput", "duration"):
        assert r[k] > 0, k
    assert abs(r["output_throughput"] * r["duration"] - 80) < 1e-6
    for name in ("ttft", "tpot", "itl", "e2el"):
        assert 0 <= r[f"median_{name}_ms"] <= r[f"p99_{name}_ms"] + 1e-9, name
        assert r[f"mean_{name}_ms"] >= 0
    assert r["mean_ttft_ms"] <= r["mean_e2el_ms"]
    for line in ("Serving Benchmark Result", "Successful requests:", "Benchmark duration (s):",
                 "Total generated tokens:", "Output token throughput (tok/s):", "Mean TTFT (ms):",
                 "Median TPOT (ms):", "P99 ITL (ms):"):
        assert line in table, line


def test_bench_serve_n_samples_at_a_request_rate(server, tmp_path):
    r, _ = bench(server, tmp_path, "--num-prompts", 5, "--n", 2, "--random-input-len", 16, "--random-output-len", 6,
                 "--random-prefix-len", 16, "--request-rate", 20, "--temperature", 1.0,
                 "--tokenizer", DEFAULT_MODEL / "tokenizer.json")
    assert r["completed"] == 5 and r["num_samples"] == 10 and r["failed"] == 0
    assert r["input_lens"] == [32] * 5 and r["output_lens"] == [12] * 5 and r["total_output_tokens"] == 60
    assert len(r["ttfts"]) == 10
    rate = r["prefix_cache_hit_rate"]
    assert rate is None or 0 <= rate <= 1


def test_bench_serve_client_processes_share_one_run(server, tmp_path):
    r, _ = bench(server, tmp_path, "--num-prompts", 6, "--random-input-len", 16, "--random-output-len", 4,
                 "--max-concurrency", 4, "--client-processes", 2, "--seed", 4)
    assert r["client_processes"] == 2 and r["completed"] == 6 and r["failed"] == 0
    assert r["input_lens"] == [16] * 6 and r["output_lens"] == [4] * 6 and len(r["ttfts"]) == 6
    assert r["duration"] > 0 and abs(r["output_throughput"] * r["duration"] - 24) < 1e-6
