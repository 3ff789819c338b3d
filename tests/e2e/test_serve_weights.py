"""Weight updates into a running `mxq serve` (docs/serve.md "Weight updates"; shared/spec/bad_inputs.md W-cases):
SGLang's /update_weights_from_delta, /update_weights_from_disk, /get_weight_version, /update_weight_version,
/weights_checker, /pause_generation, /continue_generation, /flush_cache, and vLLM's /reset_prefix_cache, over
HTTP against the default model served as MXFP8. Deltas are written with the Python client's writer
(python/mxq_client/delta.py) or by `mxq delta make`; the live canonical planes come from an anchor delta of
the model against itself. Every test gets its own server (updates change its state)."""
import base64
import http.client
import json
import os
import pathlib
import shutil
import struct
import subprocess
import sys
import threading
import time

import numpy as np
import pytest

from serve_fixtures import DEFAULT_MODEL, MXQ, ROOT, encode

sys.path.insert(0, str(ROOT / "python"))
from mxq_client import delta as mcd  # noqa: E402

PROMPT = list(range(300, 340))
DOWN0 = "model.layers.0.mlp.down_proj.weight"
UP1 = "model.layers.1.mlp.up_proj.weight"
GATE2 = "model.layers.2.mlp.gate_proj.weight"
NORM = "model.norm.weight"


# --- helpers -------------------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def live(tmp_path_factory):
    """name -> (format, shape, values bytes, scales bytes) of the default model's live planes as MXFP8: an anchor
    delta of the model against itself carries every plane in full."""
    out = tmp_path_factory.mktemp("live") / "self.mxqdelta"
    p = subprocess.run([str(MXQ), "delta", "make", "--base", str(DEFAULT_MODEL), "--target", str(DEFAULT_MODEL),
                        "--quantization", "mxfp8", "--anchor", "-o", str(out)], capture_output=True, text=True,
                       timeout=300)
    assert p.returncode == 0, p.stderr
    return {t.name: t for t in mcd.read_delta(out.read_bytes()).tensors}


# note: MXQ_SERVE_DEVICE=cuda runs every case against `serve --device cuda` (the GPU machine; scripts/weights_gpu_run)
DEVICE = os.environ.get("MXQ_SERVE_DEVICE", "cpu")


def start(serve_factory, *args, api_key=None):
    return serve_factory(*args, "--device", DEVICE, api_key=api_key, device_cpu=False)


def planes(t):
    v = np.frombuffer(t.values.data, np.uint8).copy()
    s = np.frombuffer(t.scales.data, np.uint8).copy() if t.scales.data else None
    return v, s


def flip_signs(live, name, fraction=0.3, seed=0):
    """A sparse record flipping the sign bit of `fraction` of an MXFP8 tensor's values (never a NaN code)."""
    t = live[name]
    assert t.format == "mxfp8", t.format
    v, s = planes(t)
    rng = np.random.default_rng(seed)
    idx = np.flatnonzero(rng.random(v.size) < fraction)
    nv = v.copy()
    nv[idx] ^= 0x80
    rec = mcd.diff_tensor(name, t.format, t.shape, (v, s), (nv, s))
    assert not rec.anchor and rec.values.indices.size == idx.size
    return rec


_IDENTITY = {}


def identity(live, name):
    """An empty sparse record: the tensor stays as loaded (a delta covers every live tensor, W-07)."""
    if name not in _IDENTITY:
        t = live[name]
        v, sc = planes(t)
        _IDENTITY[name] = mcd.diff_tensor(name, t.format, t.shape, (v, sc), (v, sc))
    return _IDENTITY[name]


def delta_bytes(live, base, new, records, fill=True):
    """A delta of `records`, plus an identity record for every other live tensor when `fill`."""
    records = list(records)
    have = {r.name for r in records}
    if fill:
        records += [identity(live, n) for n in sorted(live) if n not in have]
    return mcd.write_delta(mcd.Delta(base, new, records))


def post_delta(s, data, expect=None, **kw):
    status, _, body = s.post("/update_weights_from_delta", data,
                             headers={"Content-Type": "application/octet-stream"}, **kw)
    j = json.loads(body)
    if expect is not None:
        assert status == expect, (status, j)
    return status, j


def greedy(s, prompt=PROMPT, n=16):
    r = s.completion(prompt=prompt, max_tokens=n, temperature=0, ignore_eos=True, return_token_ids=True)
    return r["choices"][0]["token_ids"]


def checksums(s):
    return s.post_json("/weights_checker", {"action": "checksum"})["checksums"]


