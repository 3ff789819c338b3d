"""POST /update_weights_from_tensor, trainer side: every live tensor packed into one flat uint8 CUDA buffer, shared
with a colocated `mxq serve` through a CUDA IPC handle (docs/serve.md, "Weight updates").

The manifest names each tensor's planes by their byte offsets in that buffer. `build_manifest` lays them out
(a pure function, tested without a GPU); `pack_state_dict` fills the buffer on the trainer's device; `ipc_handle`
takes the 64-byte cudaIpcMemHandle_t and the buffer's offset inside its allocation from torch's own sharing call.
"""

from __future__ import annotations

import base64

import numpy as np

from .names import map_state_dict
from .delta import plane_geometry
from .quantize import PLAIN, QUANTIZED, quantize_planes, raise_nan_flags

ALIGN = 16  # note: every plane starts on 16 bytes: the server reads planes with 16-byte vector loads
SOURCE_DTYPES = ("bf16", "f16", "f32")
IPC_HANDLE_BYTES = 64  # sizeof(cudaIpcMemHandle_t)
# torch's shareable handle (c10 CUDACachingAllocator::shareIpcHandle): a version byte (2 up to torch 2.12, 3 in
# 2.13), a type byte ('c': a cudaMalloc block, 'e': an expandable segment), then the payload; older torch
# returned the bare 64-byte handle.
_TORCH_HANDLE_MALLOC = ord("c")
_TORCH_HANDLE_EXPANDABLE = ord("e")


