"""mxq_client.Client (the installed package) against a fake `mxq serve`: a stdlib http.server in a thread that
speaks the weight-update contract (SGLang names), decodes every delta with mxq_client.read_delta, applies it to
its own canonical planes and checks each record's checksum, as the engine's applier does. Covers the protocol
(first call anchors, then sparse deltas, anchor_every, version chain), refusals (success: false, OpenAI error
shape, checksum mismatch), the api key header, and the HF name mapping (dense, per-expert and stacked experts)."""

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import ml_dtypes
import numpy as np
import pytest
import xxhash

import mxq_client as mc

BF16 = np.dtype(ml_dtypes.bfloat16)


class FakeServer:
    """The engine's weight state: a tensor table, canonical planes per tensor, a version, and a request log."""

    def __init__(self, table, planes, api_key=None):
        self.table, self.planes, self.version, self.api_key = table, planes, 0, api_key
        self.log, self.deltas = [], []
        self.refuse_next = None  # (status, json reply) for the next weight update
        self.corrupt_checksum = None  # tensor name whose reported checksum is wrong
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}"
        self.thread = threading.Thread(target=self.httpd.serve_forever, args=(0.02,), daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()

    def checksum(self, name):
        v, s = self.planes[name]
        return xxhash.xxh3_64_intdigest(v.tobytes() + s.tobytes())

    def apply(self, blob):
        d = mc.read_delta(blob)
        self.deltas.append(d)
        if d.base_version != self.version:
            return 400, {"success": False, "message": f"delta base version {d.base_version} != live {self.version}"}
        names = [t.name for t in d.tensors]
        if sorted(names) != sorted(self.table):
            return 400, {"success": False, "message": "coverage: names differ from the engine's"}
        new = {}
        for t in d.tensors:
            fmt, shape = self.table[t.name]
            if (t.format, tuple(t.shape)) != (fmt, tuple(shape)):
                return 400, {"success": False, "message": f"{t.name}: {t.format} {t.shape}, live {fmt} {shape}"}
            planes = []
            for plane, old in zip(("values", "scales"), self.planes[t.name]):
                p = getattr(t, plane)
                if t.anchor:
                    planes.append(np.frombuffer(p.data, np.uint8).copy())
                    continue
                width = mc.entry_bytes(fmt, plane) or 1
                out = old.copy().reshape(-1, width)
                out[p.indices] = np.frombuffer(p.data, np.uint8).reshape(-1, width)
                planes.append(out.reshape(-1))
            if xxhash.xxh3_64_intdigest(planes[0].tobytes() + planes[1].tobytes()) != t.checksum:
                return 400, {"success": False, "message": f"{t.name}: checksum mismatch after apply, rolled back"}
            new[t.name] = tuple(planes)
        self.planes.update(new)
        self.version = d.new_version
        return 200, {"success": True, "message": "ok", "weight_version": str(self.version),
                     "applied_bytes": len(blob), "seconds": 0.01}

    def _handler(self):
        srv = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def reply(self, status, obj):
                body = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def route(self, method):
                n = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(n) if n else b""
                srv.log.append((method, self.path, dict(self.headers), body))
                if srv.api_key and self.headers.get("Authorization") != f"Bearer {srv.api_key}":
                    return self.reply(401, {"error": {"message": "invalid api key", "type": "invalid_request_error",
                                                      "param": None, "code": "invalid_api_key"}})
                if (method, self.path) == ("GET", "/get_model_info"):
                    return self.reply(200, {"model_path": "/m", "weight_version": str(srv.version),
                                            "quantization": "mxfp8", "tensors": [
                                                {"name": k, "format": f, "shape": list(s)}
                                                for k, (f, s) in srv.table.items()]})
                if (method, self.path) == ("GET", "/get_weight_version"):
                    return self.reply(200, {"weight_version": str(srv.version)})
                if (method, self.path) == ("POST", "/update_weights_from_delta"):
                    if srv.refuse_next:
                        status, obj = srv.refuse_next
                        srv.refuse_next = None
                        return self.reply(status, obj)
                    assert self.headers.get("Content-Type") == "application/octet-stream"
                    return self.reply(*srv.apply(body))
                if (method, self.path) == ("POST", "/weights_checker"):
                    req = json.loads(body)
                    sums = {k: f"{srv.checksum(k):016x}" for k in srv.table}
                    if srv.corrupt_checksum:
                        sums[srv.corrupt_checksum] = "0123456789abcdef"
                    if req["action"] == "checksum":
                        return self.reply(200, {"checksums": sums})
                    bad = [k for k, v in req["checksums"].items() if sums.get(k) != v]
                    return self.reply(200, {"match": not bad, "mismatches": bad})
                if (method, self.path) == ("POST", "/update_weight_version"):
                    srv.version = int(json.loads(body)["new_version"])
                    return self.reply(200, {"success": True, "weight_version": str(srv.version)})
                if (method, self.path) == ("POST", "/update_weights_from_disk"):
                    req = json.loads(body)
                    srv.version = int(req.get("weight_version", srv.version + 1))
                    return self.reply(200, {"success": True, "message": "loaded", "weight_version": str(srv.version)})
                if method == "POST" and self.path in ("/pause_generation", "/continue_generation",
                                                      "/v1/completions"):
                    return self.reply(200, {"success": True, "echo": json.loads(body or b"{}")})
                return self.reply(404, {"error": {"message": f"no route {self.path}", "type": "not_found",
                                                  "param": None, "code": 404}})

            def do_GET(self):
                self.route("GET")

            def do_POST(self):
                self.route("POST")

        return Handler


# ---- a small Qwen3 state dict -------------------------------------------------------------------------------
H, I, E, V = 64, 96, 3, 32


def dense_names():
    p = "model.layers.0."
    return {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), "lm_head.weight": (V, H),
            p + "input_layernorm.weight": (H,), p + "self_attn.q_proj.weight": (H, H),
            p + "self_attn.o_proj.weight": (H, H), p + "mlp.gate_proj.weight": (I, H),
            p + "mlp.up_proj.weight": (I, H), p + "mlp.down_proj.weight": (H, I)}


