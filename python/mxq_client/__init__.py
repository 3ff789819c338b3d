"""Trainer-side client of mxq: `Client(url).update_weights(model.state_dict())` sends sparse refit deltas
(docs/refit-format.md) of weights quantized byte-exactly as mxq quantizes them (spec formats.md).
Needs numpy, zstandard and xxhash; torch is optional (torch tensors are quantized on their own device)."""

from .client import Client, MxqError
from .delta import (Delta, PlaneDelta, TensorDelta, canonical_checksum, changed_entries, decode_body, diff_tensor,
                    encode_body, entry_bytes, plane_geometry, read_delta, write_delta)
from .ipc import build_manifest
from .names import is_linear, map_state_dict
from .quantize import plain_bytes, quantize_planes, quantize_tensor

__version__ = "0.1.0"

__all__ = ["Client", "Delta", "MxqError", "PlaneDelta", "TensorDelta", "build_manifest", "canonical_checksum",
           "changed_entries",
           "decode_body", "diff_tensor", "encode_body", "entry_bytes", "is_linear", "map_state_dict",
           "plain_bytes", "plane_geometry", "quantize_planes", "quantize_tensor", "read_delta", "write_delta"]
