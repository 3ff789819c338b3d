"""Trainer-side client of mxq: writes and reads refit deltas (docs/refit-format.md) from numpy canonical planes."""

from .delta import (Delta, PlaneDelta, TensorDelta, canonical_checksum, changed_entries, decode_body, diff_tensor,
                    encode_body, entry_bytes, plane_geometry, read_delta, write_delta)

__all__ = ["Delta", "PlaneDelta", "TensorDelta", "canonical_checksum", "changed_entries", "decode_body",
           "diff_tensor", "encode_body", "entry_bytes", "plane_geometry", "read_delta", "write_delta"]
