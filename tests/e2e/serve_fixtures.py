"""Helpers for the `mxq serve` e2e tests: start/stop a real server, raw HTTP, SSE parsing, Prometheus parsing,
`mxq generate` as the greedy/seeded reference, the tokenizer oracle (HF `tokenizers`). Fixtures live in
conftest_serve.py. Everything here is written against the OpenAI/vLLM API, not against the server's code."""
import http.client
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import time

ROOT = pathlib.Path(__file__).resolve().parents[2]
MXQ = pathlib.Path(os.environ.get("MXQ_BIN", ROOT / "build" / "mxq"))
DEFAULT_MODEL = ROOT / "models" / "default"
EOS = 4091  # <|endoftext|> (config.json / generation_config.json of models/default)
IM_START, IM_END, THINK, END_THINK = 4092, 4093, 4094, 4095
VOCAB = 4096  # config.json vocab_size
MAX_MODEL_LEN = 2048  # max_position_embeddings

LISTEN_RE = re.compile(r"mxq serve: listening on http://(?P<host>\[[^\]]+\]|[^\s:/]+):(?P<port>\d+) \((?P<rest>.*)\)\s*$")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One running `mxq serve` process; stderr/stdout go to files under log_dir."""

    def __init__(self, args, log_dir, env=None, api_key=None, wait=True, timeout=120.0, name="serve"):
        self.args = [str(MXQ), "serve", *map(str, args)]
        self.api_key = api_key
        log_dir = pathlib.Path(log_dir)
        log_dir.mkdir(parents=True, exist_ok=True)
        self.log_path = log_dir / f"{name}.stderr"
        self.out_path = log_dir / f"{name}.stdout"
        self._err = open(self.log_path, "wb")
        self._out = open(self.out_path, "wb")
        full_env = dict(os.environ)
        full_env.pop("MXQ_API_KEY", None)
        if env:
            full_env.update(env)
        self.started = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=self._out, stderr=self._err, stdin=subprocess.DEVNULL,
                                     env=full_env, cwd=str(ROOT))
        self.host = self.port = None
        self.listen_line = None
        self.returncode = None
        self.terminated = False
        self._model_id = None
        if wait:
            self.wait_ready(timeout)

    # --- lifecycle -------------------------------------------------------------------------------------------
    def log(self, tail=4000):
        try:
            return self.log_path.read_text(errors="replace")[-tail:]
        except OSError:
            return ""

    def wait_ready(self, timeout=120.0):
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            for line in self.log_path.read_text(errors="replace").splitlines():
                m = LISTEN_RE.search(line)
                if m:
                    self.listen_line = line
                    self.host = m.group("host").strip("[]")
                    self.port = int(m.group("port"))
                    self.ready_after = time.monotonic() - self.started
                    return self
            if self.proc.poll() is not None:
                raise AssertionError(f"{' '.join(self.args)} exited {self.proc.returncode} before listening:\n"
                                     f"{self.log()}")
            time.sleep(0.05)
        self.kill()
        raise AssertionError(f"{' '.join(self.args)}: no listening line within {timeout} s:\n{self.log()}")

    def alive(self):
        return self.proc.poll() is None

    def signal(self, sig=signal.SIGTERM):
        if self.alive():
            self.proc.send_signal(sig)
            self.terminated = self.terminated or sig == signal.SIGTERM

    def stop(self, timeout=30.0):
        """SIGTERM (once), then wait; returns the exit code (None if it had to be killed)."""
        if self.returncode is not None:
            return self.returncode
        if not self.terminated:
            self.signal(signal.SIGTERM)
        try:
            self.returncode = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            self.returncode = None
        self._close_files()
        return self.returncode

    def kill(self):
        if self.alive():
            self.proc.kill()
            self.proc.wait(10)
        self._close_files()

    def _close_files(self):
        for f in (self._err, self._out):
            try:
                f.close()
            except OSError:
                pass

    # --- HTTP ----------------------------------------------------------------------------------------------
    @property
    def base_url(self):
        return f"http://{self.host}:{self.port}"

    def conn(self, timeout=120.0):
        return http.client.HTTPConnection(self.host, self.port, timeout=timeout)

    def headers(self, extra=None, auth=True):
        h = {}
        if auth and self.api_key:
            h["Authorization"] = f"Bearer {self.api_key}"
        if extra:
            h.update(extra)
        return h

    def request(self, method, path, body=None, headers=None, auth=True, timeout=120.0):
        """One request on a fresh connection; returns (status, headers dict (lower-case), body bytes)."""
        c = self.conn(timeout)
        try:
            h = self.headers(headers, auth)
            if isinstance(body, (dict, list)):
                body = json.dumps(body).encode()
                h.setdefault("Content-Type", "application/json")
            elif isinstance(body, str):
                body = body.encode()
            c.request(method, path, body=body, headers=h)
            r = c.getresponse()
            data = r.read()
            return r.status, {k.lower(): v for k, v in r.getheaders()}, data
        finally:
            c.close()

    def get(self, path, **kw):
        return self.request("GET", path, **kw)

    def post(self, path, body, **kw):
        return self.request("POST", path, body, **kw)

    def post_json(self, path, body, expect=200, **kw):
        status, _, data = self.post(path, body, **kw)
        assert status == expect, f"POST {path} -> {status}: {data[:2000]!r}"
        return json.loads(data)

    def completion(self, **body):
        body.setdefault("model", self.model_id)
        return self.post_json("/v1/completions", body)

    def chat(self, **body):
        body.setdefault("model", self.model_id)
        return self.post_json("/v1/chat/completions", body)

    @property
    def model_id(self):
        if self._model_id is None:
            status, _, data = self.get("/v1/models")
            assert status == 200, data
            self._model_id = json.loads(data)["data"][0]["id"]
        return self._model_id

    def metrics(self):
        status, headers, data = self.get("/metrics")
        assert status == 200, data[:500]
        return Metrics(data.decode())

    def healthy(self):
        try:
            return self.get("/health", timeout=10)[0] == 200
        except OSError:
            return False

    def rss_bytes(self):
        with open(f"/proc/{self.proc.pid}/status") as f:
            for line in f:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
        raise AssertionError("no VmRSS")

    def wait_idle(self, timeout=10.0, kv_zero=True):
        """Polls /metrics until nothing runs or waits (and KV usage is 0); returns the last Metrics."""
        deadline = time.monotonic() + timeout
        m = None
        while time.monotonic() < deadline:
            m = self.metrics()
            if (m.value("mxq:num_requests_running") == 0 and m.value("mxq:num_requests_waiting") == 0
                    and (not kv_zero or abs(m.value("mxq:kv_cache_usage_perc")) < 1e-9)):
                return m
            time.sleep(0.05)
        raise AssertionError("server not idle after %.1f s: running=%s waiting=%s kv=%s" % (
            timeout, m.value("mxq:num_requests_running"), m.value("mxq:num_requests_waiting"),
            m.value("mxq:kv_cache_usage_perc")))


# --- SSE -----------------------------------------------------------------------------------------------------
def parse_sse(body):
    """Splits an SSE body exactly as OpenAI frames it: every event `data: X\\n\\n`; returns the X strings."""
    text = body.decode() if isinstance(body, bytes) else body
    assert text.endswith("\n\n"), f"SSE body does not end with a blank line: {text[-200:]!r}"
    events = text[:-2].split("\n\n")
    out = []
    for e in events:
        assert e.startswith("data: ") and "\n" not in e, f"not one `data: ` line: {e[:300]!r}"
        out.append(e[len("data: "):])
    return out


def sse_json(body):
    """Returns the JSON chunks of an SSE body; asserts it ends with exactly one `data: [DONE]`."""
    events = parse_sse(body)
    assert events and events[-1] == "[DONE]", f"stream does not end with [DONE]: {events[-3:]}"
    assert events.count("[DONE]") == 1
    return [json.loads(e) for e in events[:-1]]


def stream_request(server, path, body, timeout=120.0):
    """POSTs a streaming request; returns (status, headers, [chunks]) with the SSE body checked."""
    body = dict(body, stream=True)
    status, headers, data = server.post(path, body, timeout=timeout)
    assert status == 200, f"{path} -> {status}: {data[:1000]!r}"
    return status, headers, sse_json(data)


# --- Prometheus ----------------------------------------------------------------------------------------------
_SAMPLE_RE = re.compile(r'^(?P<name>[a-zA-Z_:][a-zA-Z0-9_:]*)(\{(?P<labels>.*)\})?\s+(?P<value>\S+)(\s+\d+)?$')
_LABEL_RE = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)="((?:[^"\\]|\\.)*)"')


class Metrics:
    """Prometheus text exposition format, parsed: samples (name, labels, value) and # TYPE lines."""

    def __init__(self, text):
        self.text = text
        self.samples = []
        self.types = {}
        for line in text.splitlines():
            if not line.strip():
                continue
            if line.startswith("#"):
                parts = line.split()
                if len(parts) >= 4 and parts[1] == "TYPE":
                    self.types[parts[2]] = parts[3]
                continue
            m = _SAMPLE_RE.match(line)
            assert m, f"not a Prometheus sample line: {line!r}"
            labels = dict(_LABEL_RE.findall(m.group("labels") or ""))
            self.samples.append((m.group("name"), labels, float(m.group("value"))))

    def find(self, name, **labels):
        return [(l, v) for n, l, v in self.samples if n == name and all(l.get(k) == str(x) for k, x in labels.items())]

    def value(self, name, **labels):
        """Sum over the samples of `name` whose labels include `labels`; None when there is none."""
        f = self.find(name, **labels)
        return sum(v for _, v in f) if f else None

    def names(self):
        return {n for n, _, _ in self.samples}


