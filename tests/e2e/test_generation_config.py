"""mxq generate with a checkpoint's generation_config.json, as vLLM applies it (--generation-config auto):
its eos_token_id stops generation besides config.json's, its sampling keys are defaults for flags not given,
a bad file is refused by name (exit 2, one line), and `none` ignores the file. Also: special tokens typed in
a text prompt encode as their ids (HF Tokenizer.encode). Runs build/mxq, or $MXQ_BIN."""
import json
import os
import pathlib
import shutil
import subprocess

import pytest

from conftest import MXQ  # noqa: E402  (build/mxq, or $MXQ_BIN)

ROOT = pathlib.Path(__file__).resolve().parents[2]
PROMPT = "Once upon a time"
CONFIG_EOS = 4091  # models/default/config.json's eos_token_id


def generate(*args, timeout=600):
    return subprocess.run([str(MXQ), "generate", *map(str, args)], capture_output=True, text=True,
                          timeout=timeout)


def run_json(*args):
    p = generate(*args, "--json")
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def model(tmp_path_factory):
    """models/default copied, so each test can write its own generation_config.json."""
    d = tmp_path_factory.mktemp("gc") / "default"
    shutil.copytree(ROOT / "models" / "default", d)
    return d


def write_config(model, obj):
    path = model / "generation_config.json"
    if path.is_symlink() or path.exists():
        path.unlink()
    path.write_text(obj if isinstance(obj, str) else json.dumps(obj))
    return path


@pytest.fixture(scope="module")
def greedy(model):
    """The greedy continuation without the file, and a token it emits early that is not config.json's eos."""
    write_config(model, {})
    out = run_json("--model", model, PROMPT, "--max-new-tokens", 12, "--ignore-eos")
    ids = out["token_ids"]
    assert len(ids) == 12
    # note: the first repeat-free id after position 0, so generation must stop exactly there.
    k = next(i for i in range(1, len(ids)) if ids[i] not in ids[:i] and ids[i] != CONFIG_EOS)
    return ids, k


def test_generation_config_eos_stops_generation(model, greedy):
    ids, k = greedy
    stop_id = ids[k]
    write_config(model, {"eos_token_id": [CONFIG_EOS, stop_id], "do_sample": False})
    out = run_json("--model", model, PROMPT, "--max-new-tokens", 12)
    assert out["token_ids"] == ids[:k + 1]  # the stop token is kept in the ids (vLLM's rule) ...
    assert out["finish_reason"] == "stop"
    assert out["sampling"]["stop_token_ids"] == [stop_id]  # config.json's eos is not repeated
    assert out["sampling"]["temperature"] == 0  # do_sample false and no temperature: still greedy


def test_generation_config_int_eos(model, greedy):
    ids, k = greedy
    write_config(model, {"eos_token_id": ids[k]})
    out = run_json("--model", model, PROMPT, "--max-new-tokens", 12)
    assert out["token_ids"] == ids[:k + 1] and out["finish_reason"] == "stop"


def test_generation_config_none_ignores_the_file(model, greedy):
    ids, k = greedy
    write_config(model, {"eos_token_id": ids[k], "temperature": 0.9, "max_new_tokens": 3})
    out = run_json("--model", model, PROMPT, "--max-new-tokens", 12, "--ignore-eos", "--generation-config", "none")
    assert out["token_ids"] == ids
    s = out["sampling"]
    assert s["generation_config"] == "none" and s["from_generation_config"] == [] and s["stop_token_ids"] == []
    assert s["temperature"] == 0 and s["max_new_tokens"] == 12


def test_ignore_eos_drops_the_files_eos_too(model, greedy):
    ids, k = greedy
    write_config(model, {"eos_token_id": ids[k]})
    out = run_json("--model", model, PROMPT, "--max-new-tokens", 12, "--ignore-eos")
    assert out["token_ids"] == ids and out["finish_reason"] == "length"
    assert out["sampling"]["stop_token_ids"] == []


