"""Files named by untrusted input are read only when they are regular files, with their size bound checked before
the read (issue 22: a FIFO as config.json hung forever, a directory as tokenizer.json reported 2^63 - 1 bytes,
`--apply-delta /dev/zero` grew to 2.1 GB and aborted, a directory as the delta path threw, a 1 GiB garbage delta
was read whole before its magic was checked). Each is refused by path and kind, at once, with exit status 2."""
import json
import os
import subprocess
import sys
import time

import pytest

from conftest import MXQ, ROOT

DEFAULT = ROOT / "models" / "default"


def model_dir_with(tmp_path, name, make):
    """models/default linked file by file into tmp_path/m, with `name` replaced by what make(path) creates."""
    d = tmp_path / "m"
    d.mkdir()
    for f in DEFAULT.iterdir():
        if f.name != name:
            (d / f.name).symlink_to(f)
    make(d / name)
    return d


def run(*args, timeout=60):
    t0 = time.monotonic()
    p = subprocess.run([str(MXQ), *map(str, args)], capture_output=True, text=True, timeout=timeout)
    return p, time.monotonic() - t0


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "generation_config.json",
                                  "model.safetensors.index.json"])
def test_a_fifo_in_the_checkpoint_is_refused_at_once(tmp_path, name):
    d = model_dir_with(tmp_path, name, os.mkfifo)
    p, secs = run("generate", "--model", d, "--quantization", "mxfp8", "--max-new-tokens", 1, "hi")
    assert p.returncode == 2, p.stdout + p.stderr
    assert name in p.stderr and "expected a regular file, got a FIFO" in p.stderr, p.stderr
    assert secs < 30


@pytest.mark.parametrize("name", ["config.json", "tokenizer.json", "model.safetensors.index.json"])
def test_a_directory_in_the_checkpoint_is_refused_by_kind(tmp_path, name):
    d = model_dir_with(tmp_path, name, lambda p: p.mkdir())
    p, _ = run("generate", "--model", d, "--quantization", "mxfp8", "--max-new-tokens", 1, "hi")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "expected a regular file, got a directory" in p.stderr, p.stderr
    assert "9223372036854775807" not in p.stderr


def test_a_delta_path_that_is_not_a_regular_file_is_refused(tmp_path):
    fifo = tmp_path / "fifo.mxqdelta"
    os.mkfifo(fifo)
    for path, kind in (("/dev/zero", "a character device"), (tmp_path, "a directory"), (fifo, "a FIFO")):
        p, secs = run("generate", "--max-new-tokens", 1, "--apply-delta", path, "hi")
        assert p.returncode == 2, (path, p.stdout + p.stderr)
        assert f"expected a regular file, got {kind}" in p.stderr, p.stderr
        assert secs < 30


def test_a_garbage_delta_is_refused_by_its_magic_before_it_is_read(tmp_path):
    junk = tmp_path / "junk.mxqdelta"
    with open(junk, "wb") as f:
        f.truncate(256 << 20)  # sparse: 256 MiB of zeros that a whole read would load
    p, secs = run("generate", "--max-new-tokens", 1, "--apply-delta", junk, "hi")
    assert p.returncode == 2, p.stdout + p.stderr
    assert "not an mxq delta" in p.stderr, p.stderr
    assert secs < 30


def test_an_all_sparse_moe_configs_intermediate_size_sizes_nothing(tmp_path):
    # issue 22: intermediate_size names no tensor when every layer is sparse, yet it sized the per-token MLP
    # scratch: 4,194,304 made a 60-token prompt take 3 GB.
    src = ROOT / "tests" / "golden" / "ckpt" / "qwen3-moe-bf16"
    d = tmp_path / "moe"
    d.mkdir()
    (d / "model.safetensors").symlink_to(src / "model.safetensors")
    cfg = json.loads((src / "config.json").read_text())
    assert cfg["decoder_sparse_step"] == 1 and cfg["mlp_only_layers"] == []
    cfg["intermediate_size"] = 4194304
    (d / "config.json").write_text(json.dumps(cfg))
    ids = ",".join(str(3 + i) for i in range(60))
    probe = ("import resource, subprocess, sys; p = subprocess.run(sys.argv[1:], capture_output=True); "
             "print(p.returncode, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)")
    out = subprocess.run([sys.executable, "-c", probe, str(MXQ), "generate", "--device", "cpu", "--model", str(d),
                          "--prompt-ids", ids, "--max-new-tokens", "1"], capture_output=True, text=True, timeout=120)
    rc, max_kib = map(int, out.stdout.split())
    assert rc == 0, out.stderr
    assert max_kib < 512 * 1024, f"{max_kib} KiB"
