// Layout discovery: run a kernel's own prepare routine on index probes and record the byte permutation it
// applies, or refuse it by name.
//
// Probe r fills canonical byte i of each plane with digit r of i in base 255, written as 1..255, so no probe
// byte is ever zero: a native byte that is zero in every run is padding, one that is zero in only some runs
// was written by something other than a copy. Decoding the digits gives, per native byte, the canonical byte
// it holds; that map must be a bijection onto the canonical plane (pads aside), must fit
// row_off[r] + col_off[c], and must reproduce the prepare's output on check planes holding every byte
// value, zero included (which catches prepares that transform values the probes never contain).
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <string_view>
#include <vector>

#include "base/error.h"
#include "format/formats.h"
#include "layout/layout.h"

namespace mxq {

struct HostPlanes {
  std::vector<uint8_t> values;
  std::vector<uint8_t> scales;
};

// canonical planes → native planes in host memory. It may size the native planes as it likes (padding) but
// must size them the same for every input. A CUDA prepare is wrapped by its caller with copies.
using PrepareFn = std::function<Result<HostPlanes>(const HostPlanes& canonical)>;

// Learns `kernel`'s layout for `tensor` (format, shape [N, K] or [E, N, K]). Refusals name the tensor, the
// kernel, the plane and the first offending byte: prepare errors, a native size that changes between
// runs, lost / duplicated / out-of-range bytes, bytes moved at sub-byte (4-bit) granularity, permutations
// that are not separable, and value changes.
Result<Layout> probe_layout(std::string_view tensor, std::string_view kernel, Format f,
                            std::span<const int64_t> shape, const PrepareFn& prepare);

}  // namespace mxq