# --- references -----------------------------------------------------------------------------------------------
_generate_cache = {}


def mxq_generate(prompt=None, prompt_ids=None, max_new_tokens=16, temperature=0.0, seed=None, top_logprobs=0,
                 ignore_eos=False, chat=False, extra=()):
    """`mxq generate --json` on the default model (MXFP8, CPU): the reference for greedy and seeded runs."""
    args = ["generate", "--json", "--device", "cpu", "--max-new-tokens", max_new_tokens, "--temperature", temperature]
    if prompt is not None:
        args += ["--prompt", prompt]
    else:
        args += ["--prompt-ids", ",".join(map(str, prompt_ids))]
    if seed is not None:
        args += ["--seed", seed]
    if top_logprobs:
        args += ["--top-logprobs", top_logprobs]
    if ignore_eos:
        args.append("--ignore-eos")
    if chat:
        args.append("--chat")
    args += list(extra)
    key = tuple(map(str, args))
    if key not in _generate_cache:
        p = subprocess.run([str(MXQ), *key], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, f"mxq {' '.join(key)} exited {p.returncode}: {p.stderr}"
        _generate_cache[key] = json.loads(p.stdout)
    return _generate_cache[key]


_tokenizer = None


def tokenizer():
    """HF `tokenizers` on models/default/tokenizer.json: the independent tokenizer oracle."""
    global _tokenizer
    if _tokenizer is None:
        from tokenizers import Tokenizer
        _tokenizer = Tokenizer.from_file(str(DEFAULT_MODEL / "tokenizer.json"))
    return _tokenizer


def encode(text):
    return tokenizer().encode(text, add_special_tokens=False).ids


def decode(ids, skip_special_tokens=True):
    return tokenizer().decode(list(ids), skip_special_tokens=skip_special_tokens)


def qwen3_chat(messages, add_generation_prompt=True, enable_thinking=None):
    """The Qwen3 chat template (tokenizer_config.json of Qwen3 checkpoints) written out by hand for plain
    system/user/assistant messages: a system message first is its own block; an assistant turn before the last
    user query drops its <think>…</think> part; the generation prompt adds an empty think block when
    enable_thinking is false."""
    out = []
    if messages and messages[0]["role"] == "system":
        out.append("<|im_start|>system\n" + messages[0]["content"] + "<|im_end|>\n")
    last_query = len(messages) - 1
    for i in range(len(messages) - 1, -1, -1):
        if messages[i]["role"] == "user":
            last_query = i
            break
    for i, m in enumerate(messages):
        content = m["content"]
        if m["role"] == "user" or (m["role"] == "system" and i != 0):
            out.append(f"<|im_start|>{m['role']}\n{content}<|im_end|>\n")
        elif m["role"] == "assistant":
            reasoning = ""
            if "</think>" in content:
                reasoning = content.split("</think>")[0].rstrip("\n").split("<think>")[-1].lstrip("\n")
                content = content.split("</think>")[-1].lstrip("\n")
            if i > last_query and (i == len(messages) - 1 or reasoning):
                out.append("<|im_start|>assistant\n<think>\n" + reasoning.strip("\n") + "\n</think>\n\n"
                           + content.lstrip("\n"))
            else:
                out.append("<|im_start|>assistant\n" + content)
            out.append("<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
        if enable_thinking is False:
            out.append("<think>\n\n</think>\n\n")
    return "".join(out)


def assert_openai_error(status, data, expect_status=(400,), param=None, needle=None):
    """The error body is OpenAI's {"error": {"message", "type", "param", "code"}}; optional checks that the
    message or param names the offending field."""
    if isinstance(expect_status, int):
        expect_status = (expect_status,)
    assert status in expect_status, f"expected {expect_status}, got {status}: {data[:1000]!r}"
    body = json.loads(data)
    assert isinstance(body, dict) and isinstance(body.get("error"), dict), body
    err = body["error"]
    assert set(err) >= {"message", "type", "param", "code"}, err
    assert isinstance(err["message"], str) and err["message"], err
    assert isinstance(err["type"], str) and err["type"], err
    for word in ([needle] if isinstance(needle, str) else (needle or [])):
        assert word in err["message"] or word == err.get("param"), f"error does not name {word!r}: {err}"
    if param is not None:
        assert err["param"] == param or param in err["message"], f"error does not name {param!r}: {err}"
    return err


# --- raw HTTP helpers of the server tests -----------------------------------------------------------------
PROMPT = "def fibonacci(n):\n"
MULTI = [
    {"role": "system", "content": "You are a Python expert."},
    {"role": "user", "content": "What does len() do?"},
    {"role": "assistant", "content": "It returns the length."},
    {"role": "user", "content": "And sorted()?"},
]


def still_serving(server):
    assert server.alive(), server.log()
    assert server.get("/health")[0] == 200
    r = server.completion(prompt=PROMPT, max_tokens=2, temperature=0)
    assert r["usage"]["completion_tokens"] >= 1


def post_raw(server, path, body: bytes, content_type="application/json", headers=None):
    h = {"Content-Type": content_type} if content_type else {}
    h.update(headers or {})
    return server.post(path, body, headers=h)


def post_big(server, path, body, timeout=60.0):
    """POSTs a large JSON body on a raw socket, so that a server that answers 413 early and closes is seen as
    such; returns (status or None, body)."""
    data = json.dumps(body).encode() if not isinstance(body, bytes) else body
    head = (f"POST {path} HTTP/1.1\r\nHost: {server.host}\r\nContent-Type: application/json\r\n"
            f"Content-Length: {len(data)}\r\n").encode()
    for k, v in server.headers().items():
        head += f"{k}: {v}\r\n".encode()
    return raw_exchange(server, head + b"\r\n" + data, timeout)


def raw_exchange(server, data: bytes, timeout=30.0):
    """Sends raw bytes on a fresh socket; returns (status or None, body) of the first response; None when the
    server closed the connection without one."""
    s = socket.create_connection((server.host, server.port), timeout=timeout)
    try:
        try:
            s.sendall(data)
        except (BrokenPipeError, ConnectionResetError):
            pass
        r = http.client.HTTPResponse(s)
        try:
            r.begin()
        except (http.client.RemoteDisconnected, ConnectionResetError, http.client.BadStatusLine):
            return None, b""
        return r.status, r.read()
    finally:
        s.close()
