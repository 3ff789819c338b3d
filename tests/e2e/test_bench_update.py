"""tools/bench_update.py on the CPU (the rows that need no GPU: sparse deltas over HTTP and the disk update) on
the default model, two reps: it starts its own `mxq serve`, checks the client's planes against the live ones,
and prints the markdown table and the JSON rows; --device cuda without a GPU is refused by name."""
import json
import subprocess
import sys

import pytest

from serve_fixtures import MXQ, ROOT

TOOL = ROOT / "tools" / "bench_update.py"


def run(*args, timeout=120):
    return subprocess.run([sys.executable, str(TOOL), "--mxq", str(MXQ), *map(str, args)], capture_output=True,
                          text=True, timeout=timeout, cwd=str(ROOT))


def test_cpu_rows_on_the_default_model(tmp_path):
    out = tmp_path / "rows.json"
    p = run("--device", "cpu", "--reps", 2, "--sparse", "0.001,0.01", "--json", out)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "| what | ms | GB/s | vs peer / goal |" in p.stdout
    r = json.loads(out.read_text())
    keys = [row["key"] for row in r["rows"]]
    assert keys == [f"http_sparse_{f}{t}" for f in ("0.1%", "1%") for t in ("", "_raw", "_raw_path")] + ["disk"], keys
    for row in r["rows"]:
        assert "error" not in row and row["ms"] > 0 and row["gbs"] > 0, row
    # note: 1% of the entries changes 10x the entries of 0.1% (duplicates drawn at random aside)
    n = [int(row["what"].split("(")[1].split(" ")[0].replace(",", "")) for row in (r["rows"][0], r["rows"][3])]
    assert 8 * n[0] < n[1] < 11 * n[0], n


def test_cuda_without_a_gpu_is_refused_by_name():
    try:
        import torch
        if torch.cuda.is_available():
            pytest.skip("a GPU is visible: the refusal is for machines without one")
    except ImportError:
        pass
    p = run("--device", "cuda", "--reps", 1)
    assert p.returncode != 0
    assert "--device cuda needs a CUDA GPU" in p.stderr and "--device cpu" in p.stderr, p.stderr


def test_trainer_rows_run_on_cpu_torch():
    """Row (d)'s code (pack, diff, the table) on CPU torch with small shapes, eager: the GPU run's logic without
    a GPU. Skipped without torch (CI)."""
    pytest.importorskip("torch")
    sys.path.insert(0, str(ROOT / "tools"))
    import bench_update as bu
    a = bu.parse_args(["--trainer-layers", "2", "--reps", "2"])
    rows = []
    bu.bench_trainer(a, rows, dev="cpu", linears={"self_attn.q_proj": (256, 512), "mlp.down_proj": (128, 1024)},
                     copy_bytes=1 << 24)
    keys = [r["key"] for r in rows]
    assert keys == ["copy", "trainer_quantize_eager", "trainer_quantize", "trainer_quantize_graph", "trainer_diff",
                    "trainer_total"], keys
    assert all(r["ms"] > 0 for r in rows if r["key"] != "trainer_quantize_graph")
    assert "error" in rows[3]  # note: the CUDA graph path needs CUDA
    assert "changed entries" in rows[-1]["what"] and not rows[-1]["what"].startswith("trainer quantize + diff (0 ")
