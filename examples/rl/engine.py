"""The rollout engine: starts `mxq serve` (or uses a running one) and samples completions through the OpenAI
API (/v1/completions with n, logprobs and return_token_ids), with the official `openai` package when it is
importable and plain urllib otherwise."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import time
import urllib.error
import urllib.request

LISTEN_RE = re.compile(r"mxq serve: listening on (http://\S+)")


class Server:
    """One `mxq serve` child process; its stderr goes to log_path. Use as a context manager."""

    def __init__(self, mxq: str, model_dir: str, *, device: str, quantization: str, log_path: str,
                 name: str = "rl", extra: list[str] | None = None, timeout: float = 300.0):
        if not os.path.exists(mxq):
            raise SystemExit(f"--mxq {mxq}: no such binary (build it, or pass --server URL)")
        self.args = [mxq, "serve", "--model", model_dir, "--served-model-name", name, "--device", device,
                     "--quantization", quantization, "--port", "0", *(extra or [])]
        self.log_path, self.name = log_path, name
        self._log = open(log_path, "wb")
        t0 = time.monotonic()
        self.proc = subprocess.Popen(self.args, stdout=self._log, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL)
        self.url = self._wait_listening(timeout)
        self.startup_s = time.monotonic() - t0

    def _wait_listening(self, timeout: float) -> str:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with open(self.log_path, errors="replace") as f:
                m = LISTEN_RE.search(f.read())
            if m:
                return m.group(1)
            if self.proc.poll() is not None:
                raise SystemExit(f"{' '.join(self.args)} exited {self.proc.returncode} before listening:\n"
                                 f"{self.log_tail()}")
            time.sleep(0.05)
        self.stop()
        raise SystemExit(f"{' '.join(self.args)}: not listening after {timeout:.0f} s:\n{self.log_tail()}")

    def log_tail(self, n: int = 3000) -> str:
        with open(self.log_path, errors="replace") as f:
            return f.read()[-n:]

    def stop(self, timeout: float = 30.0) -> int | None:
        """SIGTERM (the server drains), then wait; the exit code, or None if it had to be killed."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
                return None
        self._log.close()
        return self.proc.returncode

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()


class Rollouts:
    """Samples n completions per prompt from the server at `url`."""

    def __init__(self, url: str, api_key: str | None = None, timeout: float = 600.0):
        self.url, self.api_key, self.timeout = url.rstrip("/"), api_key, timeout
        try:
            import openai  # noqa: PLC0415  (optional; urllib speaks the same API)
            self._openai = openai.OpenAI(base_url=self.url + "/v1", api_key=api_key or "unused", max_retries=0,
                                         timeout=timeout)
        except ImportError:
            self._openai = None
        self.model = self._get("/v1/models")["data"][0]["id"]

    @property
    def transport(self) -> str:
        return "openai" if self._openai is not None else "urllib"

    def _get(self, path: str) -> dict:
        req = urllib.request.Request(self.url + path)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        with urllib.request.urlopen(req, timeout=self.timeout) as r:
            return json.loads(r.read())

    def complete(self, prompts: list[str], *, n: int, max_tokens: int, temperature: float, seed: int) -> dict:
        """The completions response as a plain dict; choice i belongs to prompt i // n."""
        body = dict(model=self.model, prompt=prompts, n=n, max_tokens=max_tokens, temperature=temperature,
                    seed=seed, logprobs=0)
        if self._openai is not None:
            return self._openai.completions.create(**body, extra_body={"return_token_ids": True}).model_dump()
        body["return_token_ids"] = True
        req = urllib.request.Request(self.url + "/v1/completions", data=json.dumps(body).encode(), method="POST")
        req.add_header("Content-Type", "application/json")
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:
            raise SystemExit(f"POST /v1/completions: HTTP {e.code}: {e.read()[:500]!r}") from None


def samples_of(response: dict, n: int) -> list[dict]:
    """Per choice: prompt index, prompt / completion token ids, the engine's logprob of each completion token,
    text, finish reason. The token ids include a final EOS (vLLM counts it as a completion token), so the
    trainer scores the decision to stop as well."""
    out = []
    for ch in sorted(response["choices"], key=lambda c: c["index"]):
        ids, lps = ch.get("token_ids"), (ch.get("logprobs") or {}).get("token_logprobs")
        if ids is None or ch.get("prompt_token_ids") is None or lps is None:
            raise SystemExit("the server's choice lacks token_ids / prompt_token_ids / logprobs "
                             "(needs return_token_ids and logprobs)")
        if len(ids) != len(lps):
            raise SystemExit(f"choice {ch['index']}: {len(ids)} token ids but {len(lps)} logprobs")
        out.append({"prompt": ch["index"] // n, "prompt_ids": list(ch["prompt_token_ids"]),
                    "ids": list(ids), "engine_lp": [float(x) for x in lps], "text": ch["text"],
                    "finish": ch["finish_reason"]})
    return out