def version(s):
    status, _, body = s.get("/get_weight_version")
    assert status == 200, body
    return json.loads(body)["weight_version"]


def hex16(v):
    return f"{v:016x}"


def assert_refused(status, j, needle=None, code=400):
    assert status == code, (status, j)
    assert j["success"] is False and isinstance(j["message"], str) and j["message"], j
    assert j["error"]["code"] == code and j["error"]["message"] == j["message"], j
    if needle:
        for w in [needle] if isinstance(needle, str) else needle:
            assert w in j["message"], (w, j["message"])


# safetensors, raw (bf16 has no numpy dtype): name -> [dtype, shape, bytes]
def read_st(path):
    raw = pathlib.Path(path).read_bytes()
    (n,) = struct.unpack("<Q", raw[:8])
    hdr = json.loads(raw[8:8 + n])
    data = raw[8 + n:]
    meta = hdr.pop("__metadata__", None)
    return {k: [v["dtype"], v["shape"], data[v["data_offsets"][0]:v["data_offsets"][1]]] for k, v in hdr.items()}, meta


def write_st(path, tensors, meta):
    hdr, off, blobs = {}, 0, []
    if meta is not None:
        hdr["__metadata__"] = meta
    for k, (dt, shape, b) in tensors.items():
        hdr[k] = {"dtype": dt, "shape": shape, "data_offsets": [off, off + len(b)]}
        off += len(b)
        blobs.append(b)
    h = json.dumps(hdr).encode()
    h += b" " * (-len(h) % 8)
    pathlib.Path(path).write_bytes(struct.pack("<Q", len(h)) + h + b"".join(blobs))


def edited_checkpoint(tmp_path, edit, name="ckpt"):
    """A copy of the default model with edit(tensors) applied to each shard's tensor dict (in place); the index
    follows the names each shard ends with."""
    d = tmp_path / name
    shutil.copytree(DEFAULT_MODEL, d)
    index = json.loads((d / "model.safetensors.index.json").read_text())
    weight_map = {}
    for shard in sorted({v for v in index["weight_map"].values()}):
        tensors, meta = read_st(d / shard)
        edit(tensors)
        write_st(d / shard, tensors, meta)
        weight_map.update({k: shard for k in tensors})
    index["weight_map"] = weight_map
    (d / "model.safetensors.index.json").write_text(json.dumps(index))
    return d


def flip_bf16(tensors, name=DOWN0, rows=None):
    """Sign flip of a bf16 tensor (the first `rows` rows, or all)."""
    if name in tensors:
        dt, shape, b = tensors[name]
        assert dt == "BF16"
        a = np.frombuffer(b, "<u2").copy().reshape(shape[0], -1)
        a[: rows or shape[0]] ^= 0x8000
        tensors[name][2] = a.tobytes()


# --- /update_weights_from_delta ------------------------------------------------------------------------------
def test_live_checksums_are_the_canonical_planes_xxh3(serve_factory, live):
    """/weights_checker checksum: every live tensor, 16 hex digits of XXH3-64 over the canonical planes (what
    the anchor records carry and what the Python client computes from the planes)."""
    s = start(serve_factory)
    sums = checksums(s)
    assert set(sums) == set(live)
    for name, t in live.items():
        v, sc = planes(t)
        assert sums[name] == hex16(t.checksum) == hex16(mcd.canonical_checksum(v, sc)), name
    info = json.loads(s.get("/get_model_info")[2])
    assert info["weight_version"] == "0" and info["quantization"] == "mxfp8" and info["device"] == DEVICE
    table = {t["name"]: (t["format"], tuple(t["shape"])) for t in info["tensors"]}
    assert table == {n: (t.format, tuple(t.shape)) for n, t in live.items()}


