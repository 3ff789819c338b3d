"""HTTP client of `mxq serve` for a trainer: weight updates by sparse delta, generation control, completions.

Server contract (SGLang names; docs/serve.md): GET /get_model_info lists every live tensor (HF name, format,
logical shape); POST /update_weights_from_delta takes a delta file (docs/refit-format.md) whose base is the live
version; POST /weights_checker {"action": "checksum"} returns each tensor's XXH3-64 of its canonical planes.
Only the standard library speaks HTTP, so the package needs numpy, zstandard and xxhash alone.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
import urllib.error
import urllib.request

import numpy as np

from .delta import Delta, canonical_checksum, diff_tensor, write_delta
from .names import is_linear, map_state_dict
from .quantize import PLAIN, QUANTIZED, plain_bytes, quantize_tensor


class MxqError(RuntimeError):
    """The server refused a request, or its answer breaks the contract; the message is the server's reason."""


def _version(v, what: str) -> int:
    try:
        n = int(str(v), 10)
    except ValueError:
        n = -1
    if n < 0:
        raise MxqError(f"{what}: weight version {v!r} is not an unsigned decimal integer")
    return n


class Client:
    """`Client(url, api_key=...).update_weights(model.state_dict())`.

    The client keeps the canonical planes it last sent (one byte per parameter for MXFP8/FP8-B128, half for
    MXFP4, the dtype's width for plain tensors) and the version they belong to. Each update quantizes the new
    tensors with mxq's rules into the live tensor's format, diffs them against the kept planes and sends a
    sparse delta; a record is an anchor on the first call, every `anchor_every` calls (0: never forced), after
    the server's version moved under the client, or where sparse would not be smaller. The server's checksums
    are then compared with the client's; any failure raises MxqError with the server's reason.

    zstd_level: None chooses per delta (raw when zstd barely shrinks it: the server then decompresses
    nothing), 0 always raw, 1..22 zstd. delta_dir: a directory the server reads too (/dev/shm on the same
    host): each delta is written there and posted as {"path": ...} instead of as the HTTP body, which the
    server reads in 4 KiB pieces (cpp-httplib 0.11: about 2 ms per MB, bench/RESULTS.md, Weight-update
    latency)."""

    def __init__(self, base_url: str = "http://127.0.0.1:8000", api_key: str | None = None, *,
                 anchor_every: int = 0, timeout: float = 600.0, zstd_level: int | None = None,
                 delta_dir: str | None = None):
        if anchor_every < 0:
            raise ValueError(f"anchor_every must be >= 0, got {anchor_every}")
        self.base_url = base_url.rstrip("/")
        self.api_key = api_key
        self.anchor_every = anchor_every
        self.timeout = timeout
        self.zstd_level = zstd_level
        self.delta_dir = delta_dir
        self._table: dict[str, tuple[str, tuple[int, ...]]] | None = None
        self._planes: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        self._planes_version: int | None = None
        self._updates = 0
        self.last_update: dict = {}

    # ---- HTTP --------------------------------------------------------------------------------------------
    def _request(self, method: str, path: str, body=None, content_type: str = "application/json") -> dict:
        data = None
        if body is not None:
            data = body if isinstance(body, (bytes, bytearray)) else json.dumps(body).encode()
        req = urllib.request.Request(self.base_url + path, data=data, method=method)
        if data is not None:
            req.add_header("Content-Type", content_type)
        if self.api_key:
            req.add_header("Authorization", f"Bearer {self.api_key}")
        try:
            with urllib.request.urlopen(req, timeout=self.timeout) as r:
                raw, status = r.read(), r.status
        except urllib.error.HTTPError as e:
            raw, status = e.read(), e.code
        except urllib.error.URLError as e:
            raise MxqError(f"{method} {path}: cannot reach {self.base_url}: {e.reason}") from None
        try:
            reply = json.loads(raw) if raw else {}
        except ValueError:
            reply = {"_text": raw[:500].decode(errors="replace")}
        if not isinstance(reply, dict):
            raise MxqError(f"{method} {path}: HTTP {status}, expected a JSON object, got {raw[:200]!r}")
        err = reply.get("error")
        if status >= 400 or err is not None or reply.get("success") is False:
            if isinstance(err, dict):
                msg = err.get("message") or json.dumps(err)
            else:
                msg = reply.get("message") or err or reply.get("_text") or f"HTTP {status}"
            raise MxqError(f"{method} {path}: {msg} (HTTP {status})")
        return reply

    # ---- server state ------------------------------------------------------------------------------------
    def model_info(self) -> dict:
        """GET /get_model_info; also refreshes the tensor table the updates quantize to."""
        info = self._request("GET", "/get_model_info")
        tensors = info.get("tensors")
        if not isinstance(tensors, list):
            raise MxqError("/get_model_info: no 'tensors' list (expected [{name, format, shape}, ...])")
        table = {}
        for t in tensors:
            name, fmt, shape = t.get("name"), t.get("format"), t.get("shape")
            if fmt not in QUANTIZED + PLAIN:
                raise MxqError(f"/get_model_info: {name}: format {fmt!r}, expected one of "
                               f"{', '.join(PLAIN + QUANTIZED)}")
            if fmt in QUANTIZED and not is_linear(name):
                raise MxqError(f"/get_model_info: {name} is {fmt}, but mxq quantizes linear projections only")
            table[name] = (fmt, tuple(int(d) for d in shape))
        self._table = table
        return info

    def tensor_table(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        if self._table is None:
            self.model_info()
        return self._table

    def weight_version(self) -> int:
        return _version(self._request("GET", "/get_weight_version").get("weight_version"), "/get_weight_version")

    def update_weight_version(self, new_version: int) -> dict:
        return self._request("POST", "/update_weight_version", {"new_version": str(int(new_version))})

    def checksums(self) -> dict[str, int]:
        """{tensor: XXH3-64 of its canonical planes} as the server computes them."""
        got = self._request("POST", "/weights_checker", {"action": "checksum"}).get("checksums")
        if not isinstance(got, dict):
            raise MxqError("/weights_checker: no 'checksums' object in the reply")
        return {k: int(v, 16) for k, v in got.items()}

    def compare_checksums(self, checksums: dict[str, int]) -> dict:
        return self._request("POST", "/weights_checker",
                             {"action": "compare", "checksums": {k: f"{v:016x}" for k, v in checksums.items()}})

    def pause(self, mode: str = "abort") -> dict:
        if mode not in ("abort", "wait", "in_place"):
            raise ValueError(f"pause mode {mode!r}, expected abort, wait or in_place")
        return self._request("POST", "/pause_generation", {"mode": mode})

    def resume(self) -> dict:
        return self._request("POST", "/continue_generation", {})

    # ---- weight updates ----------------------------------------------------------------------------------
    def planes(self, state_dict) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """The canonical planes (values, scales; uint8) the engine should hold for `state_dict`."""
        table = self.tensor_table()
        mapped = map_state_dict(state_dict, table)
        out = {}
        for name, (fmt, _) in table.items():
            if fmt in QUANTIZED:
                out[name] = quantize_tensor(fmt, mapped[name], name)
            else:
                out[name] = (plain_bytes(fmt, mapped[name], name), np.zeros(0, np.uint8))
        return out

    def _next_version(self, new_version: int | None) -> tuple[int, int]:
        """(live version, the update's new version): live + 1 by default; one that does not advance is refused."""
        live = self.weight_version()
        new_version = live + 1 if new_version is None else int(new_version)
        if new_version <= live:
            raise ValueError(f"new_version {new_version} must exceed the live version {live}")
        return live, new_version

    def update_weights(self, state_dict, *, new_version: int | None = None, force_anchor: bool = False,
                       verify: bool = True) -> dict:
        """Sends `state_dict` (HF names; numpy arrays or torch tensors on any device) as one delta and returns
        the server's reply. The new version defaults to the live one + 1."""
        t0 = time.perf_counter()
        table = self.tensor_table()
        live, new_version = self._next_version(new_version)
        planes = self.planes(state_dict)
        anchor_all = (force_anchor or self._planes_version != live
                      or (self.anchor_every and self._updates % self.anchor_every == 0))
        records = []
        for name, (fmt, shape) in table.items():
            old = None if anchor_all else self._planes.get(name)
            records.append(diff_tensor(name, fmt, shape, old, planes[name]))
        blob = write_delta(Delta(live, new_version, records), level=self.zstd_level)
        quantize_s = time.perf_counter() - t0
        if self.delta_dir is None:
            reply = self._request("POST", "/update_weights_from_delta", blob, "application/octet-stream")
        else:
            fd, path = tempfile.mkstemp(prefix="mxq-delta-", suffix=".bin", dir=self.delta_dir)
            try:
                with os.fdopen(fd, "wb") as f:
                    f.write(blob)
                reply = self._request("POST", "/update_weights_from_delta",
                                      json.dumps({"path": os.path.abspath(path)}).encode())
            finally:
                os.unlink(path)
        got = _version(reply.get("weight_version", new_version), "/update_weights_from_delta")
        if got != new_version:
            self._forget()
            raise MxqError(f"/update_weights_from_delta: server reports version {got}, sent {new_version}")
        self._planes, self._planes_version = planes, new_version
        self._updates += 1
        if verify:
            want = {r.name: r.checksum for r in records}
            have = self.checksums()
            bad = sorted(n for n in want if have.get(n) != want[n])
            if bad or set(have) != set(want):
                self._forget()
                extra = sorted(set(have) - set(want))
                raise MxqError(f"checksum mismatch after version {new_version}: {len(bad)} tensors differ "
                               f"{bad[:5]}" + (f", {len(extra)} unexpected {extra[:5]}" if extra else "") +
                               (f" (server {have[bad[0]]:016x}, client {want[bad[0]]:016x} for {bad[0]})"
                                if bad and bad[0] in have else ""))
        anchors = sum(r.anchor for r in records)
        self.last_update = {"version": new_version, "delta_bytes": len(blob), "anchors": anchors,
                            "sparse": len(records) - anchors, "client_seconds": quantize_s, **reply}
        return reply

    def update_weights_from_tensor(self, state_dict, *, quantize_on_trainer: bool = False,
                                   new_version: int | None = None, flush_cache: bool = True,
                                   abort_all_requests: bool | None = None, checksums: bool = True,
                                   fused: bool = False) -> dict:
        """POST /update_weights_from_tensor: a colocated server (same GPU, or one CUDA IPC reaches) reads the new
        weights straight from one flat CUDA buffer of this process, as one all-or-nothing update. `state_dict`:
        torch CUDA tensors (HF names, as `update_weights`). By default quantized live tensors go as bf16 (f32
        masters rounded on the device; f16 as it is) and the engine quantizes them with its startup rule;
        `quantize_on_trainer=True` sends the canonical planes instead, quantized here by the torch quantizers
        (byte-exact with the engine's, from the same bf16 source), with their XXH3-64 checksums when
        `checksums` (the server verifies them; a host copy of the planes is hashed); `fused` quantizes through
        torch.compile (same bytes; the first call per shape compiles). Plain live tensors go in
        their live dtype. Returns the server's reply; a refusal raises MxqError with its reason and the old
        weights keep serving.

        Kept planes (the base of `update_weights`' sparse deltas): with `quantize_on_trainer` and `checksums`
        the hashed host copies become the kept planes, so the next `update_weights` can be sparse; otherwise
        they are dropped and its next delta is all anchors."""
        from . import ipc  # noqa: PLC0415
        ipc.check_cuda(state_dict)  # note: before torch is imported: a numpy state dict is refused by name
        import torch  # noqa: PLC0415  (CUDA tensors: the caller has torch)
        t0 = time.perf_counter()
        table = self.tensor_table()
        live, new_version = self._next_version(new_version)
        buf, tensors, planes = ipc.pack_state_dict(state_dict, table, quantize_on_trainer=quantize_on_trainer,
                                                   fused=fused)
        kept = {}
        if quantize_on_trainer and checksums:
            for t in tensors:
                v, s = planes[t["name"]]
                kept[t["name"]] = (v.cpu().numpy(), s.cpu().numpy())
                t["checksum"] = f"{canonical_checksum(*kept[t['name']]):016x}"
        # note: the server reads the buffer on its own stream; every write to it must be done before the post
        torch.cuda.synchronize(buf.device)
        handle, offset, counter = ipc.ipc_handle(buf)
        body = {"ipc_handle": ipc.encode_handle(handle), "ipc_offset": offset, "size": int(buf.numel()),
                "tensors": tensors, "weight_version": str(new_version), "flush_cache": bool(flush_cache)}
        if abort_all_requests is not None:
            body["abort_all_requests"] = bool(abort_all_requests)
        client_s = time.perf_counter() - t0
        self._forget()  # note: whatever the answer, the kept planes no longer describe the live weights for sure
        try:
            # note: the buffer stays alive (and unchanged) until the answer: the server closes its mapping first
            reply = self._request("POST", "/update_weights_from_tensor", body)
        finally:
            ipc.release_ipc_counter(counter)
            del buf, planes
        got = _version(reply.get("weight_version", new_version), "/update_weights_from_tensor")
        if got != new_version:
            raise MxqError(f"/update_weights_from_tensor: server reports version {got}, sent {new_version}")
        if kept:
            self._planes, self._planes_version = kept, new_version
        self._updates += 1
        self.last_update = {"version": new_version, "buffer_bytes": body["size"], "tensors": len(tensors),
                            "quantize_on_trainer": quantize_on_trainer, "client_seconds": client_s, **reply}
        return reply

    def update_weights_from_disk(self, model_path: str, weight_version: int | None = None, *,
                                 flush_cache: bool | None = None, abort_all_requests: bool | None = None) -> dict:
        """POST /update_weights_from_disk; the kept planes are dropped (the next delta is an anchor)."""
        body: dict = {"model_path": str(model_path)}
        if weight_version is not None:
            body["weight_version"] = str(int(weight_version))
        if flush_cache is not None:
            body["flush_cache"] = bool(flush_cache)
        if abort_all_requests is not None:
            body["abort_all_requests"] = bool(abort_all_requests)
        self._forget()
        reply = self._request("POST", "/update_weights_from_disk", body)
        self._table = None  # note: a checkpoint of another quantization changes the formats
        return reply

    def _forget(self) -> None:
        self._planes, self._planes_version = {}, None

    # ---- generation ---------------------------------------------------------------------------------------
    def completions(self, prompt, *, model: str | None = None, max_tokens: int = 16, **params) -> dict:
        """POST /v1/completions (OpenAI shape); returns the reply object. No streaming."""
        body = {"prompt": prompt, "max_tokens": max_tokens, **params}
        if model is not None:
            body["model"] = model
        return self._request("POST", "/v1/completions", body)

    def chat_completions(self, messages: list, *, model: str | None = None, **params) -> dict:
        body = {"messages": messages, **params}
        if model is not None:
            body["model"] = model
        return self._request("POST", "/v1/chat/completions", body)


__all__ = ["Client", "MxqError", "canonical_checksum"]
