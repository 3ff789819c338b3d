"""Where `mxq` finds its embedded default model without --model (engine/default_model.h): beside an installed
binary (<prefix>/share/mxq/models/default) or a checkout's build directory (<repo>/models/default), never in the
working directory, so the binary works from wherever it is run."""
import json
import os
import shutil
import subprocess

import pytest

from conftest import MXQ, ROOT


def generate(exe, cwd, *args):
    return subprocess.run([str(exe), "generate", "def f(x):", "--max-new-tokens", "2", "--json", *map(str, args)],
                          capture_output=True, text=True, timeout=300, cwd=str(cwd))


def test_checkout_binary_finds_the_model_from_another_directory(tmp_path):
    p = generate(MXQ, tmp_path)
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout)
    assert out["format"] == "mxfp8" and 1 <= len(out["token_ids"]) <= 2


def test_installed_binary_finds_the_model_under_share(tmp_path):
    # note: `cmake --install` copies what the build made (it builds nothing); the build dir is build/mxq's.
    if not (MXQ.parent / "cmake_install.cmake").exists():
        pytest.skip(f"{MXQ.parent} is not a CMake build directory")
    prefix = tmp_path / "prefix"
    inst = subprocess.run(["cmake", "--install", str(MXQ.parent), "--prefix", str(prefix)], capture_output=True,
                          text=True, timeout=300)
    assert inst.returncode == 0, inst.stdout + inst.stderr
    assert (prefix / "bin" / "mxq").is_file()
    shared = prefix / "share" / "mxq" / "models" / "default"
    assert sorted(os.listdir(shared)) == sorted(os.listdir(ROOT / "models" / "default"))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    p = generate(prefix / "bin" / "mxq", elsewhere)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["format"] == "mxfp8"
    # The installed copy is the one read: without it the installed binary finds nothing.
    shutil.rmtree(shared)
    q = generate(prefix / "bin" / "mxq", elsewhere)
    assert q.returncode == 2 and str(shared) in q.stderr, q.stderr


def test_the_working_directory_is_never_searched_and_the_error_names_the_places_searched(tmp_path):
    # A binary with no model beside it, run where ./models/default exists: the old lookup took the CWD's.
    exe = tmp_path / "bin" / "mxq"
    exe.parent.mkdir()
    try:
        os.link(MXQ, exe)  # /proc/self/exe names the link's path, not build/mxq
    except OSError:
        shutil.copy2(MXQ, exe)
    (tmp_path / "work" / "models").mkdir(parents=True)
    (tmp_path / "work" / "models" / "default").symlink_to(ROOT / "models" / "default")
    p = generate(exe, tmp_path / "work")
    assert p.returncode == 2, p.stdout + p.stderr
    line = p.stderr.strip()
    assert "\n" not in line and "--model" in line, line
    assert str(tmp_path / "share" / "mxq" / "models" / "default") in line, line
    assert str(tmp_path / "models" / "default") in line, line
    # --model still takes any directory, relative to the working directory as given.
    ok = generate(exe, tmp_path / "work", "--model", "models/default", "--quantization", "mxfp8")
    assert ok.returncode == 0, ok.stderr