def test_W06_sparse_delta_changes_tokens_and_checksums(serve_factory, live):
    """A sparse delta with correct checksums: success, version 0 -> 1, the touched tensors' checksums are the
    records', the others unchanged, greedy tokens change; compare against the old table names exactly them."""
    s = start(serve_factory)
    before, sums0 = greedy(s), checksums(s)
    recs = [flip_signs(live, DOWN0), flip_signs(live, UP1, 0.2, 1)]
    status, j = post_delta(s, delta_bytes(live, 0, 1, recs), expect=200)
    assert j["success"] is True and j["weight_version"] == "1", j
    assert j["applied_bytes"] == sum(len(r.values.data) + len(r.scales.data) for r in recs)
    assert j["seconds"] >= 0
    stages = [name for name, ms in j["stages_ms"]]
    assert stages[:3] == ["decompress", "parse", "validate"] and all(ms >= 0 for _, ms in j["stages_ms"]), j
    assert version(s) == "1"
    sums1 = checksums(s)
    assert {n for n in sums0 if sums0[n] != sums1[n]} == {DOWN0, UP1}
    assert sums1[DOWN0] == hex16(recs[0].checksum) and sums1[UP1] == hex16(recs[1].checksum)
    after = greedy(s)
    assert after != before
    r = s.completion(prompt=PROMPT, max_tokens=4, temperature=0)
    assert r["weight_version"] == "1" and r["weight_versions"] == ["1"]
    cmp_old = s.post_json("/weights_checker", {"action": "compare", "checksums": sums0})
    assert cmp_old["match"] is False and sorted(cmp_old["mismatches"]) == sorted([DOWN0, UP1])
    assert s.post_json("/weights_checker", {"action": "compare", "checksums": sums1})["match"] is True
    # a name the engine lacks and one the request lacks are mismatches too
    partial = dict(sums1, **{"model.layers.77.mlp.up_proj.weight": sums1[NORM]})
    del partial[NORM]
    cmp_partial = s.post_json("/weights_checker", {"action": "compare", "checksums": partial})
    assert cmp_partial["match"] is False
    assert sorted(cmp_partial["mismatches"]) == sorted(["model.layers.77.mlp.up_proj.weight", NORM])
    status, _, body = s.post("/weights_checker", {"action": "verify"})
    assert status == 400 and b"action" in body


def test_W12_same_delta_twice_and_wrong_base_are_refused(serve_factory, live):
    s = start(serve_factory)
    data = delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)])
    _, first = post_delta(s, data, expect=200)
    tokens, sums = greedy(s), checksums(s)
    status, j = post_delta(s, data)
    assert_refused(status, j, needle="version")
    status, j = post_delta(s, delta_bytes(live, 5, 6, [flip_signs(live, UP1)]))
    assert_refused(status, j, needle="version")
    assert version(s) == "1" and checksums(s) == sums and greedy(s) == tokens
    m = s.metrics()
    assert m.value("mxq:weight_updates_total", result="success") == 1
    assert m.value("mxq:weight_updates_total", result="refused") == 2
    assert m.value("mxq:weight_updates_total", result="lost") == 0
    assert m.value("mxq:weight_update_seconds_count") == 3
    assert m.value("mxq:weight_update_bytes_total") == first["applied_bytes"] > 0
    assert m.value("mxq:weight_version") == 1


def test_raw_body_damaged_on_the_way_is_refused_by_its_hash(serve_factory, live):
    """A raw body (wire flags bit 0) is parsed and checked while its XXH3-64 runs beside, and nothing is written
    before the hash passed: a changed checksum byte (the body still parses and validates) and a changed record
    count (it no longer parses) are both refused as a damaged body, every byte stays, and the intact delta lands."""
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)
    rec = flip_signs(live, DOWN0)
    recs = [rec] + [identity(live, n) for n in sorted(live) if n != DOWN0]
    good = mcd.write_delta(mcd.Delta(0, 1, recs), level=0)
    assert struct.unpack_from("<I", good, 12)[0] == mcd.RAW_BODY
    # the first record's checksum: header 32, versions and count 20, then name, format, rank and dims, kind
    at = 32 + 20 + 2 + len(rec.name.encode()) + 1 + len(rec.format) + 1 + 8 * len(rec.shape) + 1
    for where in (at, 32 + 16):
        bad = bytearray(good)
        bad[where] ^= 0x40
        status, j = post_delta(s, bytes(bad))
        assert_refused(status, j, needle="XXH3-64")
    assert version(s) == "0" and checksums(s) == sums and greedy(s) == tokens
    status, j = post_delta(s, good, expect=200)
    assert [n for n, _ in j["stages_ms"]][-1] == "body hash", j
    assert checksums(s)[DOWN0] == hex16(rec.checksum)


def test_W09_W13_checksum_mismatch_on_tensor_k_restores_everything(serve_factory, live):
    """Tensor 2 of 3 carries a wrong checksum: success false naming it, every byte restored (checksums and greedy
    tokens exactly as before), the version not published."""
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)
    recs = [flip_signs(live, DOWN0), flip_signs(live, UP1), flip_signs(live, GATE2)]
    recs[1].checksum ^= 1
    status, j = post_delta(s, delta_bytes(live, 0, 1, recs))
    assert_refused(status, j, needle=[UP1, "2 of"])
    assert j["weight_version"] == "0" and version(s) == "0"
    assert checksums(s) == sums
    assert greedy(s) == tokens
    # the server keeps serving and takes the corrected delta
    recs[1].checksum ^= 1
    post_delta(s, delta_bytes(live, 0, 1, recs), expect=200)


