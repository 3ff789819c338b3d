"""mxq inspect on checkpoints written by other tools (transformers, compressed-tensors, ModelOpt-format and
DeepSeek-style FP8 writers in tests/golden/make_checkpoints.py)."""
import json

import pytest

from conftest import CKPT

EXPECTED = {
    "qwen3-dense-bf16": ("Qwen3ForCausalLM", "bf16"),
    "qwen3-moe-bf16": ("Qwen3MoeForCausalLM", "bf16"),
    "modelopt-mxfp8": ("Qwen3ForCausalLM", "mxfp8"),
    "ct-mxfp8": ("Qwen3ForCausalLM", "mxfp8"),
    "ct-mxfp4": ("Qwen3ForCausalLM", "mxfp4"),
    "fp8-b128": ("Qwen3ForCausalLM", "fp8-b128"),
}


@pytest.mark.parametrize("name", list(EXPECTED))
def test_inspect_json(mxq, name):
    info = json.loads(mxq("inspect", CKPT / name, "--json").stdout)
    arch, fmt = EXPECTED[name]
    assert info["architecture"] == arch
    assert info["format"] == fmt
    assert info["totals"]["tensors"] == len(info["tensors"]) > 0
    assert info["totals"]["bytes"] == sum(t["bytes"] for t in info["tensors"])


@pytest.mark.parametrize("name", list(EXPECTED))
def test_inspect_text(mxq, name):
    out = mxq("inspect", CKPT / name).stdout
    assert EXPECTED[name][0] in out and "total" in out


def test_inspect_missing_dir(mxq, tmp_path):
    p = mxq("inspect", tmp_path / "nope", check=False)
    assert p.returncode == 2 and "nope" in p.stderr
