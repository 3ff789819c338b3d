"""The mxq binary itself: --version and `mxq help` (issue 22's new-user findings)."""
import re


def test_version(mxq):
    p = mxq("--version")
    assert re.fullmatch(r"mxq \d+\.\d+\.\d+\n", p.stdout), p.stdout


def test_help_lists_every_subcommand(mxq):
    p = mxq("help")
    for cmd in ["inspect", "quantize", "generate", "serve", "bench", "delta"]:
        assert cmd in p.stdout, p.stdout
    assert p.stdout == mxq("--help").stdout
