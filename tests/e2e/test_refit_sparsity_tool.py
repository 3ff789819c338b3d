"""tools/refit_sparsity.py's measuring code (the RL sparsity study, bench/RESULTS.md, Refit delta sparsity):
on tiny random Qwen3 checkpoints, mxq delta make/inspect's per-tensor changed counts equal an independent
numpy quantizer's."""
import subprocess
import sys

from conftest import MXQ, ROOT


def test_sparsity_tool_selftest():
    p = subprocess.run([sys.executable, str(ROOT / "tools" / "refit_sparsity.py"), "--selftest", "--mxq", str(MXQ)],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    assert "per-tensor counts vs numpy reference: all equal" in p.stdout