def _align(n: int, a: int = ALIGN) -> int:
    return -(-n // a) * a


def build_manifest(entries, align: int = ALIGN) -> tuple[list[dict], int]:
    """Lays out planes back to back in one buffer. `entries`: (name, dtype, shape, values bytes, scales bytes)
    in the order the buffer holds them (scales bytes 0 for a source or plain tensor). Returns the manifest's
    `tensors` list ({name, dtype, shape, offset[, scales_offset]}) and the buffer's size; every offset is a
    multiple of `align` and every plane lies inside [0, size). Refuses repeated names, unknown dtypes, a
    scales plane on a source dtype or none on a quantized one."""
    if align <= 0 or align & (align - 1):
        raise ValueError(f"alignment {align} is not a power of two")
    out, seen, pos = [], set(), 0
    for name, dtype, shape, values, scales in entries:
        if name in seen:
            raise ValueError(f"{name}: named twice in the update")
        seen.add(name)
        if dtype not in SOURCE_DTYPES + QUANTIZED:
            raise ValueError(f"{name}: dtype {dtype!r}, expected one of {', '.join(SOURCE_DTYPES + QUANTIZED)}")
        if values < 0 or scales < 0:
            raise ValueError(f"{name}: negative plane size ({values} + {scales} bytes)")
        if (dtype in QUANTIZED) != (scales > 0):
            raise ValueError(f"{name}: {dtype} with a scales plane of {scales} bytes"
                             + (" (quantized dtypes carry one)" if dtype in QUANTIZED else
                                " (source dtypes carry none)"))
        t = {"name": name, "dtype": dtype, "shape": [int(d) for d in shape], "offset": _align(pos, align)}
        pos = t["offset"] + values
        if dtype in QUANTIZED:
            t["scales_offset"] = _align(pos, align)
            pos = t["scales_offset"] + scales
        out.append(t)
    return out, _align(pos, align)


def _source_bytes(dtype: str, shape) -> int:
    width = {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    return int(np.prod(shape, dtype=np.int64)) * width if len(shape) else width


def ipc_handle(buf) -> tuple[bytes, int, tuple]:
    """(the 64-byte cudaIpcMemHandle_t of the allocation holding `buf`, `buf`'s first byte's offset in it, the
    ref counter torch attached). note: `_share_cuda_` returns (device, handle, storage bytes, storage offset in
    the allocation, ref counter handle, ref counter offset, event handle, event sync required), as
    torch.multiprocessing.reductions.reduce_tensor reads it; the tensor's own offset in its storage is added."""
    storage = buf.untyped_storage()
    shared = storage._share_cuda_()
    _, handle, _, storage_offset, ref_handle, ref_offset = shared[:6]
    handle = bytes(handle)
    if len(handle) == IPC_HANDLE_BYTES + 2 and handle[1] == _TORCH_HANDLE_MALLOC:
        handle = handle[2:]
    elif len(handle) != IPC_HANDLE_BYTES:
        if len(handle) > 1 and handle[1] == _TORCH_HANDLE_EXPANDABLE:
            raise RuntimeError("update_weights_from_tensor: the buffer lives in an expandable segment of torch's "
                               "allocator, which has no cudaIpcMemHandle_t; run the trainer with "
                               "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:False")
        raise RuntimeError(f"update_weights_from_tensor: torch returned a sharing handle of {len(handle)} bytes, "
                           f"expected {IPC_HANDLE_BYTES} (or {IPC_HANDLE_BYTES + 2} with torch's version and "
                           f"type bytes)")
    offset = int(storage_offset) + buf.storage_offset() * buf.element_size()
    return handle, offset, (ref_handle, ref_offset, buf.device)


def release_ipc_counter(counter) -> None:
    """Hands back the reference `_share_cuda_` counted for the receiver, as a torch receiver would once done.
    note: torch keeps a shared block out of its allocator (its IPC limbo) until every receiver released it;
    mxq's server is not a torch process, so without this every update would pin one buffer of device memory."""
    import torch  # noqa: PLC0415
    ref_handle, ref_offset, device = counter
    if ref_handle:
        torch.UntypedStorage._release_ipc_counter(ref_handle, ref_offset, device=device)


def check_cuda(state_dict):
    """The device of a state dict of torch CUDA float tensors, all on one device; anything else is refused."""
    device = None
    for k, v in state_dict.items():
        if type(v).__module__.split(".")[0] != "torch" or not hasattr(v, "is_cuda"):
            raise TypeError(f"update_weights_from_tensor: {k} is a {type(v).__name__}, expected a torch CUDA "
                            f"tensor (use update_weights for numpy arrays or CPU tensors)")
        if not v.is_cuda:
            raise TypeError(f"update_weights_from_tensor: {k} is on {v.device}, expected a CUDA tensor "
                            f"(use update_weights for CPU tensors)")
        if str(v.dtype) not in ("torch.bfloat16", "torch.float16", "torch.float32"):
            raise TypeError(f"update_weights_from_tensor: {k} is {v.dtype}, expected bfloat16, float16 or "
                            f"float32")
        if device is None:
            device = v.device
        elif v.device != device:
            raise TypeError(f"update_weights_from_tensor: {k} is on {v.device}, the others on {device}; one "
                            f"buffer on one device is shared")
    if device is None:
        raise ValueError("update_weights_from_tensor: the state dict is empty")
    return device


def _as_source(torch, t, name: str):
    """The tensor the engine quantizes: bf16 and f16 as they are, f32 masters rounded to bf16 (RNE) on the device
    (half the bytes; the weights a bf16 export would serve)."""
    if t.dtype in (torch.bfloat16, torch.float16):
        return t.detach().contiguous()
    if t.dtype == torch.float32:
        return t.detach().to(torch.bfloat16).contiguous()
    raise TypeError(f"{name}: dtype {t.dtype}, expected bfloat16, float16 or float32")


def _plain(torch, t, dtype: str):
    want = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[dtype]
    return t.detach().to(want).contiguous()


def pack_state_dict(state_dict, table, *, quantize_on_trainer: bool = False, fused: bool = False):
    """The flat uint8 CUDA buffer and the manifest's `tensors` for `state_dict` mapped onto `table` ({name:
    (format, shape)}, the engine's), in the table's order. Quantized live tensors go as their source (bf16 / f16,
    f32 rounded to bf16) for the engine to quantize, or with `quantize_on_trainer` as their canonical planes in
    the live format (the client's torch quantizers, byte-exact with the engine's, from the same source); plain
    live tensors go in their live dtype. `fused`: the quantizers through torch.compile (`quantize_planes`).
    Returns (buffer, tensors, planes): planes {name: (values, scales)} are uint8 views into the buffer (scales
    empty for a source or plain tensor). The buffer is on the tensors' device (the client checks they are CUDA
    tensors; the layout is tested on CPU tensors too)."""
    p = Packer(state_dict, table, quantize_on_trainer=quantize_on_trainer, fused=fused)
    return p.pack(), p.tensors, p.planes


class Packer:
    """Packs one state dict into one buffer again and again: a trainer's parameters keep their storage across
    steps (the optimizer updates them in place), so the layout and the buffer are made once. With `graph` (CUDA,
    fused) the whole packing, every tensor's quantize and copy, is captured once as a CUDA graph and `pack()` is
    one replay and one host read (the NaN flags): no Python per tensor. note: the buffer is one allocation of
    its own (torch's allocator gives a block this large its own segment), so its IPC handle maps this buffer and
    nothing else of the trainer's memory; it is filled one tensor at a time, so the only copy of the model
    beside the trainer's is the buffer itself."""

    def __init__(self, state_dict, table, *, quantize_on_trainer: bool = False, fused: bool = False,
                 graph: bool = False):
        import torch  # noqa: PLC0415
        self._torch = torch
        self._mapped = map_state_dict(state_dict, table)
        self._fused = fused
        self._entries = []
        for name, (fmt, shape) in table.items():
            if fmt in QUANTIZED and quantize_on_trainer:
                self._entries.append((name, fmt, shape, *plane_geometry(fmt, tuple(shape))))
            else:
                dtype = fmt if fmt in PLAIN else ("f16" if self._mapped[name].dtype == torch.float16 else "bf16")
                self._entries.append((name, dtype, shape, _source_bytes(dtype, shape), 0))
        self.tensors, size = build_manifest(self._entries)
        device = next(iter(self._mapped.values())).device
        self.buffer = torch.empty(size, dtype=torch.uint8, device=device)
        self.planes = {}
        for t, (name, _, _, vb, sb) in zip(self.tensors, self._entries):
            so = t.get("scales_offset", 0)
            self.planes[name] = (self.buffer[t["offset"]:t["offset"] + vb], self.buffer[so:so + sb])
        self._graph = None
        if graph:
            if device.type != "cuda" or not fused:
                raise ValueError("Packer: graph=True needs CUDA tensors and fused=True")
            # note: warm up (compile, first launches) on a side stream, then capture, as torch's docs ask
            side = torch.cuda.Stream(device)
            side.wait_stream(torch.cuda.current_stream(device))
            with torch.cuda.stream(side):
                raise_nan_flags(self._fill())
            torch.cuda.current_stream(device).wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                flags = self._fill()
                self._bad = torch.stack([f[1] for f in flags]).any()
            self._graph_flags = flags

    def _fill(self) -> list:
        torch, flags = self._torch, []
        for name, dtype, _, _, _ in self._entries:
            values, scales = self.planes[name]
            src = self._mapped[name]
            if dtype in QUANTIZED:
                v, s = quantize_planes(dtype, _as_source(torch, src, name), name, fused=self._fused,
                                       nan_flags=flags)
                values.copy_(v)
                scales.copy_(s)
            else:
                values.copy_(_plain(torch, src, dtype).reshape(-1).view(torch.uint8))
        return flags

    def pack(self):
        """The buffer, filled from the state dict's current values; a NaN/Inf block is refused by name."""
        if self._graph is None:
            raise_nan_flags(self._fill())  # note: one host read for the whole state dict
        else:
            self._graph.replay()
            if bool(self._bad):
                raise_nan_flags(self._fill())  # note: eager again, to name the tensor and block
        return self.buffer


def _planes_of(tensors):
    """(name, plane, start, bytes, entry width) of every plane of a manifest, in buffer order."""
    for t in tensors:
        dtype, shape = t["dtype"], tuple(t["shape"])
        if dtype in QUANTIZED:
            vb, sb = plane_geometry(dtype, shape)
            yield t["name"], "values", t["offset"], vb, 1
            yield t["name"], "scales", t["scales_offset"], sb, 4 if dtype == "fp8-b128" else 1
        else:
            yield t["name"], "values", t["offset"], _source_bytes(dtype, shape), 4 if dtype == "f32" else 2


def _to_host(torch, *tensors):
    """numpy copies of device tensors. note: on CUDA through pinned buffers, every copy queued before one
    synchronisation (a pageable copy is staged and synchronised one by one, several times slower)."""
    if tensors[0].device.type != "cuda":
        return [t.cpu().numpy() for t in tensors]
    host = [torch.empty(t.shape, dtype=t.dtype, pin_memory=True) for t in tensors]
    for h, t in zip(host, tensors):
        h.copy_(t, non_blocking=True)
    torch.cuda.current_stream(tensors[0].device).synchronize()
    return [h.numpy() for h in host]


def _device_table(torch, rows, device):
    """A small int64 table on `device`. note: through pinned memory on CUDA: a pageable host->device copy would
    synchronise the stream before the diff's first kernel."""
    t = torch.tensor(rows, dtype=torch.int64)
    return t.pin_memory().to(device, non_blocking=True) if device.type == "cuda" else t


def _check_diff_layout(planes) -> None:
    """The layout diff_packed relies on: planes in buffer order and, where a plane's entries are wider than a
    byte, every plane on 8 bytes (so an 8-byte word holds entries of one plane only: the layout ALIGN gives)."""
    wide = any(width > 1 for *_, width in planes)
    prev = 0
    for name, kind, start, _, width in planes:
        if start < prev:
            raise ValueError(f"{name}: {kind} plane at byte {start}, before the previous plane (at {prev})")
        if wide and start % 8:
            raise ValueError(f"{name}: {kind} plane at byte {start}, not a multiple of 8 (a diff of entries wider "
                             f"than a byte needs 8-byte aligned planes)")
        prev = start


def diff_packed(old, new, tensors) -> dict[str, dict[str, tuple[np.ndarray, np.ndarray]]]:
    """The changed entries between two packed buffers of one layout (`pack_state_dict` with the same manifest),
    found on their device: {name: {"values" | "scales": (entry indices, their new bytes uint8)}} for the planes
    that changed; indices increase (int32 in planes of byte entries, int64 in planes of wider ones: bf16, f32,
    FP8-B128 scales), and a wider entry brings all its bytes, in order.

    note: one pass over both buffers (2 x 7.4 GB read for Qwen3-8B in MXFP8) writes one bool per 8-byte word
    (0.9 GB); each later step reads only what the previous one found changed (about 0.1% of the bytes): the
    mask read as int64, one per 64-byte chunk, gives the changed chunks (a nonzero over 116 M items, not 0.9 G),
    their 8 flags the changed words, the words' bytes the changed bytes. Four syncs: each nonzero's count, then
    one for the pinned copies to the host of an index and a byte per changed byte and each plane's bounds; the
    host slices views. A wide entry (bf16, f32, FP8-B128 scales) lies in one word, so the word marks all of its
    bytes before the last step and they come with the others (no round trip per plane)."""
    import torch  # noqa: PLC0415
    if old.numel() != new.numel() or old.numel() % 8:
        raise ValueError(f"packed buffers of {old.numel()} and {new.numel()} bytes, expected one size, "
                         f"a multiple of 8")
    planes = list(_planes_of(tensors))
    _check_diff_layout(planes)
    if not planes or not old.numel():
        return {}
    dev = new.device
    # note: starts, ends and entry widths of the planes, queued before the compare (no synchronisation)
    table = _device_table(torch, [[p[2] for p in planes], [p[2] + p[3] for p in planes], [p[4] for p in planes]],
                          dev)
    starts, widths = table[0], table[2]
    o64, n64 = old.view(torch.int64), new.view(torch.int64)
    nwords = o64.numel()
    mask = torch.empty(-(-nwords // 8) * 8, dtype=torch.bool, device=dev)  # note: padded to whole chunks
    if mask.numel() > nwords:
        mask[nwords:] = False
    torch.ne(o64, n64, out=mask[:nwords])
    chunks = torch.nonzero(mask.view(torch.int64)).view(-1)  # note: 1 item per 64 bytes (a sync)
    if not chunks.numel():
        return {}
    flags = mask.view(torch.int64).index_select(0, chunks).view(torch.uint8)
    del mask
    f = torch.nonzero(flags).view(-1)  # the changed words of the changed chunks (a sync)
    word = chunks[f >> 3] * 8 + (f & 7)
    new_words = n64.index_select(0, word)
    changed = o64.index_select(0, word).view(torch.uint8) != new_words.view(torch.uint8)
    base = word * 8  # byte offset of each changed word
    wide = sorted({p[4] for p in planes} - {1})
    if wide:  # note: a word lies in one plane (checked above); its changed entries' bytes all marked
        ww = widths[torch.searchsorted(starts, base, right=True) - 1].unsqueeze(1)
        by_word = changed.view(-1, 8)
        marked = by_word
        for w in wide:
            whole = by_word.view(-1, 8 // w, w).any(-1, keepdim=True).expand(-1, 8 // w, w).reshape(-1, 8)
            marked = torch.where(ww == w, whole, marked)
        changed = marked.view(-1)
    b = torch.nonzero(changed).view(-1)  # the bytes to send, increasing (a sync)
    pos = base[b >> 3] + (b & 7)
    # note: padding bytes never change (a changed one would lie outside every plane's bounds)
    plane = torch.searchsorted(starts, pos, right=True) - 1
    rel = pos - starts[plane]
    if wide:
        rel = torch.div(rel, widths[plane], rounding_mode="floor")  # the entry index, repeated per byte
    big = max(p[3] for p in planes) >= 1 << 31
    rel = rel.to(torch.int64 if big else torch.int32)
    bounds = torch.searchsorted(pos, table[:2].reshape(-1))  # [first byte, end) of each plane's bytes
    rel, data, bounds = _to_host(torch, rel, new_words.view(torch.uint8).index_select(0, b), bounds)
    out: dict = {}
    n = len(planes)
    for (name, kind, _, _, width), lo, hi in zip(planes, bounds[:n].tolist(), bounds[n:].tolist()):
        if lo == hi:
            continue
        entries = rel[lo:hi] if width == 1 else rel[lo:hi:width].astype(np.int64)
        out.setdefault(name, {})[kind] = (entries, data[lo:hi])
    return out


def encode_handle(handle: bytes) -> str:
    return base64.b64encode(handle).decode()


__all__ = ["ALIGN", "Packer", "build_manifest", "check_cuda", "diff_packed", "encode_handle", "ipc_handle", "pack_state_dict",
           "release_ipc_counter"]