def test_W22_corrupted_tensor_fails_verification_and_identity_is_a_no_op(serve_factory, live):
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)
    # identity: every record empty, checksum = the live one -> success, nothing changes but the version
    status, j = post_delta(s, delta_bytes(live, 0, 1, []), expect=200)
    assert j["success"] and j["applied_bytes"] == 0 and version(s) == "1"
    assert checksums(s) == sums and greedy(s) == tokens
    # corrupted: the bytes of one entry differ from the planes the checksum was computed over
    rec = flip_signs(live, DOWN0)
    data = bytearray(rec.values.data)
    data[0] ^= 0x01
    rec.values.data = bytes(data)
    status, j = post_delta(s, delta_bytes(live, 1, 2, [rec]))
    assert_refused(status, j, needle=[DOWN0, "checksum"])
    assert version(s) == "1" and checksums(s) == sums and greedy(s) == tokens


def _raw_record(monkeypatch, live, name, indices, data, plane="values"):
    """A sparse record the writer's own checks would refuse: they are switched off for this write."""
    monkeypatch.setattr(mcd, "_check_indices", lambda *a, **k: None)
    monkeypatch.setattr(mcd, "_check_new_entries", lambda *a, **k: None)
    t = live[name]
    rec = mcd.TensorDelta(name, t.format, t.shape, False, t.checksum, mcd.PlaneDelta(), mcd.PlaneDelta())
    setattr(rec, plane, mcd.PlaneDelta(np.asarray(indices, np.int64), bytes(data)))
    return rec


# note: W-04 (unsorted indices) cannot be written: every index encoding of the wire format is increasing by
# construction (gaps are unsigned), so there is no W-04 case to send.
@pytest.mark.parametrize("case", ["W01_index_past_the_plane", "W02_duplicate_index", "W05_nan_code",
                                  "W05_scale_0xff"])
def test_W01_W02_W05_bad_records_are_refused_before_any_write(serve_factory, live, monkeypatch, case):
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)
    n_values = len(live[DOWN0].values.data)
    rec = {
        "W01_index_past_the_plane": lambda: _raw_record(monkeypatch, live, DOWN0, [3, n_values], b"\x01\x02"),
        "W02_duplicate_index": lambda: _raw_record(monkeypatch, live, DOWN0, [7, 7], b"\x01\x02"),
        "W05_nan_code": lambda: _raw_record(monkeypatch, live, DOWN0, [11], b"\x7f"),
        "W05_scale_0xff": lambda: _raw_record(monkeypatch, live, DOWN0, [2], b"\xff", plane="scales"),
    }[case]()
    good = flip_signs(live, UP1)  # written first in the delta: must not stay applied
    status, j = post_delta(s, delta_bytes(live, 0, 1, [good, rec]))
    assert_refused(status, j, needle=DOWN0)
    assert version(s) == "0" and checksums(s) == sums and greedy(s) == tokens


def test_W07_W08_unknown_name_and_wrong_shape_or_format_are_refused_by_name(serve_factory, live):
    s = start(serve_factory)
    sums = checksums(s)
    t = live[NORM]
    v, _ = planes(t)
    unknown = mcd.diff_tensor("model.layers.99.mlp.up_proj.weight", "bf16", (384,), None, (v, None))
    status, j = post_delta(s, delta_bytes(live, 0, 1, [unknown]))
    assert_refused(status, j, needle="model.layers.99.mlp.up_proj.weight")
    short = mcd.diff_tensor(NORM, "bf16", (383,), None, (v[:766], None))
    status, j = post_delta(s, delta_bytes(live, 0, 1, [short]))
    assert_refused(status, j, needle=NORM)
    as_f32 = mcd.diff_tensor(NORM, "f32", (192,), None, (v, None))
    status, j = post_delta(s, delta_bytes(live, 0, 1, [as_f32]))
    assert_refused(status, j, needle=NORM)
    assert version(s) == "0" and checksums(s) == sums


