"""Issue 22: what a checkpoint's config declares is run or refused by name, the same in inspect and generate:
declared W8A8 activations run by default (--activation-quant overrides), the MXFP4 preset's W4A4 and
yarn / linear RoPE are refused, compressed-tensors FP8_BLOCK is read."""
import json
import shutil

import pytest

from conftest import CKPT, run_mxq

MXFP8_ACTS = {"dynamic": True, "group_size": 32, "num_bits": 8, "scale_dtype": "torch.uint8",
              "strategy": "group", "symmetric": True, "type": "float"}
GEN = ("generate", "--prompt-ids", "1,2,3,4", "--max-new-tokens", 6, "--ignore-eos", "--device", "cpu", "--json")


def edited(tmp_path, name, edit):
    dst = tmp_path / name
    shutil.copytree(CKPT / name, dst)
    cfg = json.loads((dst / "config.json").read_text())
    edit(cfg)
    (dst / "config.json").write_text(json.dumps(cfg))
    return dst


def with_activations(acts):
    def edit(cfg):
        cfg["quantization_config"]["config_groups"]["group_0"]["input_activations"] = acts
    return edit


def logprobs(p):
    assert p.returncode == 0, p.stderr
    return [t["logprob"] for t in json.loads(p.stdout)["logprobs"]]


def test_declared_w8a8_runs_by_default_and_the_flag_overrides(tmp_path):
    w8a8 = edited(tmp_path, "ct-mxfp8", with_activations(MXFP8_ACTS))
    auto = run_mxq(*GEN, "--model", w8a8, check=False)
    assert "declares dynamic MXFP8 input_activations: running W8A8" in auto.stderr
    forced = run_mxq(*GEN, "--model", CKPT / "ct-mxfp8", "--activation-quant", "mxfp8", check=False)
    none = run_mxq(*GEN, "--model", w8a8, "--activation-quant", "none", check=False)
    assert "runs weight-only" in none.stderr
    plain = run_mxq(*GEN, "--model", CKPT / "ct-mxfp8", check=False)
    assert "input_activations" not in plain.stderr
    assert logprobs(auto) == logprobs(forced)
    assert logprobs(none) == logprobs(plain) != logprobs(auto)


def test_inspect_says_which_activation_mode_runs(tmp_path):
    w8a8 = edited(tmp_path, "ct-mxfp8", with_activations(MXFP8_ACTS))
    assert json.loads(run_mxq("inspect", w8a8, "--json").stdout)["activations"] == "mxfp8"
    assert "activations   mxfp8 per 1x32, dynamic (W8A8" in run_mxq("inspect", w8a8).stdout
    assert json.loads(run_mxq("inspect", CKPT / "ct-mxfp8", "--json").stdout)["activations"] == "none"
    assert "activations   none (weight-only" in run_mxq("inspect", CKPT / "ct-mxfp8").stdout


def test_mxfp4_preset_w4a4_is_refused_by_name_in_inspect_and_generate(tmp_path):
    w4a4 = edited(tmp_path, "ct-mxfp4", with_activations(dict(MXFP8_ACTS, num_bits=4)))
    want = ("quantization_config.config_groups.group_0.input_activations: num_bits 4 type \"float\" "
            "(dynamic 4-bit activations, W4A4) is not supported")
    for args in (("inspect", w4a4), (*GEN, "--model", w4a4)):
        p = run_mxq(*args, check=False)
        assert p.returncode == 2 and want in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_ct_fp8_block_is_read():
    info = json.loads(run_mxq("inspect", CKPT / "ct-fp8-block", "--json").stdout)
    assert info["scheme"] == "compressed-tensors-fp8-block128" and info["format"] == "fp8-b128"
    assert info["activations"] == "fp8-b128" and info["ignored"] == ["lm_head"]
    assert len(logprobs(run_mxq(*GEN, "--model", CKPT / "ct-fp8-block", check=False))) == 6


def test_ct_fp8_per_channel_is_refused_naming_the_strategy(tmp_path):
    def per_channel(cfg):
        g = cfg["quantization_config"]["config_groups"]["group_0"]
        g["weights"]["strategy"] = "channel"
        del g["weights"]["block_structure"]
    p = run_mxq("inspect", edited(tmp_path, "ct-fp8-block", per_channel), check=False)
    assert p.returncode == 2 and "got strategy \"channel\"" in p.stderr, p.stderr


@pytest.mark.parametrize("rope", [{"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 128},
                                  {"rope_type": "linear", "factor": 2.0}])
def test_rope_scaling_is_refused_the_same_by_inspect_and_generate(tmp_path, rope):
    def edit(cfg):
        cfg["rope_parameters"] = dict(rope, rope_theta=10000.0)
    d = edited(tmp_path, "qwen3-dense-bf16", edit)
    want = f"rope_parameters.rope_type \"{rope['rope_type']}\" is not supported (expected \"default\")"
    lines = []
    for args in (("inspect", d), (*GEN, "--model", d)):
        p = run_mxq(*args, check=False)
        assert p.returncode == 2 and want in p.stderr and p.stderr.count("\n") == 1, p.stderr
        lines.append(p.stderr.split(": ", 1)[1])
    assert lines[0] == lines[1]


def test_control_characters_and_huge_values_stay_out_of_error_lines(tmp_path):
    def edit(cfg):
        cfg["architectures"] = ["Qwen3\n\x1b[31mX"]
        cfg["torch_dtype"] = "y" * 1_300_000
    d = edited(tmp_path, "qwen3-dense-bf16", edit)
    for args in (("inspect", d), (*GEN, "--model", d)):
        p = run_mxq(*args, check=False)
        assert p.returncode == 2 and "Qwen3\\x0a\\x1b[31mX" in p.stderr, p.stderr
        assert p.stderr.count("\n") == 1 and "\x1b" not in p.stderr and len(p.stderr) < 1000
