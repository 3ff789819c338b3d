"""`mxq serve` over raw HTTP (http.client and sockets, no OpenAI client in the way): SSE framing byte for byte,
error bodies, keep-alive, /health, /tokenize and /detokenize (vLLM bodies), /abort_request (SGLang's rid /
abort_all), /metrics (Prometheus text, vLLM's names under `mxq:`). The bad-input cases H-01..H-18 are in
test_serve_bad_inputs.py."""
import json
import threading
import time

import pytest

from serve_fixtures import (EOS, MAX_MODEL_LEN, MULTI, PROMPT, VOCAB, assert_openai_error, decode, encode, parse_sse,
                            post_raw, qwen3_chat, sse_json, still_serving)



pytestmark = pytest.mark.usefixtures("leave_server_idle")


# --- /health, models, errors ----------------------------------------------------------------------------------
def test_health(server):
    status, _, _ = server.get("/health")
    assert status == 200


def test_unknown_route_and_bad_json_get_openai_error_bodies(server):
    status, headers, data = server.get("/v1/nope")
    assert_openai_error(status, data, 404)
    status, headers, data = post_raw(server, "/v1/completions", b'{"prompt": ')
    assert_openai_error(status, data, 400)
    assert headers.get("content-type", "").startswith("application/json")
    status, _, data = server.get("/v1/completions")
    assert_openai_error(status, data, (404, 405))
    still_serving(server)