def test_W25_pickle_and_other_bodies_are_refused(serve_factory):
    """Only the delta magic is read: a pickle, a safetensors blob, a truncated header, text, all 400 by name;
    another Content-Type is 415; the server keeps serving."""
    import pickle
    s = start(serve_factory)
    for blob in (pickle.dumps({"weights": [1, 2, 3]}), b"\x08\x00\x00\x00\x00\x00\x00\x00{}      " * 4,
                 b"MXQDELT", b"MXQDELTA" + b"\x00" * 40):
        status, j = post_delta(s, blob)
        assert_refused(status, j, needle="delta")
    status, _, body = s.post("/update_weights_from_delta", pickle.dumps([1]),
                             headers={"Content-Type": "application/python-pickle"})
    assert status == 415, body
    status, _, body = s.post("/update_weights_from_delta", {"path": "relative/file.mxqdelta"})
    assert status == 400 and b"absolute" in body, body
    status, _, body = s.post("/update_weights_from_delta", {"path": "/nonexistent/x.mxqdelta"})
    assert status == 400 and b"/nonexistent/x.mxqdelta" in body, body
    status, _, body = s.post("/update_weights_from_delta", {"pth": "/x"})
    assert status == 400 and b"pth" in body, body
    assert version(s) == "0" and len(greedy(s)) == 16


def test_delta_from_a_server_side_path_and_the_body_cap(serve_factory, live, tmp_path):
    """--max-update-bytes caps a posted body (413), a file named by path and the decompressed body (400)."""
    cap = 65536
    s = start(serve_factory, "--max-update-bytes", cap)
    data = delta_bytes(live, 0, 1, [flip_signs(live, DOWN0, 0.001)])
    assert len(data) < cap and struct.unpack_from("<Q", data, 16)[0] < cap
    path = tmp_path / "d.mxqdelta"
    path.write_bytes(data)
    assert s.post_json("/update_weights_from_delta", {"path": str(path)})["weight_version"] == "1"
    big = delta_bytes(live, 1, 2, [flip_signs(live, DOWN0, 0.3)])
    assert len(big) > cap
    status, _, body = s.post("/update_weights_from_delta", big, headers={"Content-Type": "application/octet-stream"})
    assert status == 413, body
    path.write_bytes(big)
    status, _, body = s.post("/update_weights_from_delta", {"path": str(path)})
    assert status == 400 and b"max-update-bytes" in body, body
    assert s.healthy() and version(s) == "1"


def test_W17_A_B_A_is_bit_exact(serve_factory, live):
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)
    t = live[DOWN0]
    v, sc = planes(t)
    fwd = flip_signs(live, DOWN0)
    nv = v.copy()
    nv[fwd.values.indices] = np.frombuffer(fwd.values.data, np.uint8)
    back = mcd.diff_tensor(DOWN0, t.format, t.shape, (nv, sc), (v, sc))
    post_delta(s, delta_bytes(live, 0, 1, [fwd]), expect=200)
    b_tokens, b_sums = greedy(s), checksums(s)
    assert b_tokens != tokens
    post_delta(s, delta_bytes(live, 1, 2, [back]), expect=200)
    assert checksums(s) == sums and greedy(s) == tokens
    post_delta(s, delta_bytes(live, 2, 3, [fwd]), expect=200)
    assert checksums(s) == b_sums and greedy(s) == b_tokens
    assert version(s) == "3"


def test_W15_concurrent_updates_are_serialized(serve_factory, live):
    """Two identical deltas at once: one applies, the other waits its turn and is refused by the chain rule;
    the weights are those of one application."""
    s = start(serve_factory)
    data = delta_bytes(live, 0, 1, [flip_signs(live, DOWN0), flip_signs(live, UP1), flip_signs(live, GATE2)])
    results = []
    threads = [threading.Thread(target=lambda: results.append(post_delta(s, data))) for _ in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(60)
    assert sorted(st for st, _ in results) == [200, 400, 400, 400], results
    for st, j in results:
        if st == 400:
            assert_refused(st, j, needle="version")
    expect = mcd.read_delta(data)
    sums = checksums(s)
    assert all(sums[t.name] == hex16(t.checksum) for t in expect.tensors)
    assert version(s) == "1"


# --- prefix cache, in-flight requests ------------------------------------------------------------------------
def test_W19_prefix_cache_is_dropped_by_an_update_and_by_flush(serve_factory, live):
    s = start(serve_factory)
    ids = encode("import os\n" * 300)[:400]

    def run():
        m0 = s.metrics().value("mxq:prefix_cache_hits_total")
        r = s.completion(prompt=ids, max_tokens=4, temperature=0, return_token_ids=True)
        return s.metrics().value("mxq:prefix_cache_hits_total") - m0, r["usage"]["prompt_tokens_details"]["cached_tokens"], r

    run()
    hits, cached, _ = run()
    assert hits > 0 and cached > 0  # the cache works, so its absence below means it was dropped
    post_delta(s, delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)]), expect=200)
    hits, cached, r = run()
    assert hits == 0 and cached == 0, (hits, cached)
    hits, cached, r2 = run()
    assert hits > 0 and r2["choices"][0]["token_ids"] == r["choices"][0]["token_ids"]
    for path in ("/flush_cache", "/reset_prefix_cache"):
        assert s.post_json(path, {})["success"] is True
        hits, cached, _ = run()
        assert hits == 0 and cached == 0, path
        run()