def test_sampling_defaults_apply_to_flags_not_given(model):
    write_config(model, {"temperature": 0.7, "top_k": 20, "top_p": 0.9, "min_p": 0.05, "max_new_tokens": 5})
    s = run_json("--model", model, PROMPT, "--ignore-eos")["sampling"]
    assert s["temperature"] == pytest.approx(0.7) and s["top_k"] == 20
    assert s["top_p"] == pytest.approx(0.9) and s["min_p"] == pytest.approx(0.05) and s["max_new_tokens"] == 5
    assert s["from_generation_config"] == ["temperature", "top_p", "min_p", "top_k", "max_new_tokens"]
    # A flag given wins, even when it equals the CLI default.
    out = run_json("--model", model, PROMPT, "--ignore-eos", "--temperature", 0, "--top-k", 0,
                   "--max-new-tokens", 3)
    s = out["sampling"]
    assert s["temperature"] == 0 and s["top_k"] == 0 and s["max_new_tokens"] == 3
    assert s["from_generation_config"] == ["top_p", "min_p"] and len(out["token_ids"]) == 3


def test_do_sample_false_does_not_make_a_temperature_greedy(model):
    # vLLM never reads do_sample: the file's temperature applies.
    write_config(model, {"do_sample": False, "temperature": 0.8})
    s = run_json("--model", model, PROMPT, "--max-new-tokens", 2)["sampling"]
    assert s["temperature"] == pytest.approx(0.8)


def test_max_new_tokens_default_is_clamped_to_the_context(model, greedy):
    ids, k = greedy
    write_config(model, {"max_new_tokens": 100000, "eos_token_id": ids[k]})
    out = run_json("--model", model, PROMPT)
    assert out["sampling"]["max_new_tokens"] == 2048 - out["prompt_tokens"]  # max_position_embeddings 2048
    # An explicit flag past the context is still refused.
    p = generate("--model", model, PROMPT, "--max-new-tokens", 100000)
    assert p.returncode == 2 and "exceed the context" in p.stderr


def test_repetition_penalty_is_reported_not_applied(model):
    write_config(model, {"repetition_penalty": 1.1})
    p = generate("--model", model, PROMPT, "--max-new-tokens", 2, "--json")
    assert p.returncode == 0, p.stderr
    assert "repetition_penalty 1.1 is not applied" in p.stderr and p.stderr.count("\n") == 1
    assert json.loads(p.stdout)["sampling"]["not_applied"] == {"repetition_penalty": pytest.approx(1.1)}


@pytest.mark.parametrize("content,needle", [
    ({"top_p": 2}, "generation_config.json: top_p: expected a finite number in (0, 1], got 2"),
    ({"eos_token_id": "4091"}, "generation_config.json: eos_token_id: expected an integer or a list"),
    ({"temperature": "hot"}, "generation_config.json: temperature: expected a number"),
    ("{not json", "generation_config.json: invalid JSON"),
    ({"eos_token_id": [4096]}, "generation_config.json: eos_token_id 4096 is outside the vocabulary [0, 4096)"),
])
def test_bad_file_is_refused_by_name(model, content, needle):
    write_config(model, content)
    p = generate("--model", model, PROMPT, "--max-new-tokens", 2)
    assert p.returncode == 2, (p.stdout, p.stderr)
    assert needle in p.stderr and p.stderr.count("\n") == 1, p.stderr
    # `none` does not read it.
    ok = generate("--model", model, PROMPT, "--max-new-tokens", 2, "--generation-config", "none")
    assert ok.returncode == 0, ok.stderr


@pytest.mark.parametrize("kind", ["fifo", "dev_zero"])
def test_non_regular_file_is_refused_without_blocking(model, kind):
    path = write_config(model, {})
    path.unlink()
    if kind == "fifo":
        os.mkfifo(path)
    else:
        os.symlink("/dev/zero", path)
    try:
        p = generate("--model", model, PROMPT, "--max-new-tokens", 2, timeout=60)
        assert p.returncode == 2, p.stderr
        assert "generation_config.json: expected a regular file" in p.stderr
    finally:
        os.unlink(path)


def test_generation_config_flag_value_is_checked():
    p = generate(PROMPT, "--generation-config", "vllm")
    assert p.returncode == 2 and "--generation-config vllm: expected auto or none" in p.stderr


def test_special_tokens_in_a_text_prompt_encode_as_ids():
    # <|im_start|> is one id (4092) as in HF Tokenizer.encode; a partial one stays text (several ids).
    whole = run_json("<|im_start|>user", "--max-new-tokens", 1)
    partial = run_json("<|im_startuser", "--max-new-tokens", 1)
    assert whole["prompt_tokens"] == 2
    assert partial["prompt_tokens"] > 2
