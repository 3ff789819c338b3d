"""mxq generate end to end: the real binary against transformers' greedy ids (tests/golden/model/cases.json),
the embedded default model, and refusals (exit 2, one line on stderr)."""
import json
import pathlib
import shutil
import subprocess

import numpy as np
import pytest
from safetensors.numpy import load_file, save_file

ROOT = pathlib.Path(__file__).resolve().parents[2]
from conftest import MXQ, MXQ_BENCH  # noqa: E402  (build/mxq and build/mxq-bench, or $MXQ_BIN)
GOLDEN = ROOT / "tests" / "golden"


def generate(*args):
    return subprocess.run([str(MXQ), "generate", *map(str, args)], capture_output=True, text=True, timeout=600)


def golden_case(name):
    cases = json.loads((GOLDEN / "model" / "cases.json").read_text())["cases"]
    return next(c for c in cases if c["name"] == name)


@pytest.mark.parametrize("case", ["qwen3-dense-f32", "qwen3-moe-bf16", "ct-mxfp4", "fp8-b128"])
def test_json_greedy_ids_match_transformers(case):
    c = golden_case(case)
    run = c["runs"][0]
    p = generate("--model", GOLDEN / c["checkpoint"], "--prompt-ids", ",".join(map(str, run["prompt"])),
                 "--max-new-tokens", len(run["greedy"]), "--ignore-eos", "--top-logprobs", 2, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert set(out) >= {"token_ids", "text", "logprobs"}
    # free-running greedy: compare up to the oracle's first near-tie
    n = next((i for i, m in enumerate(run["margins"]) if m < 1e-3), len(run["margins"]))
    assert out["token_ids"][:n] == run["greedy"][:n]
    assert len(out["logprobs"]) == len(out["token_ids"])
    for lp in out["logprobs"]:
        assert len(lp["top_logprobs"]) == 2 and lp["logprob"] <= 0
        assert lp["top_logprobs"][0]["token_id"] == lp["token_id"]  # greedy picks the best raw logprob


def test_default_model_runs_as_mxfp8_and_streams_the_same_text():
    p = generate("Once upon a time", "--max-new-tokens", 12, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["format"] == "mxfp8" and 1 <= len(out["token_ids"]) <= 12
    s = generate("Once upon a time", "--max-new-tokens", 12)
    assert s.returncode == 0, s.stderr
    assert s.stdout.rstrip("\n") == "Once upon a time" + out["text"]  # the prompt is echoed, then streamed text


def test_device_auto_falls_back_to_cpu_without_a_gpu():
    # note: on a machine with a GPU `auto` runs the CUDA engine, which gave the same text in the H200 run.
    cpu = generate("Once upon a time", "--max-new-tokens", 8, "--device", "cpu", "--json")
    auto = generate("Once upon a time", "--max-new-tokens", 8, "--device", "auto", "--json")
    assert cpu.returncode == 0 and auto.returncode == 0, (cpu.stderr, auto.stderr)
    assert json.loads(auto.stdout)["token_ids"] == json.loads(cpu.stdout)["token_ids"]


@pytest.mark.parametrize("args,needle", [
    (["--device", "cuda", "hi"], "--device cuda"),
    (["--prompt-ids", "1,4096"], "outside the vocabulary"),          # covers H-07
    (["--prompt-ids", "1,x"], "'x' is not a token id"),
    (["--temperature", "nan", "hi"], "temperature"),                  # covers H-06
    (["--max-new-tokens", "100000", "hi"], "exceed the context"),     # covers H-04
    (["--quantization", "nvfp4", "hi"], "--quantization nvfp4"),
    (["--model", "/nonexistent", "--prompt-ids", "1"], "/nonexistent"),
    (["--activation-quant", "int8", "hi"], "--activation-quant int8"),
    (["--quantization", "fp8-b128", "--activation-quant", "mxfp8", "hi"], "run in fp8-b128"),
    # issue 22: every numeric flag checked with its range, CLI11's parse errors on one line too
    (["--threads", "100000", "hi"], "--threads: Value 100000 not in range 0 to 4096"),
    (["--threads", "-1", "hi"], "not in range 0 to 4096"),
    (["--seed", "-1", "hi"], "--seed -1: expected a decimal integer"),
    (["--seed", "18446744073709551616", "hi"], "--seed 18446744073709551616: expected a decimal integer"),
    (["--top-k", "1099511627776", "hi"], "--top-k: Value 1099511627776 not in range"),
    (["--gpu-memory-utilization", "2", "hi"], "--gpu-memory-utilization: Value 2 not in range"),
    (["--device", "cpu", "--max-num-seqs", "4", "hi"], "--max-num-seqs: applies to --device cuda only"),
    (["--device", "cpu", "--max-model-len", "64", "hi"], "--max-model-len: applies to --device cuda only"),
    (["--bogus-flag", "hi"], "--bogus-flag"),
    # issue 22: the new user's misleading errors, each named for what it is
    (["--model", "/nonexistent", "hi"], "--model /nonexistent: no such directory"),
    (["--model", "Qwen/Qwen3-0.6B", "hi"], "huggingface-cli download Qwen/Qwen3-0.6B --local-dir DIR"),
    (["--model", ROOT / "models" / "default" / "config.json", "hi"], "a file; --model takes the checkpoint"),
    (["--model", ROOT / "tests", "hi"], "/tests: no config.json"),
    ([""], "the prompt is empty"),
])
def test_bad_input_exits_2_with_one_line(args, needle):
    p = generate(*args)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr and p.stderr.count("\n") == 1, p.stderr


def test_a_refused_request_does_not_echo_its_prompt():
    p = generate("hello there", "--max-new-tokens", 100000)
    assert p.returncode == 2 and "exceed the context" in p.stderr, p.stderr
    assert p.stdout == ""
    ok = generate("hello there", "--max-new-tokens", 2)
    assert ok.returncode == 0 and ok.stdout.startswith("hello there"), ok.stdout


def test_sampling_without_a_seed_is_seeded_randomly_and_reports_the_seed():
    # issue 22: without --seed every run sampled with seed 0 (vLLM and llama.cpp seed randomly)
    args = ("Once upon a time", "--max-new-tokens", 16, "--temperature", 1.0, "--ignore-eos", "--json")
    runs = [json.loads(generate(*args).stdout) for _ in range(3)]
    seeds = {r["sampling"]["seed"] for r in runs}
    assert len(seeds) == 3 and not any(r["sampling"]["seed_given"] for r in runs)
    again = json.loads(generate(*args, "--seed", runs[0]["sampling"]["seed"]).stdout)
    assert again["sampling"]["seed_given"] and again["token_ids"] == runs[0]["token_ids"]


def test_activation_quant_mxfp8_changes_the_numerics_not_the_interface():
    # W8A8: the MXFP8 projections see their input quantized to MXFP8 per 1x32 (cuda/linear/linear.h); the CPU engine
    # runs it too. Same prompt and length, other logprobs.
    base = generate("Once upon a time", "--max-new-tokens", 8, "--ignore-eos", "--device", "cpu", "--json")
    a8 = generate("Once upon a time", "--max-new-tokens", 8, "--ignore-eos", "--device", "cpu", "--json",
                  "--activation-quant", "mxfp8")
    assert base.returncode == 0 and a8.returncode == 0, (base.stderr, a8.stderr)
    b, q = json.loads(base.stdout), json.loads(a8.stdout)
    assert len(q["token_ids"]) == len(b["token_ids"]) == 8
    assert [t["logprob"] for t in q["logprobs"]] != [t["logprob"] for t in b["logprobs"]]


def test_stop_string_cuts_the_text():
    full = json.loads(generate("Once upon a time", "--max-new-tokens", 24, "--ignore-eos", "--json").stdout)
    stop = full["text"][len(full["text"]) // 2:][:3]
    p = generate("Once upon a time", "--max-new-tokens", 24, "--ignore-eos", "--stop", stop, "--json")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["finish_reason"] == "stop" and out["text"] == full["text"][:full["text"].index(stop)]


def test_chat_prompt_is_wrapped_in_the_template():
    plain = json.loads(generate("hello", "--max-new-tokens", 4, "--json").stdout)
    chat = generate("hello", "--max-new-tokens", 4, "--chat", "--json")
    assert chat.returncode == 0, chat.stderr
    assert "chat_template is not executed" in chat.stderr
    assert json.loads(chat.stdout)["prompt_tokens"] > plain["prompt_tokens"]


def test_Q06_a_malicious_chat_template_is_never_executed(tmp_path):
    # covers Q-06: a checkpoint whose chat_template tries Jinja SSTI (reach os through a global, run a command)
    # renders exactly as the plain default model: mxq builds chat prompts with its own Qwen3 code.
    src = ROOT / "models" / "default"
    model = tmp_path / "evil"
    model.mkdir()
    for f in src.iterdir():
        if f.name != "tokenizer_config.json":
            (model / f.name).symlink_to(f)
    marker = tmp_path / "PWNED"
    ssti = ("{{ cycler.__init__.__globals__.os.popen('touch " + str(marker) + "').read() }}"
            "{% for m in messages %}{{ m.content }}{% endfor %}")
    cfg = json.loads((src / "tokenizer_config.json").read_text())
    cfg["chat_template"] = ssti
    (model / "tokenizer_config.json").write_text(json.dumps(cfg))
    (model / "chat_template.jinja").write_text(ssti)
    args = ["hello", "--max-new-tokens", 3, "--chat", "--json", "--quantization", "mxfp8"]
    plain = generate("--model", src, *args)
    evil = generate("--model", model, *args)
    assert plain.returncode == 0 and evil.returncode == 0, (plain.stderr, evil.stderr)
    assert "chat_template is not executed" in evil.stderr
    a, b = json.loads(plain.stdout), json.loads(evil.stdout)
    assert (a["prompt_tokens"], a["token_ids"]) == (b["prompt_tokens"], b["token_ids"])
    assert not marker.exists()


def test_bench_decode_prints_pp_and_tg_rows():
    args = ["decode", "--model", GOLDEN / "ckpt" / "qwen3-moe-bf16", "--pp", 8, "--tg", 4, "--reps", 1]
    p = subprocess.run([str(MXQ_BENCH), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| qwen3-moe-bf16")]
    assert [r.split("|")[5].strip() for r in rows] == ["pp8", "tg4"]
    assert all(float(r.split("|")[6]) > 0 for r in rows)


def test_bench_decode_depth_labels_tg_as_llama_bench():
    args = ["decode", "--model", GOLDEN / "ckpt" / "qwen3-moe-bf16", "--pp", 8, "--tg", 4, "--reps", 1,
            "--depth", 16]
    p = subprocess.run([str(MXQ_BENCH), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stderr
    rows = [line for line in p.stdout.splitlines() if line.startswith("| qwen3-moe-bf16")]
    assert [r.split("|")[5].strip() for r in rows] == ["pp8", "tg4 @ d16"]
    big = subprocess.run([str(MXQ_BENCH), *map(str, args[:-1]), "100000000"], capture_output=True, text=True, timeout=60)
    assert big.returncode == 2 and "--depth" in big.stderr, big.stderr


def test_bench_decode_breakdown_is_refused_on_cpu():
    # the per-op breakdown profiles the CUDA engine's decode step: on --device cpu it is refused by name
    args = ["decode", "--model", GOLDEN / "ckpt" / "qwen3-moe-bf16", "--pp", 8, "--tg", 4, "--reps", 1,
            "--device", "cpu", "--breakdown"]
    p = subprocess.run([str(MXQ_BENCH), *map(str, args)], capture_output=True, text=True, timeout=600)
    assert p.returncode == 2, p.stdout + p.stderr
    assert "--breakdown" in p.stderr and "--device cpu" in p.stderr
    assert p.stdout == ""


def test_stop_takes_one_value_and_leaves_the_prompt_positional():
    # `--stop X PROMPT`: the stop flag takes one value; the next word is the positional prompt.
    p = generate("--stop", "\n\n", "def fibonacci(n):", "--max-new-tokens", 4, "--json")
    assert p.returncode == 0, p.stderr


def test_apply_delta_equals_loading_the_target(tmp_path):
    base, target = GOLDEN / "model" / "ckpt" / "qwen3-dense-f32", tmp_path / "target"
    # A trainer step: the target is the base with one projection nudged (written with the python library).
    shutil.copytree(base, target)
    tensors = load_file(str(target / "model.safetensors"))
    name = "model.layers.0.mlp.up_proj.weight"
    rng = np.random.default_rng(0)
    tensors[name] = (tensors[name] * (1 + 1e-2 * rng.standard_normal(tensors[name].shape))).astype(np.float32)
    save_file(tensors, str(target / "model.safetensors"), metadata={"format": "pt"})
    delta = tmp_path / "step.mxqd"
    d = subprocess.run([str(MXQ), "delta", "make", "--base", base, "--target", target, "--quantization", "mxfp8",
                        "-o", delta], capture_output=True, text=True, timeout=600)
    assert d.returncode == 0, d.stderr
    args = ("--prompt-ids", "1,2,3", "--max-new-tokens", 8, "--ignore-eos", "--quantization", "mxfp8", "--json")
    refit = generate("--model", base, "--apply-delta", delta, *args)
    direct = generate("--model", target, *args)
    assert refit.returncode == 0 and direct.returncode == 0, refit.stderr + direct.stderr
    assert json.loads(refit.stdout)["token_ids"] == json.loads(direct.stdout)["token_ids"]
    assert json.loads(refit.stdout)["logprobs"] == json.loads(direct.stdout)["logprobs"]