def _stream(s, max_tokens):
    c = http.client.HTTPConnection(s.host, s.port, timeout=120)
    body = json.dumps({"model": s.model_id, "prompt": PROMPT, "max_tokens": max_tokens, "temperature": 0,
                       "ignore_eos": True, "stream": True, "return_token_ids": True})
    c.request("POST", "/v1/completions", body=body, headers=s.headers({"Content-Type": "application/json"}))
    r = c.getresponse()
    assert r.status == 200

    def events():
        for line in r:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]":
                yield json.loads(line[6:])
    return c, events()


def test_W20_in_flight_stream_across_an_update_reports_both_versions(serve_factory, live):
    s = start(serve_factory)
    c, events = _stream(s, 1500)
    first = [next(events) for _ in range(3)]
    assert all(e["weight_version"] == "0" for e in first)
    post_delta(s, delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)]), expect=200)
    rest = list(events)
    c.close()
    chunks = first + rest
    seen = [e["weight_version"] for e in chunks if e["choices"]]
    assert seen[0] == "0" and seen[-1] == "1" and seen == sorted(seen), seen[:5]
    assert chunks[-1]["weight_versions"] == ["0", "1"], chunks[-1]
    assert chunks[-1]["choices"][0]["finish_reason"] == "length"


def test_W20_non_streaming_request_across_an_update(serve_factory, live):
    s = start(serve_factory)
    out = {}
    th = threading.Thread(target=lambda: out.update(s.completion(prompt=PROMPT, max_tokens=1500, temperature=0,
                                                                 ignore_eos=True)))
    th.start()
    deadline = time.monotonic() + 30
    while s.metrics().value("mxq:generation_tokens_total") < 5 and time.monotonic() < deadline:
        time.sleep(0.01)
    post_delta(s, delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)]), expect=200)
    th.join(120)
    assert out["weight_versions"] == ["0", "1"] and out["weight_version"] == "1", out.get("weight_versions")
    assert out["usage"]["completion_tokens"] == 1500


# --- pause / continue ----------------------------------------------------------------------------------------
def _tokens_total(s):
    return s.metrics().value("mxq:generation_tokens_total")


def test_pause_in_place_stops_stepping_and_keeps_requests(serve_factory, live):
    s = start(serve_factory)
    reference = greedy(s, n=300)
    c, events = _stream(s, 300)
    ids = list(next(events)["choices"][0].get("token_ids") or [])
    assert s.post_json("/pause_generation", {"mode": "in_place"})["success"]
    t0 = _tokens_total(s)
    time.sleep(0.5)
    assert _tokens_total(s) == t0
    # a new request queues while paused (not refused), and an update is allowed
    queued = {}
    th = threading.Thread(target=lambda: queued.update(s.completion(prompt=PROMPT, max_tokens=4, temperature=0)))
    th.start()
    time.sleep(0.3)
    assert th.is_alive()
    assert s.post_json("/update_weight_version", {"new_version": "7"})["weight_version"] == "7"
    assert s.post_json("/continue_generation", {})["success"]
    th.join(60)
    assert queued["choices"][0]["finish_reason"] == "length" and queued["weight_version"] == "7"
    for e in events:
        if e["choices"]:
            ids += e["choices"][0].get("token_ids") or []
    c.close()
    assert ids == reference  # paused in place, the request resumed where it stopped


