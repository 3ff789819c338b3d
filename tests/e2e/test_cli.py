"""The mxq binary itself: --version, `mxq help`, one-line parse errors, no silent overwrites (issue 22's new-user
findings)."""
import re

import pytest


def test_version(mxq):
    p = mxq("--version")
    assert re.fullmatch(r"mxq \d+\.\d+\.\d+\n", p.stdout), p.stdout


def test_help_lists_every_subcommand(mxq):
    p = mxq("help")
    for cmd in ["inspect", "quantize", "generate", "serve", "delta"]:
        assert cmd in p.stdout, p.stdout
    assert "bench" not in p.stdout, p.stdout  # the benchmarks are their own binary, mxq-bench
    assert p.stdout == mxq("--help").stdout


def test_mxq_bench_points_at_the_benchmarks_binary(mxq):
    p = mxq("bench", "linear", "--m", "1", check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("mxq bench: the benchmarks are their own binary: mxq-bench linear --m 1"), p.stderr


def test_a_parse_error_is_one_line_naming_the_command(mxq):
    p = mxq("inspect", "models/default", "--no-such-flag", check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith("mxq inspect: ") and "--no-such-flag" in p.stderr, p.stderr


def test_delta_make_and_recode_never_overwrite(mxq, tmp_path):
    out = tmp_path / "old.mxqdelta"
    out.write_bytes(b"keep me")
    for args in (["delta", "make", "--base", tmp_path, "--target", tmp_path, "--quantization", "mxfp8", "-o", out],
                 ["delta", "recode", tmp_path / "in.mxqdelta", "-o", out]):
        p = mxq(*args, check=False)
        assert p.returncode == 2, p.stdout + p.stderr
        assert f"{out}: output file exists" in p.stderr and p.stderr.count("\n") == 1, p.stderr
        assert out.read_bytes() == b"keep me"


@pytest.mark.parametrize("args", [["gemm", "--m", "0"], ["linear", "--m", "0"], ["refit", "--layers", "0"]])
def test_bench_refusals_are_one_line_with_exit_2(mxq_bench, args):
    # issue 22: bench linear / gemm / refit answered with spdlog lines and exit 1 (a CPU build says it has no
    # CUDA the same way)
    p = mxq_bench(*args, check=False)
    assert p.returncode == 2 and p.stderr.count("\n") == 1, p.stderr
    assert p.stderr.startswith(f"mxq-bench {args[0]}") and "[error]" not in p.stderr, p.stderr


def test_mxq_bench_version_and_help(mxq_bench):
    assert re.fullmatch(r"mxq-bench \d+\.\d+\.\d+\n", mxq_bench("--version").stdout)
    out = mxq_bench("--help").stdout
    for cmd in ["quantize", "linear", "decode", "refit", "gemm"]:
        assert cmd in out, out


def test_bench_delta_round_trips_every_row(mxq_bench):
    # every row applies the delta back and checks it against the new plane (exit 1 otherwise)
    p = mxq_bench("delta", "--bytes", 1 << 16)
    rows = [r for r in p.stdout.splitlines() if r.startswith("| random") or r.startswith("| runs of 16")]
    assert len(rows) == 8, p.stdout
    p = mxq_bench("delta", "--bytes", 300, check=False)
    assert p.returncode == 2 and "multiple of 256" in p.stderr, p.stderr