def moe_names(stacked):
    p = "model.layers.0."
    out = {"model.embed_tokens.weight": (V, H), "model.norm.weight": (H,), p + "self_attn.q_proj.weight": (H, H),
           p + "mlp.gate.weight": (E, H)}
    if stacked:
        out.update({p + "mlp.experts.gate_up_proj": (E, 2 * I, H), p + "mlp.experts.down_proj": (E, H, I)})
    else:
        for e in range(E):
            out.update({f"{p}mlp.experts.{e}.{k}_proj.weight": ((H, I) if k == "down" else (I, H))
                        for k in ("gate", "up", "down")})
    return out


def state_dict(names, seed, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return {n: (rng.standard_normal(s) * 0.05).astype(np.float32).astype(dtype) for n, s in names.items()}


def table_for(names, quant):
    return {n: ((quant if mc.is_linear(n) else "bf16"), s) for n, s in names.items()}


def initial_planes(table):
    return {n: (np.zeros(mc.plane_geometry(f, s)[0], np.uint8), np.zeros(mc.plane_geometry(f, s)[1], np.uint8))
            for n, (f, s) in table.items()}


def step(sd, seed, lr=2e-3):
    rng = np.random.default_rng(seed)
    return {n: (w.astype(np.float32) + lr * np.sign(rng.standard_normal(w.shape))).astype(w.dtype)
            for n, w in sd.items()}


@pytest.fixture
def server(request):
    quant = getattr(request, "param", "mxfp8")
    table = table_for(dense_names(), quant)
    s = FakeServer(table, initial_planes(table), api_key="sk-test")
    yield s
    s.close()


def expected_planes(client, sd):
    return {n: tuple(np.asarray(p) for p in planes) for n, planes in client.planes(sd).items()}


@pytest.mark.parametrize("server", ["mxfp8", "mxfp4", "fp8-b128"], indirect=True)
def test_first_call_anchors_then_sparse(server):
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 0)
    reply = c.update_weights(sd)
    assert reply["success"] and c.weight_version() == 1 and server.version == 1
    first = server.deltas[-1]
    assert (first.base_version, first.new_version) == (0, 1)
    assert all(t.anchor for t in first.tensors)
    sd2 = step(sd, 1)
    c.update_weights(sd2)
    second = server.deltas[-1]
    assert (second.base_version, second.new_version) == (1, 2)
    linear = [t for t in second.tensors if mc.is_linear(t.name)]
    assert linear and not any(t.anchor for t in linear)  # a small step: sparse records for the projections
    assert any(len(t.values.indices) for t in linear)
    # the fake's planes after applying the sparse delta are the client's quantization of the new weights
    want = expected_planes(c, sd2)
    for n, (v, s) in server.planes.items():
        assert v.tobytes() == want[n][0].tobytes() and s.tobytes() == want[n][1].tobytes(), n
    assert c.last_update["sparse"] >= len(linear) and c.last_update["version"] == 2
    # the api key went with every request
    assert all(h.get("Authorization") == "Bearer sk-test" for _, _, h, _ in server.log)


