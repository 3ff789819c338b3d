import os
import pathlib
import subprocess

import pytest

from conftest_serve import *  # noqa: E402,F401,F403  (the mxq serve fixtures; see conftest_serve.py)

ROOT = pathlib.Path(__file__).resolve().parents[2]
MXQ = pathlib.Path(os.environ.get("MXQ_BIN", ROOT / "build" / "mxq"))
MXQ_BENCH = pathlib.Path(os.environ.get("MXQ_BENCH_BIN", MXQ.parent / "mxq-bench"))  # the benchmarks' binary
CKPT = ROOT / "tests" / "golden" / "ckpt"


def run_mxq(*args, check=True):
    """Runs build/mxq; returns the CompletedProcess (text mode)."""
    p = subprocess.run([str(MXQ), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"mxq {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def mxq():
    assert MXQ.exists(), "build/mxq missing: run scripts/build first"
    return run_mxq


def run_mxq_bench(*args, check=True):
    """Runs build/mxq-bench; returns the CompletedProcess (text mode)."""
    p = subprocess.run([str(MXQ_BENCH), *map(str, args)], capture_output=True, text=True, timeout=600)
    if check and p.returncode != 0:
        raise AssertionError(f"mxq-bench {' '.join(map(str, args))} exited {p.returncode}:\n{p.stdout}\n{p.stderr}")
    return p


@pytest.fixture(scope="session")
def mxq_bench():
    assert MXQ_BENCH.exists(), "build/mxq-bench missing: run scripts/build first"
    return run_mxq_bench