# --- SSE --------------------------------------------------------------------------------------------------
def test_sse_framing_is_exactly_openai(server, model):
    for path, body, obj in [
        ("/v1/completions", {"prompt": PROMPT, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
         "text_completion"),
        ("/v1/chat/completions", {"messages": MULTI, "max_tokens": 6, "temperature": 0, "ignore_eos": True},
         "chat.completion.chunk"),
    ]:
        c = server.conn()
        c.request("POST", path, body=json.dumps(dict(body, model=model, stream=True)),
                  headers={"Content-Type": "application/json"})
        r = c.getresponse()
        assert r.status == 200
        assert r.getheader("Content-Type", "").startswith("text/event-stream")
        raw = r.read()
        c.close()
        events = parse_sse(raw)  # every event is exactly `data: <one line>\n\n`
        assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
        chunks = [json.loads(e) for e in events[:-1]]
        assert all(ch["object"] == obj for ch in chunks)
        assert len({ch["id"] for ch in chunks}) == 1 and len({ch["created"] for ch in chunks}) == 1
        assert all(ch["model"] == model for ch in chunks)
        assert raw.endswith(b"data: [DONE]\n\n") and raw.startswith(b"data: {")


def test_stream_arrives_while_it_is_generated(server, model):
    c = server.conn()
    c.request("POST", "/v1/completions", headers={"Content-Type": "application/json"}, body=json.dumps(
        {"model": model, "prompt": PROMPT, "max_tokens": 160, "temperature": 0, "ignore_eos": True, "stream": True}))
    t0 = time.monotonic()
    r = c.getresponse()
    times = []
    while True:
        line = r.readline()
        if not line:
            break
        if line.startswith(b"data: "):
            times.append(time.monotonic() - t0)
    c.close()
    assert len(times) >= 20
    total = times[-1]
    assert times[0] < 0.5 * total, f"first event at {times[0]:.3f} s of {total:.3f} s: the stream is buffered"


def test_keep_alive_serves_many_requests_on_one_connection(server, model):
    c = server.conn()
    ports = set()
    for i in range(10):
        if i % 3 == 1:
            body = {"model": model, "prompt": PROMPT, "max_tokens": 3, "temperature": 0, "stream": True}
        elif i % 3 == 2:
            body = {"model": model, "prompt": [VOCAB + 5]}  # a 400 must not cost the connection either
        else:
            body = {"model": model, "prompt": PROMPT, "max_tokens": 3, "temperature": 0}
        c.request("POST", "/v1/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
        ports.add(c.sock.getsockname()[1])
        r = c.getresponse()
        data = r.read()
        assert r.status == (400 if i % 3 == 2 else 200), data
        if i % 3 == 1:
            sse_json(data)
        assert r.getheader("Connection", "").lower() != "close" or i == 9, f"server closed after {i + 1}"
    c.request("GET", "/health")
    ports.add(c.sock.getsockname()[1])
    assert c.getresponse().status == 200
    c.close()
    assert len(ports) == 1, "the client had to reconnect"


# --- tokenize / detokenize ----------------------------------------------------------------------------------
def test_tokenize_and_detokenize(server, model):
    text = "x = 1<|endoftext|>def f():\n    return x\n"
    r = server.post_json("/tokenize", {"model": model, "prompt": text})
    assert r["tokens"] == encode(text) and r["count"] == len(r["tokens"]) and r["max_model_len"] == MAX_MODEL_LEN
    assert EOS in r["tokens"]
    r = server.post_json("/tokenize", {"prompt": text})  # model is optional
    assert r["tokens"] == encode(text)
    r = server.post_json("/tokenize", {"model": model, "messages": MULTI})
    assert r["tokens"] == encode(qwen3_chat(MULTI)) and r["count"] == len(r["tokens"])
    r = server.post_json("/tokenize", {"model": model, "messages": MULTI, "add_generation_prompt": False})
    assert r["tokens"] == encode(qwen3_chat(MULTI, add_generation_prompt=False))
    r = server.post_json("/tokenize", {"model": model, "messages": MULTI,
                                       "chat_template_kwargs": {"enable_thinking": False}})
    assert r["tokens"] == encode(qwen3_chat(MULTI, enable_thinking=False))
    ids = encode(text)
    r = server.post_json("/detokenize", {"model": model, "tokens": ids})
    assert r["prompt"] == decode(ids, skip_special_tokens=False) == text
    status, _, data = server.post("/detokenize", {"model": model, "tokens": [VOCAB]})
    assert_openai_error(status, data, 400)


# --- abort ------------------------------------------------------------------------------------------------
class Streamer(threading.Thread):
    """Reads one streaming completion in a thread: the chunks, their arrival, and how it ended."""

    def __init__(self, server, body, path="/v1/completions"):
        super().__init__(daemon=True)
        self.server, self.body, self.path = server, body, path
        self.chunks, self.done, self.error = [], False, None
        self.first = threading.Event()

    def run(self):
        try:
            c = self.server.conn(timeout=120)
            c.request("POST", self.path, body=json.dumps(dict(self.body, stream=True)),
                      headers=self.server.headers({"Content-Type": "application/json"}))
            r = c.getresponse()
            assert r.status == 200, r.read()
            while True:
                line = r.readline()
                if not line:
                    break
                line = line.rstrip(b"\n")
                if line == b"data: [DONE]":
                    self.done = True
                elif line.startswith(b"data: "):
                    self.chunks.append(json.loads(line[6:]))
                    self.first.set()
            c.close()
        except Exception as e:  # noqa: BLE001  (reported by the test)
            self.error = e
        finally:
            self.first.set()

    def finish_reasons(self):
        return [c.get("finish_reason") for ch in self.chunks for c in ch.get("choices", []) if c.get("finish_reason")]


def long_stream(server, model, **kw):
    body = {"model": model, "prompt": PROMPT, "max_tokens": 1500, "temperature": 0, "ignore_eos": True}
    body.update(kw)
    s = Streamer(server, body)
    s.start()
    assert s.first.wait(60) and s.chunks, s.error
    return s


def test_abort_request_by_rid(server, model):
    s = long_stream(server, model)
    rid = s.chunks[0]["id"]  # SGLang: the OpenAI response id is the request's rid
    server.post_json("/abort_request", {"rid": rid})
    s.join(10)
    assert not s.is_alive(), f"/abort_request {{'rid': {rid!r}}} (the response id) did not end the stream"
    assert s.error is None and s.done, (s.error, s.chunks[-1:])
    assert s.finish_reasons() == ["abort"]
    assert sum(len(c.get("text", "")) for ch in s.chunks for c in ch["choices"]) > 0
    server.wait_idle(5)


def test_abort_all(server, model):
    a, b = long_stream(server, model), long_stream(server, model, prompt="import numpy as np\n")
    server.post_json("/abort_request", {"abort_all": True})
    for s in (a, b):
        s.join(10)
        assert not s.is_alive() and s.done and s.finish_reasons() == ["abort"], s.chunks[-1:]
    server.wait_idle(5)
    still_serving(server)


# --- metrics ----------------------------------------------------------------------------------------------
GAUGES = ["mxq:num_requests_running", "mxq:num_requests_waiting", "mxq:kv_cache_usage_perc"]
COUNTERS = ["mxq:prompt_tokens_total", "mxq:generation_tokens_total", "mxq:num_preemptions_total",
            "mxq:request_success_total"]
HISTOGRAMS = ["mxq:time_to_first_token_seconds", "mxq:inter_token_latency_seconds",
              "mxq:e2e_request_latency_seconds", "mxq:request_queue_time_seconds"]


def test_metrics_names_types_and_model_label(server, model):
    server.completion(prompt=PROMPT, max_tokens=3, temperature=0, ignore_eos=True)  # every histogram has data
    status, headers, data = server.get("/metrics")
    assert status == 200 and headers.get("content-type", "").startswith("text/plain")
    m = server.metrics()
    for name in GAUGES + COUNTERS:
        got = m.find(name)
        assert got, f"{name} missing from /metrics"
        assert all(labels.get("model_name") == model for labels, _ in got), (name, got)
    for name in HISTOGRAMS:
        for suffix in ("_bucket", "_sum", "_count"):
            got = m.find(name + suffix)
            assert got and all(l.get("model_name") == model for l, _ in got), name + suffix
        assert any(l.get("le") == "+Inf" for l, _ in m.find(name + "_bucket"))
    types = m.types
    for name in GAUGES:
        assert types.get(name) == "gauge", (name, types.get(name))
    for name in HISTOGRAMS:
        assert types.get(name) == "histogram", (name, types.get(name))
    for name in COUNTERS:  # prometheus-cpp may declare the family without its _total suffix
        assert types.get(name, types.get(name.removesuffix("_total"))) == "counter", name
    reasons = {l.get("finished_reason") for l, _ in m.find("mxq:request_success_total")}
    assert "length" in reasons, reasons


def test_metrics_counters_move_as_requests_finish(server, model):
    server.wait_idle(10)
    before = server.metrics()
    prompt = encode(PROMPT)
    server.completion(prompt=prompt, max_tokens=5, temperature=0, ignore_eos=True)
    stop_ids = server.completion(prompt=prompt, max_tokens=5, temperature=0, ignore_eos=True,
                                 return_token_ids=True)["choices"][0]["token_ids"]
    server.completion(prompt=prompt, max_tokens=5, temperature=0, ignore_eos=True, stop_token_ids=[stop_ids[0]])
    after = server.wait_idle(10)

    def delta(name, **labels):
        return (after.value(name, **labels) or 0) - (before.value(name, **labels) or 0)

    assert delta("mxq:prompt_tokens_total") == 3 * len(prompt)
    assert delta("mxq:generation_tokens_total") == 5 + 5 + 1
    assert delta("mxq:request_success_total", finished_reason="length") == 2
    assert delta("mxq:request_success_total", finished_reason="stop") == 1
    for name in ("mxq:time_to_first_token_seconds", "mxq:e2e_request_latency_seconds",
                 "mxq:request_queue_time_seconds"):
        assert delta(name + "_count") == 3, name
        assert delta(name + "_sum") >= 0
    assert delta("mxq:inter_token_latency_seconds_count") == 4 + 4 + 0  # one per token after the first
    assert after.value("mxq:num_requests_running") == 0 and after.value("mxq:num_requests_waiting") == 0


def test_metrics_waiting_and_running_with_max_num_seqs_1(small_server):
    s = small_server
    model = s.model_id
    streams = [Streamer(s, {"model": model, "prompt": p, "max_tokens": 100, "temperature": 0, "ignore_eos": True})
               for p in ("a = 1\n", "b = 2\n", "c = 3\n")]
    for st in streams:
        st.start()
    seen = []
    deadline = time.monotonic() + 60
    while any(st.is_alive() for st in streams) and time.monotonic() < deadline:
        m = s.metrics()
        seen.append((m.value("mxq:num_requests_running"), m.value("mxq:num_requests_waiting")))
        time.sleep(0.02)
    for st in streams:
        st.join(10)
        assert st.done and st.finish_reasons() == ["length"], (st.error, st.chunks[-1:])
    assert max(r for r, _ in seen) == 1, seen
    assert max(w for _, w in seen) >= 1, seen
    s.wait_idle(5)
    assert s.get("/v1/models")[0] == 200
    assert json.loads(s.get("/v1/models")[2])["data"][0]["max_model_len"] == 128


def test_prefix_cache_metrics_if_exposed(server, model):
    m0 = server.metrics()
    if m0.value("mxq:prefix_cache_queries_total") is None:
        pytest.skip("no mxq:prefix_cache_* metrics")
    ids = encode("import os\n" * 300)[:400]
    a = server.completion(prompt=ids, max_tokens=4, temperature=0, logprobs=1, return_token_ids=True)
    m1 = server.metrics()
    b = server.completion(prompt=ids, max_tokens=4, temperature=0, logprobs=1, return_token_ids=True)
    m2 = server.metrics()
    assert m2.value("mxq:prefix_cache_hits_total") > m1.value("mxq:prefix_cache_hits_total")
    assert m2.value("mxq:prefix_cache_queries_total") - m1.value("mxq:prefix_cache_queries_total") >= len(ids) - 16
    # a cached prefix gives the same tokens as a computed one
    assert a["choices"][0]["token_ids"] == b["choices"][0]["token_ids"]
    for x, y in zip(a["choices"][0]["logprobs"]["token_logprobs"], b["choices"][0]["logprobs"]["token_logprobs"]):
        assert abs(x - y) < 1e-4