def test_pause_abort_ends_running_requests_and_wait_lets_them_finish(serve_factory):
    s = start(serve_factory)
    out = {}
    th = threading.Thread(target=lambda: out.update(s.completion(prompt=PROMPT, max_tokens=1800, temperature=0,
                                                                 ignore_eos=True)))
    th.start()
    deadline = time.monotonic() + 30
    while _tokens_total(s) < 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    # default mode is SGLang's: abort
    assert s.post_json("/pause_generation", {})["success"]
    th.join(60)
    assert out["choices"][0]["finish_reason"] == "abort"
    assert out["usage"]["completion_tokens"] < 1800
    s.post_json("/continue_generation", {})

    out2 = {}
    th = threading.Thread(target=lambda: out2.update(s.completion(prompt=PROMPT, max_tokens=300, temperature=0,
                                                                  ignore_eos=True)))
    th.start()
    deadline = time.monotonic() + 30
    while _tokens_total(s) < out["usage"]["completion_tokens"] + 3 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert s.post_json("/pause_generation", {"mode": "wait"})["success"]
    late = {}
    th2 = threading.Thread(target=lambda: late.update(s.completion(prompt=PROMPT, max_tokens=4, temperature=0)))
    th2.start()
    th.join(60)
    assert out2["choices"][0]["finish_reason"] == "length"  # the running one finished while paused
    time.sleep(0.3)
    assert th2.is_alive()  # the new one waits
    s.post_json("/continue_generation", {})
    th2.join(60)
    assert late["choices"][0]["finish_reason"] == "length"
    status, _, body = s.post("/pause_generation", {"mode": "retract"})
    assert status == 400 and b"mode" in body


# --- /update_weights_from_disk -------------------------------------------------------------------------------
def test_update_from_disk_equals_a_fresh_load_of_the_new_checkpoint(serve_factory, tmp_path):
    """A bf16 checkpoint is quantized by the startup rule: the live checksums and greedy tokens after the update
    equal those of a server started on the new checkpoint; a pre-quantized copy (`mxq quantize`) gives the
    same bytes; version and the update flags."""
    new = edited_checkpoint(tmp_path, lambda t: flip_bf16(t, DOWN0, rows=100))
    s = start(serve_factory)
    before = greedy(s)
    j = s.post_json("/update_weights_from_disk", {"model_path": str(new), "weight_version": "12",
                                                  "flush_cache": False, "abort_all_requests": True})
    assert j["success"] is True and j["weight_version"] == "12", j
    fresh = start(serve_factory, str(new), "--quantization", "mxfp8")
    assert checksums(s) == checksums(fresh)
    assert greedy(s) == greedy(fresh) != before
    quant = tmp_path / "quant"
    p = subprocess.run([str(MXQ), "quantize", str(DEFAULT_MODEL), str(quant), "--to", "mxfp8"],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stderr
    j = s.post_json("/update_weights_from_disk", {"model_path": str(quant)})
    assert j["weight_version"] == "13"
    assert greedy(s) == before
    status, _, body = s.post("/update_weights_from_disk", {"model_path": str(quant), "weight_version": "13"})
    assert status == 400 and b"weight_version" in body


def test_W07_W08_from_disk_missing_unknown_or_retyped_tensors_are_refused_by_name(serve_factory, tmp_path):
    s = start(serve_factory)
    tokens, sums = greedy(s), checksums(s)

    def drop(t):
        t.pop(UP1, None)

    def add(t):
        if NORM in t:
            t["model.layers.0.mlp.extra_proj.weight"] = list(t[NORM])

    def retype(t):
        if NORM in t:
            dt, shape, b = t[NORM]
            f = (np.frombuffer(b, "<u2").astype(np.uint32) << 16).view("<f4")
            t[NORM] = ["F32", shape, f.tobytes()]

    for edit, needle in ((drop, UP1), (add, "extra_proj"), (retype, NORM)):
        d = edited_checkpoint(tmp_path, edit, name=edit.__name__)
        status, _, body = s.post("/update_weights_from_disk", {"model_path": str(d)})
        j = json.loads(body)
        assert_refused(status, j, needle=needle)
    for bad in ({"model_path": str(tmp_path / "none")}, {}, {"model_path": str(DEFAULT_MODEL), "weight_version": "v2"},
                {"model_path": str(DEFAULT_MODEL), "weight_version": "-1"},
                {"model_path": str(DEFAULT_MODEL), "load_format": "dummy"}):
        status, _, body = s.post("/update_weights_from_disk", bad)
        assert status == 400, (bad, body)
    assert version(s) == "0" and checksums(s) == sums and greedy(s) == tokens


# --- versions, auth ------------------------------------------------------------------------------------------
def test_W12_weight_version_fields_must_be_decimal_integers(serve_factory):
    s = start(serve_factory)
    for bad in ("abc", "1.5", "-3", "", " 4", "0x10", "99999999999999999999999", 1.5, True):
        status, _, body = s.post("/update_weight_version", {"new_version": bad})
        assert status == 400 and b"new_version" in body, (bad, body)
    assert version(s) == "0"
    assert s.post_json("/update_weight_version", {"new_version": "41"})["weight_version"] == "41"
    assert s.post_json("/update_weight_version", {"new_version": 42})["weight_version"] == "42"
    assert version(s) == "42"
    assert s.completion(prompt=PROMPT, max_tokens=2)["weight_version"] == "42"


def test_W25_api_key_guards_every_weight_route(serve_factory, live):
    s = start(serve_factory, "--api-key", "sekret", api_key="sekret")
    data = delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)])
    routes = [("POST", "/update_weights_from_delta", data), ("POST", "/update_weights_from_disk", {"model_path": "/x"}),
              ("GET", "/get_weight_version", None), ("POST", "/update_weight_version", {"new_version": "3"}),
              ("POST", "/weights_checker", {"action": "checksum"}), ("POST", "/pause_generation", {}),
              ("POST", "/continue_generation", {}), ("POST", "/flush_cache", {}), ("POST", "/reset_prefix_cache", {}),
              ("GET", "/get_model_info", None),
              ("POST", "/update_weights_from_tensor", {"ipc_handle": "", "size": 1, "tensors": []})]
    for method, path, body in routes:
        status, _, out = s.request(method, path, body, auth=False)
        assert status == 401, (path, status, out)
    assert version(s) == "0"
    status, j = post_delta(s, data)
    assert status == 200 and j["weight_version"] == "1"