def test_unchanged_weights_send_empty_records(server):
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 0)
    c.update_weights(sd)
    c.update_weights(sd)
    d = server.deltas[-1]
    assert not any(t.anchor for t in d.tensors)
    assert all(len(t.values.indices) == 0 and len(t.scales.indices) == 0 for t in d.tensors)


def test_anchor_every(server):
    c = mc.Client(server.url, api_key="sk-test", anchor_every=2)
    sd = state_dict(dense_names(), 0)
    kinds = []
    for k in range(5):
        sd = step(sd, k)
        c.update_weights(sd)
        kinds.append(all(t.anchor for t in server.deltas[-1].tensors))
    assert kinds == [True, False, True, False, True]


def test_version_moved_under_the_client_sends_anchors(server):
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 0)
    c.update_weights(sd)
    c.update_weight_version(7)  # another writer moved the live version: the kept planes are stale
    assert server.version == 7
    c.update_weights(step(sd, 1))
    d = server.deltas[-1]
    assert (d.base_version, d.new_version) == (7, 8) and all(t.anchor for t in d.tensors)


def test_server_refusal_raises_with_its_message(server):
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 0)
    server.refuse_next = (400, {"success": False, "message": "model.norm.weight: W-05 NaN in new values"})
    with pytest.raises(mc.MxqError, match="model.norm.weight: W-05 NaN in new values"):
        c.update_weights(sd)
    server.refuse_next = (409, {"error": {"message": "delta base version 0 != live 3", "type": "conflict",
                                          "param": None, "code": 409}})
    with pytest.raises(mc.MxqError, match=r"delta base version 0 != live 3 \(HTTP 409\)"):
        c.update_weights(sd)
    assert server.version == 0
    c.update_weights(sd)  # the client still works after refusals
    assert server.version == 1


def test_checksum_mismatch_raises_and_next_update_anchors(server):
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 0)
    server.corrupt_checksum = "model.layers.0.mlp.up_proj.weight"
    with pytest.raises(mc.MxqError, match=r"checksum mismatch after version 1: 1 tensors differ "
                                          r"\['model.layers.0.mlp.up_proj.weight'\] \(server 0123456789abcdef"):
        c.update_weights(sd)
    server.corrupt_checksum = None
    c.update_weights(step(sd, 1))
    assert all(t.anchor for t in server.deltas[-1].tensors)  # the client no longer trusts its kept planes


def test_wrong_api_key_raises_openai_error(server):
    c = mc.Client(server.url, api_key="wrong")
    with pytest.raises(mc.MxqError, match=r"GET /get_model_info: invalid api key \(HTTP 401\)"):
        c.update_weights(state_dict(dense_names(), 0))


def test_control_routes(server):
    c = mc.Client(server.url, api_key="sk-test")
    assert c.pause("in_place")["echo"] == {"mode": "in_place"}
    assert c.resume()["success"]
    with pytest.raises(ValueError, match="pause mode 'later'"):
        c.pause("later")
    r = c.update_weights_from_disk("/ckpt/step-9", weight_version=9, flush_cache=True)
    assert r["weight_version"] == "9" and c.weight_version() == 9
    assert json.loads(server.log[-2][3]) == {"model_path": "/ckpt/step-9", "weight_version": "9", "flush_cache": True}
    assert c.completions("Hello", model="m", max_tokens=4)["echo"] == {"prompt": "Hello", "max_tokens": 4, "model": "m"}
    assert set(c.checksums()) == set(server.table)


def test_bf16_master_weights_and_plain_tensors(server):
    """bf16 trainer tensors (ml_dtypes) quantize and carry as bf16; f32 norms are rounded to bf16 by RNE."""
    c = mc.Client(server.url, api_key="sk-test")
    sd = state_dict(dense_names(), 3, BF16)
    sd["model.norm.weight"] = np.full(H, 1 + 2.0**-9, np.float32)  # a bf16 tie: rounds to even (1.0)
    c.update_weights(sd)
    assert server.planes["model.norm.weight"][0].view("<u2").tolist() == [0x3F80] * H
    emb = server.planes["model.embed_tokens.weight"][0]
    assert emb.tobytes() == sd["model.embed_tokens.weight"].tobytes()