def test_W25_update_from_tensor_takes_mxqs_manifest_and_a_cpu_engine_refuses_it_by_name(serve_factory, live):
    s = start(serve_factory)
    # SGLang's pickled torch objects are not read (W-25): the field is unknown
    status, _, out = s.post("/update_weights_from_tensor", {"serialized_named_tensors": []})
    assert status == 400 and "serialized_named_tensors" in json.loads(out)["message"], out
    handle = base64.b64encode(bytes(range(64))).decode()
    tensors, at = [], 0
    for name, t in live.items():
        tensors.append({"name": name, "dtype": t.format, "shape": list(t.shape), "offset": at})
        at += (len(t.values.data) + 15) // 16 * 16
        if t.scales.data:
            tensors[-1]["scales_offset"] = at
            at += (len(t.scales.data) + 15) // 16 * 16
    good = {"ipc_handle": handle, "size": at, "tensors": tensors}
    for body, field in [({**good, "ipc_handle": "AAAA"}, "ipc_handle"), ({**good, "size": 0}, "size"),
                        ({**good, "tensors": []}, "tensors"),
                        ({**good, "tensors": [{**tensors[0], "dtype": "e4m3"}] + tensors[1:]}, "tensors[0].dtype"),
                        ({**good, "tensors": [{**tensors[0], "checksum": "xyz"}] + tensors[1:]}, "tensors[0].checksum"),
                        ({**good, "weight_version": "v2"}, "weight_version"),
                        ({**good, "ipc_handle": base64.b64encode(b"\x02e" + bytes(64)).decode()}, "expandable")]:
        status, _, out = s.post("/update_weights_from_tensor", body)
        assert status == 400, (field, out)
        j = json.loads(out)
        assert j["success"] is False and field in j["message"], (field, j)
    status, _, out = s.post("/update_weights_from_tensor", good)
    j = json.loads(out)
    # a CPU engine refuses the route by name; a CUDA one cannot open a made-up handle
    assert status == 400 and ("serve --device cuda" if DEVICE == "cpu" else "cudaIpcOpenMemHandle") in j["message"], j
    assert version(s) == "0"


def test_W14_W23_sleep_and_offload_routes_do_not_exist_and_the_weights_stay(serve_factory, live):
    """mxq has no sleep / offload (SGLang's /release_memory_occupation, /resume_memory_occupation): the weights
    never leave their buffers, so an update can never meet unmapped memory (W-14) and no wake can restore stale
    bytes (W-23). The routes answer 404 and the last committed weights keep serving."""
    s = start(serve_factory)
    post_delta(s, delta_bytes(live, 0, 1, [flip_signs(live, DOWN0)]), expect=200)
    sums, tokens = checksums(s), greedy(s)
    for path in ("/release_memory_occupation", "/resume_memory_occupation"):
        status, _, _ = s.post(path, {})
        assert status == 404, path
    assert checksums(s) == sums and greedy(s) == tokens and version(s) == "1"