# ---- HF names -> engine tensors ------------------------------------------------------------------------------
def split_stacked(sd):
    """The per-expert view of a stacked state dict (gate = rows [0, I), up = rows [I, 2I))."""
    out = {}
    for n, w in sd.items():
        if n.endswith("mlp.experts.gate_up_proj"):
            base = n[:-len(".gate_up_proj")]
            for e in range(E):
                out[f"{base}.{e}.gate_proj.weight"], out[f"{base}.{e}.up_proj.weight"] = w[e, :I], w[e, I:]
        elif n.endswith("mlp.experts.down_proj"):
            base = n[:-len(".down_proj")]
            for e in range(E):
                out[f"{base}.{e}.down_proj.weight"] = w[e]
        else:
            out[n] = w
    return out


@pytest.mark.parametrize("engine_stacked,trainer_stacked", [(False, False), (True, True), (False, True),
                                                            (True, False)])
def test_moe_names_map_to_engine_tensors(engine_stacked, trainer_stacked):
    table = table_for(moe_names(engine_stacked), "mxfp8")
    stacked_sd = {("module." + n if "q_proj" in n else n): w for n, w in state_dict(moe_names(True), 4).items()}
    sd = stacked_sd if trainer_stacked else split_stacked(stacked_sd)
    srv = FakeServer(table, initial_planes(table))
    try:
        c = mc.Client(srv.url)
        c.update_weights(sd)
        # the engine's tensors equal the quantization of the same weights in the engine's own layout
        own = stacked_sd if engine_stacked else split_stacked(stacked_sd)
        own = {n.removeprefix("module."): w for n, w in own.items()}
        for n, (fmt, _) in table.items():
            want = mc.quantize_tensor(fmt, own[n], n) if fmt != "bf16" else (mc.plain_bytes(fmt, own[n], n),)
            assert srv.planes[n][0].tobytes() == want[0].tobytes(), n
    finally:
        srv.close()


def test_dense_names_and_tied_lm_head():
    names = dense_names()
    table = table_for({n: s for n, s in names.items() if n != "lm_head.weight"}, "mxfp8")
    sd = {"_orig_mod." + n: w for n, w in state_dict(names, 5).items()}
    mapped = mc.map_state_dict(sd, table)
    assert set(mapped) == set(table)  # prefix stripped; a tied model's lm_head.weight is ignored


def test_names_refused_by_name():
    table = table_for(dense_names(), "mxfp8")
    sd = state_dict(dense_names(), 6)
    extra = dict(sd, **{"model.layers.0.mlp.extra.weight": np.zeros(4, np.float32)})
    extra.pop("model.norm.weight")
    with pytest.raises(ValueError, match=r"1 unknown \[model.layers.0.mlp.extra.weight\], 1 missing "
                                         r"\[model.norm.weight\]"):
        mc.map_state_dict(extra, table)
    bad = dict(sd, **{"model.layers.0.mlp.up_proj.weight": np.zeros((H, I), np.float32)})
    with pytest.raises(ValueError, match=r"model.layers.0.mlp.up_proj.weight: shape \[64, 96\] in the state dict, "
                                         r"the engine expects \[96, 64\]"):
        mc.map_state_dict(bad, table)
    # a stacked gate_up of the transposed layout cannot map to per-expert tensors of the engine
    moe = table_for(moe_names(False), "mxfp8")
    sdm = state_dict(moe_names(True), 7)
    sdm["model.layers.0.mlp.experts.gate_up_proj"] = np.zeros((E, H, 2 * I), np.float32)
    with pytest.raises(ValueError, match=r"experts.gate_up_proj: shape \[3, 64, 192\] in the state dict, expected "
                                         r"\[E > 0, 192, 64\] to give the engine's model.layers.0.mlp.experts.0.gate"):
        mc.map_state_dict(sdm, moe)


def test_table_refuses_a_quantized_non_linear():
    table = table_for(dense_names(), "mxfp8")
    table["model.embed_tokens.weight"] = ("mxfp8", (V, H))
    srv = FakeServer(table, initial_planes(table))
    try:
        with pytest.raises(mc.MxqError, match="model.embed_tokens.weight is mxfp8, but mxq quantizes linear"):
            mc.Client(srv.url).model_info()
    finally:
        srv.close()
